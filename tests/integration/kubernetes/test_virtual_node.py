"""The Slurm cluster seen from Kubernetes (bridge.operator.virtual_node, standin_pods, kubelet_api), on the real
control plane and real Slurm: a Node stands for the cluster, a Slurm-run TrainJob's nodes are pods with the JobSet
labels and the job's phases, and `kubectl logs` of one (the API server calling the operator's kubelet API with
its kubelet client certificate) is its node's lines of the Slurm job's output, followed as they are written.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
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
    created, pods, job_id = running_on_two_nodes(operator, ns, "shown", "slurm", "SLURM_NODEID", go)
    assert [p.metadata.name for p in pods] == ["shown-node-0-0", "shown-node-0-1"]
    for index, pod in enumerate(pods):
        assert pod.spec.node_name == NODE
        assert pod.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
        assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == str(index)
        assert pod.metadata.annotations["operator.hpcbridge.io/job-id"] == job_id
        assert pod.metadata.owner_references[0].uid == created["metadata"]["uid"]
    follows_its_nodes_lines(operator, ns, "shown-node-0-0", 0, go)
    operator.until(ns, "shown", is_true("Complete"))
    done = wait_for("Succeeded pods", lambda: (lambda p: p if all(x.status.phase == "Succeeded" for x in p) else
                                               None)(pods_of(operator, ns, "shown")))
    assert done[0].status.container_statuses[0].state.terminated.exit_code == 0
    for index in (0, 1):
        text = operator.core.read_namespaced_pod_log(f"shown-node-0-{index}", ns, container="node")
        # the launch's node tag is the pod's, not the line's: not shown
        assert [line for line in text.splitlines() if "line of" in line] == \
            [f"first line of {index}", f"second line of {index}"], text
        tail = operator.core.read_namespaced_pod_log(f"shown-node-0-{index}", ns, container="node", tail_lines=1)
        assert tail == f"second line of {index}\n"
    stamped = operator.core.read_namespaced_pod_log("shown-node-0-1", ns, container="node", timestamps=True)
    assert [line.split(" ", 1)[1] for line in stamped.splitlines()] == ["first line of 1", "second line of 1"]
    assert all(line[:4].isdigit() and "T" in line.split(" ", 1)[0] for line in stamped.splitlines())
    recent = operator.core.read_namespaced_pod_log("shown-node-0-1", ns, container="node", since_seconds=3600)
    assert recent == "first line of 1\nsecond line of 1\n"
    operator.custom.delete_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", "shown")
    wait_for("its pods deleted with it", lambda: not pods_of(operator, ns, "shown"))


def test_a_failed_slurm_job_is_a_failed_pod_with_its_exit_code(operator) -> None:  # noqa: F811
    fails_with_its_exit_code(operator, operator.namespace(), "fails", "slurm")


def running_on_two_nodes(op, ns: str, name: str, cluster: str, node_variable: str, go: Path) -> tuple:
    """A two-node TrainJob *name* on *cluster* once both its pods are Running: the TrainJob, its pods and its
    job id. Each node writes a first line, then, only after the test has read it through ``logs -f`` (*go*),
    a second (streaming, not timing), each with its node's index (the backend's *node_variable*)."""
    script = (f"echo first line of ${node_variable}; while [ ! -e {go} ]; do sleep 0.2; done; "
              f"echo second line of ${node_variable}")
    created = op.apply(ns, name, cluster, ["sh", "-c", script], nodes=2)
    pods = wait_for(lambda: f"two Running pods: {op.logs()}", lambda: (lambda p: p if len(p) == 2 and all(
        x.status.phase == "Running" for x in p) else None)(pods_of(op, ns, name)))
    return created, pods, op.get(ns, name)["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]


def follows_its_nodes_lines(op, ns: str, pod: str, node: int, go: Path) -> None:
    """``kubectl logs -f`` of *pod*, node *node*'s: its first line, then, once the test lets the job go on (*go*),
    its second, as they are written, and no line of the other node's."""
    stream = op.core.read_namespaced_pod_log(pod, ns, container="node", follow=True, _preload_content=False)
    seen = []
    for line in stream.stream(amt=None):
        seen.append(line.decode())
        if f"first line of {node}" in "".join(seen) and not go.exists():
            go.write_text("")
    assert go.exists() and f"second line of {node}" in "".join(seen).split(f"first line of {node}", 1)[1], seen
    assert f"of {1 - node}" not in "".join(seen), seen  # the other node's lines are its own pod's


def fails_with_its_exit_code(op, ns: str, name: str, cluster: str) -> None:
    """A TrainJob on *cluster* whose command exits 7: a Failed pod with exit code 7 and the job's output."""
    op.apply(ns, name, cluster, ["sh", "-c", "echo about to fail; exit 7"])
    op.until(ns, name, is_true("Failed"))
    (pod,) = wait_for("a Failed pod", lambda: (lambda p: p if p and p[0].status.phase == "Failed" else None)(
        pods_of(op, ns, name)))
    assert pod.status.container_statuses[0].state.terminated.exit_code == 7
    assert "about to fail" in op.core.read_namespaced_pod_log(f"{name}-node-0-0", ns, container="node")


def test_a_flux_trainjobs_pods_show_its_phases_and_kubectl_logs_follows_its_output(operator, flux_uri,  # noqa: F811
                                                                                    tmp_path) -> None:
    """The same on Flux (where flux-core is on PATH): the cluster's Node, a two-node TrainJob's pods with its
    phases, each pod's lines of the job's output (Flux's output eventlog, read through the operator's kubelet
    API) followed as they are written, and a failed job's exit code on its pod."""
    from tests.integration.kubernetes.test_operator import flux_bridge_cluster

    flux_bridge_cluster(operator, flux_uri)
    node = wait_for("the Flux cluster's node", lambda: next((n for n in operator.core.list_node().items
                                                            if n.metadata.name == "hpcbridge-flux"), None))
    assert node.metadata.labels["hpcbridge.io/cluster-type"] == "flux"
    ns = operator.namespace()
    go = tmp_path / "go"
    tmp_path.chmod(0o777)
    created, pods, job_id = running_on_two_nodes(operator, ns, "on-flux-shown", "flux", "FLUX_TASK_RANK", go)
    for pod in pods:
        assert pod.spec.node_name == "hpcbridge-flux"
        assert pod.metadata.annotations["operator.hpcbridge.io/job-id"] == job_id
        assert pod.metadata.owner_references[0].uid == created["metadata"]["uid"]
    follows_its_nodes_lines(operator, ns, "on-flux-shown-node-0-1", 1, go)
    operator.until(ns, "on-flux-shown", is_true("Complete"))
    wait_for("Succeeded pods", lambda: (lambda p: p if all(x.status.phase == "Succeeded" for x in p) else None)(
        pods_of(operator, ns, "on-flux-shown")))
    for index in (0, 1):
        text = operator.core.read_namespaced_pod_log(f"on-flux-shown-node-0-{index}", ns, container="node")
        assert [line for line in text.splitlines() if "line of" in line] == \
            [f"first line of {index}", f"second line of {index}"], text
    fails_with_its_exit_code(operator, ns, "on-flux-fails", "flux")


def _get(url: str, cert: tuple[Path, Path] | None, token: str | None = None) -> int:
    return _read(url, cert, token)[0]


def _read(url: str, cert: tuple[Path, Path] | None, token: str | None = None) -> tuple[int, bytes]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the client's side is under test
    if cert:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with opener.open(request, timeout=30) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _token(op, namespace: str, name: str) -> str:
    """A bound token of a new ServiceAccount *name*, as a pod or a user's kubeconfig carries one."""
    op.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    return op.core.create_namespaced_service_account_token(name, namespace, {"spec": {"expirationSeconds": 600}}
                                                           ).status.token


def test_the_kubelet_port_refuses_the_unauthenticated_and_the_unauthorized(operator, tmp_path) -> None:  # noqa: F811
    from tests.harness.kube import sign_client_cert

    ns = operator.namespace()
    operator.apply(ns, "guarded", "slurm", ["sh", "-c", "echo guarded"])
    operator.until(ns, "guarded", is_true("Complete"))
    wait_for("its Succeeded pod", lambda: [p for p in pods_of(operator, ns, "guarded") if p.status.phase == "Succeeded"])
    kube = operator.cluster.kube
    base = f"https://{kube.address}:{operator.kubelet_port}"
    url = f"{base}/containerLogs/{ns}/guarded-node-0-0/node"
    assert _get(f"{base}/healthz", None) == 200
    assert _get(url, None) == 401
    nobody = sign_client_cert(kube.pki, tmp_path, "nobody", "nobody", "some-team")
    assert _get(url, nobody) == 403  # a SubjectAccessReview for nodes/proxy says no
    assert _get(url, (kube.pki["admin"], kube.pki["admin_key"])) == 200  # the API server's kubelet client
    # bearer tokens, as a kubelet with the token webhook takes them: a TokenReview says who, a
    # SubjectAccessReview whether they may
    assert _get(url, None, "not-a-token") == 401
    reader, stranger = _token(operator, ns, "node-reader"), _token(operator, ns, "stranger")
    with node_reader(operator, ns):
        _tokens_and_pods(base, url, ns, reader, stranger, nobody)


def _tokens_and_pods(base: str, url: str, ns: str, reader: str, stranger: str, nobody: tuple[Path, Path]) -> None:
    assert _get(url, None, stranger) == 403
    # RBAC's authorizer reads the new binding from its informer: asked until it has
    status, text = wait_for("the reader's binding in force", lambda: (lambda got: got if got[0] == 200 else None)(
        _read(url, None, reader)))
    assert b"guarded\n" in text
    # the pods the node runs, as a kubelet's /pods lists them: refused alike
    assert _get(f"{base}/pods", None) == 401
    assert _get(f"{base}/pods", None, "not-a-token") == 401
    assert _get(f"{base}/pods", nobody) == 403 and _get(f"{base}/pods", None, stranger) == 403
    status, body = _read(f"{base}/pods", None, reader)
    assert status == 200
    listed = json.loads(body)
    assert listed["kind"] == "PodList"
    (pod,) = [item for item in listed["items"] if item["metadata"]["namespace"] == ns]
    assert pod["metadata"]["name"] == "guarded-node-0-0" and pod["spec"]["nodeName"] == NODE
    assert pod["status"]["phase"] == "Succeeded"
    assert all(item["spec"]["nodeName"].startswith("hpcbridge-") for item in listed["items"])


@contextlib.contextmanager
def node_reader(op, namespace: str) -> Iterator[None]:
    """``get nodes/proxy`` (what a kubelet's API asks of a reader of logs) for the ServiceAccount node-reader of
    *namespace*, while in the block."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(op.api)
    name = f"node-reader-{namespace}"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": name}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "node-reader", "namespace": namespace}]})
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
