"""The Slurm cluster seen from Kubernetes (bridge.operator.virtual_node, standin_pods, kubelet_api), on the real
control plane and real Slurm: a Node stands for the cluster, a Slurm-run TrainJob's nodes are pods with the JobSet
labels and the job's phases, and `kubectl logs` of one (the API server calling the operator's kubelet API with
its kubelet client certificate) is the Slurm job's output, followed as it is written.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.kubernetes.test_operator import condition, is_true, operator  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

NODE = "hpcbridge-slurm"


def wait_for(what: str, check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, what if isinstance(what, str) else what()
        time.sleep(0.2)


def pods_of(op, ns: str, name: str) -> list:
    return sorted(op.core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items,
                  key=lambda pod: pod.metadata.name)


def test_the_slurm_cluster_is_a_ready_tainted_node_and_the_kubernetes_cluster_is_none(operator) -> None:  # noqa: F811
    from kubernetes import client

    node = wait_for("the virtual node", lambda: next((n for n in operator.core.list_node().items
                                                      if n.metadata.name == NODE), None))
    assert node.metadata.labels["hpcbridge.io/cluster"] == "slurm"
    assert node.metadata.labels["hpcbridge.io/cluster-type"] == "slurm"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints or [] if t.key.startswith("hpcbridge")] == \
        [("hpcbridge.io/cluster", "slurm", "NoSchedule")]
    node = wait_for("its kubelet port", lambda: (lambda n: n if n.status.daemon_endpoints.kubelet_endpoint.port ==
                                                 operator.kubelet_port else None)(operator.core.read_node(NODE)))
    assert [c.status for c in node.status.conditions if c.type == "Ready"] == ["True"]
    leases = client.CoordinationV1Api(operator.api)
    # the Lease is written right after the node's status, in the same round: wait for it as for the port
    lease = wait_for("its lease", lambda: next((item for item in leases.list_namespaced_lease(
        "kube-node-lease").items if item.metadata.name == NODE), None))
    assert lease.spec.holder_identity == NODE
    names = {n.metadata.name for n in operator.core.list_node().items}
    assert "hpcbridge-pods" not in names  # its backend runs pods of its own


def test_a_slurm_trainjobs_pods_show_its_phases_and_kubectl_logs_follows_its_output(operator, tmp_path) -> None:  # noqa: F811
    ns = operator.namespace()
    go = tmp_path / "go"
    tmp_path.chmod(0o777)
    # the second line comes only after the test has read the first through `logs -f`: streaming, not timing
    script = f"echo first line; while [ ! -e {go} ]; do sleep 0.2; done; echo second line"
    created = operator.apply(ns, "shown", "slurm", ["sh", "-c", script], nodes=2)
    pods = wait_for(lambda: f"two Running pods: {operator.logs()}", lambda: (lambda p: p if len(p) == 2 and all(
        x.status.phase == "Running" for x in p) else None)(pods_of(operator, ns, "shown")))
    assert [p.metadata.name for p in pods] == ["shown-node-0-0", "shown-node-0-1"]
    job_id = operator.get(ns, "shown")["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    for index, pod in enumerate(pods):
        assert pod.spec.node_name == NODE
        assert pod.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
        assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == str(index)
        assert pod.metadata.annotations["operator.hpcbridge.io/job-id"] == job_id
        assert pod.metadata.owner_references[0].uid == created["metadata"]["uid"]
    stream = operator.core.read_namespaced_pod_log("shown-node-0-0", ns, container="node", follow=True,
                                                   _preload_content=False)
    seen = []
    for line in stream.stream(amt=None):
        seen.append(line.decode())
        if "first line" in "".join(seen) and not go.exists():
            go.write_text("")
    assert go.exists() and "second line" in "".join(seen).split("first line", 1)[1], seen
    operator.until(ns, "shown", is_true("Complete"))
    done = wait_for("Succeeded pods", lambda: (lambda p: p if all(x.status.phase == "Succeeded" for x in p) else
                                               None)(pods_of(operator, ns, "shown")))
    assert done[0].status.container_statuses[0].state.terminated.exit_code == 0
    text = operator.core.read_namespaced_pod_log("shown-node-0-0", ns, container="node")
    assert "first line" in text and "second line" in text
    tail = operator.core.read_namespaced_pod_log("shown-node-0-0", ns, container="node", tail_lines=1)
    assert tail.count("\n") == 1 and "second line" in tail
    stamped = operator.core.read_namespaced_pod_log("shown-node-0-0", ns, container="node", timestamps=True)
    assert all(line[:4].isdigit() and "T" in line.split(" ", 1)[0] for line in stamped.splitlines())
    operator.custom.delete_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", "shown")
    wait_for("its pods deleted with it", lambda: not pods_of(operator, ns, "shown"))


def test_a_failed_slurm_job_is_a_failed_pod_with_its_exit_code(operator) -> None:  # noqa: F811
    ns = operator.namespace()
    operator.apply(ns, "fails", "slurm", ["sh", "-c", "echo about to fail; exit 7"])
    operator.until(ns, "fails", is_true("Failed"))
    (pod,) = wait_for("a Failed pod", lambda: (lambda p: p if p and p[0].status.phase == "Failed" else None)(
        pods_of(operator, ns, "fails")))
    assert pod.status.container_statuses[0].state.terminated.exit_code == 7
    assert "about to fail" in operator.core.read_namespaced_pod_log("fails-node-0-0", ns, container="node")


def _get(url: str, cert: tuple[Path, Path] | None) -> int:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the client's side is under test
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_kubelet_port_refuses_the_unauthenticated_and_the_unauthorized(operator, tmp_path) -> None:  # noqa: F811
    from tests.harness.kube import sign_client_cert

    ns = operator.namespace()
    operator.apply(ns, "guarded", "slurm", ["sh", "-c", "echo guarded"])
    operator.until(ns, "guarded", is_true("Complete"))
    wait_for("its pod", lambda: pods_of(operator, ns, "guarded"))
    kube = operator.cluster.kube
    base = f"https://{kube.address}:{operator.kubelet_port}"
    url = f"{base}/containerLogs/{ns}/guarded-node-0-0/node"
    assert _get(f"{base}/healthz", None) == 200
    assert _get(url, None) == 401
    nobody = sign_client_cert(kube.pki, tmp_path, "nobody", "nobody", "some-team")
    assert _get(url, nobody) == 403  # a SubjectAccessReview for nodes/proxy says no
    assert _get(url, (kube.pki["admin"], kube.pki["admin_key"])) == 200  # the API server's kubelet client
