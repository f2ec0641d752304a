"""The operator as a platform team runs it: its image (tests/harness/operator_image.py, the recipe users run)
loaded into the real kubelet nodes' containerd, manifests/operator applied (CRDs, namespace, ServiceAccount,
RBAC, Deployment), the pod started on a real node with in-cluster configuration (its ServiceAccount token, the
API server through the `kubernetes` Service that kube-proxy serves), and a TrainJob applied with the Kubernetes
client run on the Slurm cluster, which the pod reaches over SSH through the pod network with the key and
known_hosts from a Secret.

Services on the nodes are checked on their own first: a pod on one node reaches a pod on the other through a
Service's name, and the API server through the `kubernetes` Service with its ServiceAccount token.
"""

from __future__ import annotations

import copy
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.integration.kubernetes.test_operator import (
    GROUP,
    TEST_NAMESPACE_LABEL,
    TEST_TENANTS,
    VERSION,
    condition,
    kustomize_build,
    plain_runtime,
)

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[3]
SYSTEM = "hpcbridge-system"
DEPLOYMENT = "hpcbridge-operator"
CLUSTER = "slurm-in-cluster"


def _wait(what: str, check, timeout: float = 180, detail=lambda: "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {detail()}"
        time.sleep(0.5)


def _pod_log(core, namespace: str, name: str) -> str:
    try:
        return core.read_namespaced_pod_log(name, namespace, tail_lines=60)
    except Exception as exc:  # noqa: BLE001 - only for a failure message
        return f"(no log: {exc})"


def test_pods_reach_each_other_and_the_api_server_through_services(real_kube) -> None:
    from kubernetes import client

    api = real_kube.api_client()
    core = client.CoreV1Api(api)
    namespace = f"svc-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    image = real_kube.images["node"].ref
    first, second = real_kube.node_names[0], real_kube.node_names[1]
    try:
        _wait("the default ServiceAccount", lambda: core.list_namespaced_service_account(namespace).items, 60)
        core.create_namespaced_pod(namespace, {"metadata": {"name": "server", "labels": {"app": "server"}}, "spec": {
            "nodeName": first, "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "server", "image": image, "imagePullPolicy": "Never",
                "command": ["python3", "-c", "import http.server as h, pathlib as p; p.Path('/tmp/w').mkdir(); "
                            "p.Path('/tmp/w/hello').write_text('hello through a Service'); "
                            "h.ThreadingHTTPServer(('', 8000), lambda *a: h.SimpleHTTPRequestHandler(*a, "
                            "directory='/tmp/w')).serve_forever()"],
                "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}})
        core.create_namespaced_service(namespace, {"metadata": {"name": "hello"}, "spec": {
            "selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8000}]}})
        # the API server as in-cluster configuration finds it: the `kubernetes` Service's environment variables,
        # the pod's ServiceAccount token and the cluster's CA
        probe = "\n".join([
            "import json, os, ssl, urllib.request as u",
            "sa, ns = '/var/run/secrets/kubernetes.io/serviceaccount', os.environ['NS']",
            "print(u.urlopen(f'http://hello.{ns}.svc.cluster.local/hello', timeout=20).read().decode())",
            "url = f\"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}\"",
            "token = open(sa + '/token').read()",
            "req = u.Request(f'{url}/api/v1/namespaces/{ns}/services/hello', headers={'Authorization': 'Bearer ' + token})",
            "tls = ssl.create_default_context(cafile=sa + '/ca.crt')",
            "print('service', json.load(u.urlopen(req, context=tls, timeout=20))['metadata']['name'],",
            "      os.environ['KUBERNETES_SERVICE_HOST'])"])
        _wait("the server pod ready", lambda: any(
            c.type == "Ready" and c.status == "True"
            for c in core.read_namespaced_pod("server", namespace).status.conditions or []), 120)
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(namespace, {"metadata": {"name": "read-services"}, "rules": [
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}]})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "read-services"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-services"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]})
        core.create_namespaced_pod(namespace, {"metadata": {"name": "client"}, "spec": {
            "nodeName": second, "restartPolicy": "Never", "containers": [{
                "name": "client", "image": image, "imagePullPolicy": "Never",
                "command": ["python3", "-c", probe], "env": [{"name": "NS", "value": namespace}]}]}})
        phase = _wait("the client pod to end", lambda: core.read_namespaced_pod("client", namespace).status.phase
                      in ("Succeeded", "Failed") and core.read_namespaced_pod("client", namespace).status.phase, 120)
        log = _pod_log(core, namespace, "client")
        assert phase == "Succeeded", log
        assert "hello through a Service" in log and "service hello 10.96.0.1" in log, log
    finally:
        core.delete_namespace(namespace)
        api.close()


@pytest.fixture(scope="module")
def in_cluster_operator(real_kube, netns_hosts, netns_slurm, tmp_path_factory):
    """The operator's image in every node, manifests/operator applied as `kubectl apply -k` applies it (the image
    pulled never: nothing is pulled here), its credentials in a Secret and a BridgeCluster for the Slurm cluster
    over SSH; the Deployment is deleted afterwards (other modules run the operator as a process)."""
    from kubernetes import client, utils
    from kubernetes.client.exceptions import ApiException

    from tests.harness.operator_image import ensure_operator_image

    image = ensure_operator_image()
    real_kube.load_image(image)
    real_kube.reach(netns_hosts)
    api = real_kube.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    docs = kustomize_build(ROOT / "manifests" / "operator")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image.ref, "manifests/operator/deployment.yaml names another image than the build"
    deployment = copy.deepcopy(deployment)
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    for doc in [d for d in docs if d["kind"] != "Deployment"]:
        try:
            utils.create_from_dict(api, doc)
        except utils.FailToCreateError as exc:
            assert all(isinstance(e, ApiException) and e.status == 409 for e in exc.api_exceptions), exc
    _wait("the CRDs established", lambda: {"trainjobs.trainer.kubeflow.org", "bridgeclusters.hpcbridge.io"} <= {
        c.metadata.name for c in client.ApiextensionsV1Api(api).list_custom_resource_definition().items
        if any(x.type == "Established" and x.status == "True" for x in c.status.conditions or [])}, 60)
    secret = {"metadata": {"name": "hpcbridge-credentials"}, "type": "Opaque",  # the one its Role names
              "stringData": {"id_ed25519": netns_hosts.client_key.read_text(),
                             "known_hosts": netns_hosts.known_hosts.read_text()}}
    try:
        core.create_namespaced_secret(SYSTEM, secret)
    except ApiException as exc:
        assert exc.status == 409, exc.body
        core.replace_namespaced_secret("hpcbridge-credentials", SYSTEM, secret)
    ref = {"name": "hpcbridge-credentials"}
    body = {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": CLUSTER}, "spec": {
        "type": "slurm", "tenants": TEST_TENANTS,
        "slurm": {"transport": "ssh", "host": netns_hosts.host("node-0").ip, "user": "root",
                  "slurmConf": str(netns_slurm.conf), "keySecretRef": {**ref, "key": "id_ed25519"},
                  "knownHostsSecretRef": {**ref, "key": "known_hosts"}},
        # the job's steps run on the Slurm hosts, which share this machine's files: this checkout's package, in
        # a directory of the test's own
        "defaults": {"launchCommand": ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "bridge", "launch"],
                     "workdir": str(tmp_path_factory.mktemp("in-cluster-jobs"))}}}
    try:
        custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", body)
    except ApiException as exc:
        assert exc.status == 409, exc.body
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", plain_runtime("plain-slurm"))
    except ApiException as exc:
        assert exc.status == 409, exc.body
    apps.create_namespaced_deployment(SYSTEM, deployment)
    try:
        yield Deployed(api, image)
    finally:
        apps.delete_namespaced_deployment(DEPLOYMENT, SYSTEM, propagation_policy="Foreground")
        _wait("the operator pods gone", lambda: not core.list_namespaced_pod(
            SYSTEM, label_selector=f"app.kubernetes.io/name={DEPLOYMENT}").items, 120)
        custom.delete_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", CLUSTER)
        core.delete_namespaced_secret("hpcbridge-credentials", SYSTEM)
        api.close()


class Deployed:
    def __init__(self, api, image) -> None:
        from kubernetes import client

        self.api, self.image = api, image
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def pods(self) -> list:
        return self.core.list_namespaced_pod(SYSTEM, label_selector=f"app.kubernetes.io/name={DEPLOYMENT}").items

    def logs(self) -> str:
        return "\n".join(f"--- {p.metadata.name} on {p.spec.node_name}: {p.status.phase}\n"
                         f"{_pod_log(self.core, SYSTEM, p.metadata.name)}" for p in self.pods())

    def namespace(self) -> str:
        name = f"inc-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: "yes"}}})
        binding = yaml.safe_load((ROOT / "manifests" / "operator" / "namespace-binding.yaml").read_text())
        binding["metadata"]["namespace"] = name
        from kubernetes import client

        client.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(name, binding)
        return name


def test_the_operator_pod_runs_a_trainjob_on_slurm_over_the_pod_network(in_cluster_operator, real_kube,
                                                                        netns_slurm) -> None:
    op = in_cluster_operator

    def ready() -> list:
        return [p for p in op.pods() if p.status.phase == "Running" and any(
            s.ready for s in p.status.container_statuses or [])]

    running = _wait("an operator pod ready", ready, 180, op.logs)
    pod = running[0]
    assert pod.spec.node_name in real_kube.node_names  # a real kubelet node ran it, from the image loaded there
    assert pod.status.container_statuses[0].image.endswith(op.image.ref.split("/", 1)[1])
    assert pod.spec.security_context.run_as_user == 65532 and pod.spec.service_account_name == DEPLOYMENT
    ns = op.namespace()
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": "in-cluster", "annotations": {"hpcbridge.io/cluster": CLUSTER}},
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain-slurm"},
                     "trainer": {"numNodes": 1, "command": ["sh", "-c", "echo hello from $(hostname)"]}}}
    created = op.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", body)

    def complete() -> dict | None:
        obj = op.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "in-cluster")
        return obj if (condition(obj, "Complete") or {}).get("status") == "True" else None

    done = _wait("the TrainJob Complete", complete, 240,
                 lambda: f"{op.custom.get_namespaced_custom_object(GROUP, VERSION, ns, 'trainjobs', 'in-cluster')}"
                         f"\n{op.logs()}")
    job_id = done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    shown = netns_slurm.run("scontrol", "show", "job", job_id, "-o").stdout
    # the Slurm job is this TrainJob's (its uid in the comment) and really ran to its end
    assert created["metadata"]["uid"] in shown and "JobState=COMPLETED" in shown, shown
    assert f"slurm job {job_id} on cluster {CLUSTER} succeeded" in condition(done, "Complete")["message"]
