"""The virtual node, the stand-in pods and the kubelet API's log options, as rendered and shaped (no server):
tests/integration/kubernetes/test_virtual_node.py runs them against the real API server and Slurm."""

from __future__ import annotations

import datetime

import pytest

from bridge.adapters.base import JobRef, JobState, JobStatus
from bridge.api.cluster import BridgeCluster
from bridge.operator.kubelet_api import BadQuery, Caller, LogQuery, shape
from bridge.operator.standin_pods import pod_name, render_pod, render_status
from bridge.operator.sync import Tracked
from bridge.operator.virtual_node import Endpoint, render_lease, render_node, wants_node
from bridge.operator.virtual_node import render_status as node_status

NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def cluster(kind: str, annotations: dict | None = None) -> BridgeCluster:
    spec: dict = {"type": kind}
    if kind == "slurm":
        spec["slurm"] = {"transport": "local"}
    return BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                         "metadata": {"name": "hpc", "annotations": annotations or {}}, "spec": spec})


def test_a_node_stands_for_a_cluster_whose_backend_runs_no_pods_unless_its_admin_opts_out() -> None:
    assert wants_node(cluster("slurm")) and wants_node(cluster("flux"))
    assert not wants_node(cluster("kubernetes"))
    assert not wants_node(cluster("slurm", {"hpcbridge.io/virtual-node": "false"}))
    node = render_node(cluster("slurm"), Endpoint("10.0.0.5", 10250))
    assert node["metadata"]["name"] == "hpcbridge-hpc"
    assert node["metadata"]["labels"]["hpcbridge.io/cluster"] == "hpc"
    assert node["metadata"]["labels"]["hpcbridge.io/cluster-type"] == "slurm"
    assert node["spec"]["taints"] == [{"key": "hpcbridge.io/cluster", "value": "hpc", "effect": "NoSchedule"}]
    status = node_status(cluster("slurm"), Endpoint("10.0.0.5", 10251), NOW)["status"]
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10251}}
    assert {"type": "InternalIP", "address": "10.0.0.5"} in status["addresses"]
    assert [c["status"] for c in status["conditions"] if c["type"] == "Ready"] == ["True"]
    lease = render_lease("hpcbridge-hpc", "u-1", NOW)
    assert lease["spec"]["holderIdentity"] == "hpcbridge-hpc" and lease["metadata"]["namespace"] == "kube-node-lease"


def _tracked(nodes: int = 2) -> Tracked:
    item = Tracked("ns", "train", "uid-1", JobRef("hpc", "slurm", "42", "uid-1", "train"), [])
    item.nodes = nodes
    return item


def test_a_standin_pod_has_the_name_and_labels_of_the_jobset_pod_it_stands_for() -> None:
    pod = render_pod(_tracked(), 1, "hpcbridge-hpc", "hpc", "slurm")
    meta = pod["metadata"]
    assert meta["name"] == pod_name("train", 1) == "train-node-0-1"
    assert meta["labels"]["jobset.sigs.k8s.io/jobset-name"] == "train"
    assert meta["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert meta["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert meta["labels"]["trainer.kubeflow.org/trainjob-name"] == "train"
    assert meta["annotations"]["operator.hpcbridge.io/job-id"] == "42"
    assert meta["ownerReferences"][0]["uid"] == "uid-1" and meta["ownerReferences"][0]["kind"] == "TrainJob"
    assert pod["spec"]["nodeName"] == "hpcbridge-hpc"
    assert [c["name"] for c in pod["spec"]["containers"]] == ["node"]


@pytest.mark.parametrize(("state", "code", "phase", "container"), [
    (JobState.PENDING, None, "Pending", "waiting"),
    (JobState.RUNNING, None, "Running", "running"),
    (JobState.SUCCEEDED, 0, "Succeeded", "terminated"),
    (JobState.FAILED, 7, "Failed", "terminated"),
    (JobState.TIMEOUT, None, "Failed", "terminated"),
])
def test_a_standin_pods_phase_and_container_state_mirror_the_backend_job(state, code, phase, container) -> None:
    status = JobStatus(JobRef("hpc", "slurm", "42", "uid-1", "train"), state, exit_code=code)
    body = render_status(status, "slurm", NOW)["status"]
    assert body["phase"] == phase
    (shown,) = body["containerStatuses"]
    assert list(shown["state"]) == [container]
    if container == "terminated":
        assert shown["state"]["terminated"]["exitCode"] == (code if code is not None else 1)


def _query(**values: str) -> LogQuery:
    return LogQuery.parse({key: [value] for key, value in values.items()}, NOW)


def test_log_options_parse_as_the_kubelet_reads_them() -> None:
    assert _query() == LogQuery()
    parsed = _query(follow="true", tailLines="3", limitBytes="10", timestamps="1", sinceSeconds="60")
    assert parsed.follow and parsed.timestamps and parsed.tail_lines == 3 and parsed.limit_bytes == 10
    assert parsed.since == NOW - datetime.timedelta(seconds=60)
    assert _query(sinceTime="2026-01-02T03:00:00Z").since == datetime.datetime(2026, 1, 2, 3, tzinfo=datetime.UTC)
    for bad in ({"tailLines": "-1"}, {"limitBytes": "0"}, {"follow": "yes"}, {"sinceSeconds": "x"},
                {"sinceSeconds": "5", "sinceTime": "2026-01-02T03:00:00Z"}):
        with pytest.raises(BadQuery):
            _query(**bad)


def test_tail_applies_to_what_was_written_before_the_request_and_lines_after_it_stream_whole() -> None:
    clock = iter([NOW, NOW + datetime.timedelta(seconds=1), NOW + datetime.timedelta(seconds=2)] * 3)

    def shaped(query: LogQuery, chunks: list[str]) -> bytes:
        return b"".join(shape(chunks, query, lambda: next(clock)))

    assert shaped(LogQuery(), ["a\nb\n", "c\nd", "e\n"]) == b"a\nb\nc\nde\n"
    assert shaped(LogQuery(tail_lines=1), ["a\nb\nc\n", "d\n"]) == b"c\nd\n"
    assert shaped(LogQuery(tail_lines=0), ["a\nb\n", "c\n"]) == b"c\n"
    assert shaped(LogQuery(limit_bytes=3), ["abcdef\n", "g\n"]) == b"abc"


def test_timestamps_stamp_each_line_with_its_read_time_and_since_keeps_what_was_read_from_then() -> None:
    times = iter([NOW, NOW + datetime.timedelta(seconds=5), NOW + datetime.timedelta(seconds=5)])
    out = b"".join(shape(["a\n", "b\n"], LogQuery(timestamps=True), lambda: next(times))).decode().splitlines()
    assert out == ["2026-01-02T03:04:05.000000Z a", "2026-01-02T03:04:10.000000Z b"]
    times = iter([NOW, NOW + datetime.timedelta(seconds=5), NOW + datetime.timedelta(seconds=5)])
    later = LogQuery(since=NOW + datetime.timedelta(seconds=1))
    assert b"".join(shape(["a\n", "b\n"], later, lambda: next(times))) == b"b\n"


def test_the_caller_is_the_client_certificates_common_name_with_its_organizations_as_groups() -> None:
    cert = {"subject": ((("commonName", "kube-apiserver-kubelet-client"),), (("organizationName", "system:masters"),))}
    assert Caller.of(cert) == Caller("kube-apiserver-kubelet-client", ("system:masters",))
    assert Caller.of({}) is None and Caller.of(None) is None


class FakeCore:
    """The pods API as the stand-in pods use it, pods kept as the server would keep them; each call recorded."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict] = {}
        self.calls: list[str] = []

    def _missing(self, namespace: str, name: str) -> dict:
        from kubernetes.client.exceptions import ApiException

        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiException(status=404, reason="Not Found")
        return pod

    def create_namespaced_pod(self, namespace, body):
        from kubernetes.client.exceptions import ApiException

        self.calls.append("create")
        if (namespace, body["metadata"]["name"]) in self.pods:
            raise ApiException(status=409, reason="Conflict")
        self.pods[(namespace, body["metadata"]["name"])] = {**body, "status": {"phase": "Pending"}}

    def patch_namespaced_pod(self, name, namespace, body):
        self.calls.append("annotate")
        self._missing(namespace, name)["metadata"]["annotations"].update(body["metadata"]["annotations"])

    def patch_namespaced_pod_status(self, name, namespace, body):
        self.calls.append("status")
        self._missing(namespace, name)["status"] = body["status"]

    def read_namespaced_pod(self, name, namespace, _preload_content):
        import json
        from types import SimpleNamespace

        self.calls.append("read")
        assert not _preload_content  # its fields are read, not a model of it
        return SimpleNamespace(data=json.dumps(self._missing(namespace, name)).encode())


def _standins(core: FakeCore):
    from types import SimpleNamespace

    from bridge.operator.standin_pods import StandinPods

    pods = StandinPods(SimpleNamespace(api_client=None), lambda cluster: "hpcbridge-hpc", lambda cluster: "slurm")
    pods.core = core
    return pods


def test_standin_pods_already_as_their_job_is_are_not_written_again_after_a_restart() -> None:
    """A restart mirrors every followed TrainJob anew: a re-attached job's pods that the operator before wrote,
    still showing what the job is, cost a read each and no write; a changed job, a pod deleted meanwhile or one
    the node controller marked not Ready are written. A job just sent has no pods to read."""
    core, item = FakeCore(), _tracked(nodes=2)
    running = JobStatus(item.ref, JobState.RUNNING, nodes=["n1", "n2"])
    first = _standins(core)
    first.mirror(item, running)
    assert core.calls == ["create", "annotate", "status"] * 2
    assert core.pods[("ns", "train-node-0-1")]["status"]["phase"] == "Running"
    core.calls.clear()
    first.mirror(item, running)
    assert core.calls == []  # nothing changed: nothing written
    # a restart: the job is found again (attached) and its pods read, as written
    item.attached = True
    restarted = _standins(core)
    restarted.mirror(item, running)
    assert core.calls == ["read", "read"]
    assert sorted(restarted.written()) == [("ns", "train-node-0-0", "hpcbridge-hpc"),
                                          ("ns", "train-node-0-1", "hpcbridge-hpc")]
    # the job ended: each pod's status only, nothing read again
    core.calls.clear()
    done = JobStatus(item.ref, JobState.FAILED, nodes=["n1", "n2"], exit_code=3)
    restarted.mirror(item, done)
    assert core.calls == ["status", "status"]
    assert core.pods[("ns", "train-node-0-0")]["status"]["containerStatuses"][0]["state"]["terminated"][
        "exitCode"] == 3
    # a pod deleted behind the operator's back is made again with its next change
    del core.pods[("ns", "train-node-0-1")]
    core.calls.clear()
    restarted.mirror(item, JobStatus(item.ref, JobState.FAILED, nodes=["n1", "n2"], exit_code=4))
    assert core.calls == ["status", "status", "create", "annotate", "status"]
    assert core.pods[("ns", "train-node-0-1")]["status"]["phase"] == "Failed"
    # the node controller marked a running pod not Ready while no operator ran: written again on restart
    other = Tracked("ns", "other", "uid-2", JobRef("hpc", "slurm", "43", "uid-2", "other"), [])
    _standins(core).mirror(other, JobStatus(other.ref, JobState.RUNNING))
    for condition in core.pods[("ns", "other-node-0-0")]["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "False"
    core.calls.clear()
    other.attached = True
    _standins(core).mirror(other, JobStatus(other.ref, JobState.RUNNING))
    assert core.calls == ["read", "status"]
    # re-attached, its pods never written (the operator before stopped first): read, then made
    missing = Tracked("ns", "missing", "uid-3", JobRef("hpc", "slurm", "44", "uid-3", "missing"), [], attached=True)
    core.calls.clear()
    _standins(core).mirror(missing, JobStatus(missing.ref, JobState.PENDING))
    assert core.calls == ["read", "create", "status"]
