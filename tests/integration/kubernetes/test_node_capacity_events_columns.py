"""What a Kubernetes user sees of a Slurm-run TrainJob besides its pods, on the real control plane and real Slurm:
the cluster's virtual node with the cluster's size (asked through the adapter contract), the Events of each
backend transition (`kubectl describe trainjob`), the `kubectl get trainjobs` columns (the API's Table, which
kubectl prints), and a BridgeCluster that opts out of its node and pods.
"""

from __future__ import annotations

import sys

import pytest

from tests.integration.kubernetes.test_operator import GROUP, VERSION, is_true, operator  # noqa: F401 - the fixture
from tests.integration.kubernetes.test_virtual_node import pods_of, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def test_the_virtual_node_has_the_slurm_clusters_nodes_cpus_memory_and_gpus(operator) -> None:  # noqa: F811
    slurm = operator.slurm
    node = wait_for(lambda: f"the node's size: {operator.logs()}", lambda: (lambda n: n if n and (
        n.status.capacity or {}).get("hpcbridge.io/nodes") else None)(
        next((n for n in operator.core.list_node().items if n.metadata.name == "hpcbridge-slurm"), None)))
    capacity = node.status.capacity
    # what slurm.conf gives the test cluster's nodes, read back by sinfo through the Slurm adapter
    assert capacity["hpcbridge.io/nodes"] == str(slurm.nodes)
    assert capacity["cpu"] == str(slurm.nodes * slurm.cpus)
    assert capacity["memory"] == f"{slurm.nodes * slurm.memory_mb}Mi"
    assert capacity["nvidia.com/gpu"] == str(slurm.nodes * slurm.gpus)
    assert int(node.status.allocatable["hpcbridge.io/nodes"]) <= slurm.nodes
    note = node.metadata.annotations["operator.hpcbridge.io/capacity"]
    assert note.startswith(f"{slurm.nodes} nodes, {slurm.nodes * slurm.cpus} CPUs") and "(sinfo:" in note, note


def _table(operator, namespace: str) -> dict[str, dict[str, str]]:  # noqa: F811
    """`kubectl get trainjobs -n NAMESPACE` as the API serves it to kubectl: name → column → cell."""
    import json

    answer = operator.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs",
                                                           _headers={"Accept": TABLE}, _preload_content=False)
    table = json.loads(answer.data)
    assert table["kind"] == "Table", table
    names = [column["name"] for column in table["columnDefinitions"]]
    return {row["cells"][0]: dict(zip(names, row["cells"], strict=True)) for row in table["rows"]}


def test_events_and_columns_follow_a_job_from_queued_to_finished(operator, tmp_path) -> None:  # noqa: F811
    ns = operator.namespace()
    slurm = operator.slurm
    go = tmp_path / "go"
    tmp_path.chmod(0o777)
    operator.apply(ns, "holder", "slurm", ["sleep", "600"], annotations={"hpcbridge.io/exclusive": "true"})
    operator.until(ns, "holder", is_true("Running"))
    # every node of the cluster, one of which the holder has: it waits in Slurm's queue, for a reason Slurm gives
    secret = "do-not-show-7f3c9a"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": "waits", "annotations": {"hpcbridge.io/cluster": "slurm"}},
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain-slurm"},
                     "trainer": {"numNodes": slurm.nodes, "env": [{"name": "API_TOKEN", "value": secret}],
                                 "command": ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.2; done"]}}}
    operator.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", body)
    queued = wait_for(lambda: f"a Queued Event: {operator.events(ns, 'waits')} {operator.logs()}", lambda: [
        message for _, reason, message in operator.events(ns, "waits") if reason == "Queued"])
    job_id = operator.get(ns, "waits")["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    assert queued[0].startswith(f"slurm job {job_id} on cluster slurm is queued: ") and \
        queued[0].split("is queued: ", 1)[1], queued
    row = _table(operator, ns)["waits"]
    assert (row["Cluster"], row["Job ID"], row["State"]) == ("slurm", job_id, "Submitted"), row
    operator.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "holder")
    operator.until(ns, "waits", is_true("Running"))
    running = wait_for("a Running Event", lambda: [message for _, reason, message in operator.events(ns, "waits")
                                                   if reason == "Running"])
    hosts = running[0].split(" is running on ", 1)[1]
    assert running[0] == f"slurm job {job_id} on cluster slurm is running on {hosts}" and hosts.startswith("node")
    row = _table(operator, ns)["waits"]
    assert (row["Cluster"], row["Job ID"], row["State"]) == ("slurm", job_id, "Running"), row
    go.write_text("")
    operator.until(ns, "waits", is_true("Complete"))
    events = wait_for("the Succeeded Event", lambda: (lambda e: e if any(r == "Succeeded" for _, r, _ in e) else
                                                      None)(operator.events(ns, "waits")))
    shown = [(kind, reason, message) for kind, reason, message in events]
    assert ("Normal", "Submitted", f"submitted as slurm job {job_id} on cluster slurm") in shown, shown
    assert ("Normal", "Succeeded", f"slurm job {job_id} on cluster slurm succeeded with exit code 0") in shown
    reasons = [reason for _, reason, _ in shown]  # Events are stamped to the second: their order is not kept
    assert [reasons.count(reason) for reason in ("Submitted", "Running", "Succeeded")] == [1, 1, 1], shown
    assert not any(secret in message for _, _, message in shown), shown  # the job's environment stays out
    assert _table(operator, ns)["waits"]["State"] == "Complete"


def test_a_cluster_that_opts_out_has_no_node_and_its_trainjobs_no_pods(operator) -> None:  # noqa: F811
    slurm = operator.slurm
    operator.define_clusters({"slurm-quiet": {
        "type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm.conf)},
        "tenants": [{"name": "tests", "namespaceSelector": {"matchLabels": {"hpcbridge.test/operator-tests": "yes"}}}],
        "defaults": {"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]}}})
    operator.custom.patch_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", "slurm-quiet", {
        "metadata": {"annotations": {"hpcbridge.io/virtual-node": "false"}}})
    ns = operator.namespace()
    operator.apply(ns, "quiet", "slurm-quiet", ["sh", "-c", "echo quiet"])
    done = operator.until(ns, "quiet", is_true("Complete"))
    assert done["metadata"]["annotations"]["operator.hpcbridge.io/job-cluster"] == "slurm-quiet"
    # the node of the cluster that did not opt out is there, and its pods are written on each change of state:
    # by the time the job is Complete, a pod of this one would have been written too
    names = {n.metadata.name for n in operator.core.list_node().items}
    assert "hpcbridge-slurm" in names and "hpcbridge-slurm-quiet" not in names
    assert pods_of(operator, ns, "quiet") == []
    operator.custom.delete_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", "slurm-quiet")
