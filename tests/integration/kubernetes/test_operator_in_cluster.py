"""The operator as a platform team runs it: its image (tests/harness/operator_image.py, the recipe users run)
loaded into the real kubelet nodes' containerd, installed with `helm install` of charts/hpc-bridge (CRDs,
ServiceAccount, RBAC, Deployment, metrics Service), the pod started on a real node with in-cluster configuration
(its ServiceAccount token, the API server through the `kubernetes` Service that kube-proxy serves), and TrainJobs
applied with the Kubernetes client run on the Slurm cluster, which the pod reaches through the pod network: over
SSH with the key and known_hosts from a Secret, and over slurmrestd with a JWT from the same Secret. Then, with a
TrainJob in flight each time, `helm upgrade` to a new image tag (the Deployment rolls, the job runs once) and
`helm uninstall` (what install made is gone, the job runs on).

Services on the nodes are checked on their own first: a pod on one node reaches a pod on the other through a
Service's name, and the API server through the `kubernetes` Service with its ServiceAccount token.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from bridge.operator.virtual_node import node_name
from tests.integration.kubernetes.test_operator import (
    GROUP,
    TEST_NAMESPACE_LABEL,
    TEST_TENANTS,
    VERSION,
    condition,
    plain_runtime,
)

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[3]
SYSTEM = "hpcbridge-system"
DEPLOYMENT = "hpcbridge-operator"
CLUSTER = "slurm-in-cluster"
REST_CLUSTER = "slurm-rest-in-cluster"
CHART = ROOT / "charts" / "hpc-bridge"
RELEASE = "hpcbridge"


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
            "import json, os, ssl, time, urllib.error, urllib.request as u",
            "sa, ns = '/var/run/secrets/kubernetes.io/serviceaccount', os.environ['NS']",
            # kube-proxy writes a Service's rules a moment after its EndpointSlice changes (until then the
            # Service refuses): the client retries for 30 s, as a client of a new Service must
            "deadline = time.monotonic() + 30",
            "while True:",
            "    try:",
            "        print(u.urlopen(f'http://hello.{ns}.svc.cluster.local/hello', timeout=20).read().decode())",
            "        break",
            "    except (urllib.error.URLError, ConnectionError) as exc:",
            "        if time.monotonic() > deadline:",
            "            raise",
            "        print('retrying:', exc, flush=True)",
            "        time.sleep(0.5)",
            "url = f\"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}\"",
            "token = open(sa + '/token').read()",
            "req = u.Request(f'{url}/api/v1/namespaces/{ns}/services/hello', headers={'Authorization': 'Bearer ' + token})",
            "tls = ssl.create_default_context(cafile=sa + '/ca.crt')",
            "print('service', json.load(u.urlopen(req, context=tls, timeout=20))['metadata']['name'],",
            "      os.environ['KUBERNETES_SERVICE_HOST'])"])
        _wait("the server pod ready", lambda: any(
            c.type == "Ready" and c.status == "True"
            for c in core.read_namespaced_pod("server", namespace).status.conditions or []), 120)
        discovery = client.DiscoveryV1Api(api)
        _wait("the Service's ready endpoint", lambda: any(
            (endpoint.conditions is None or endpoint.conditions.ready is not False)
            for piece in discovery.list_namespaced_endpoint_slice(
                namespace, label_selector="kubernetes.io/service-name=hello").items
            for endpoint in piece.endpoints or []), 60)
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


def _helm_values(tag: str | None = None) -> list[str]:
    """The chart's values for this cluster: the image loaded into the nodes, never pulled (no registry here), of
    the chart's default tag unless *tag*; one replica, a candidate for the Lease as each of the default two is
    (a rolling update still hands over)."""
    return [*(["--set", f"image.tag={tag}"] if tag else []), "--set", "image.pullPolicy=Never", "--set", "replicas=1"]


@pytest.fixture(scope="module")
def in_cluster_operator(real_kube, netns_hosts, netns_slurm, tmp_path_factory):
    """The operator's image in every node, installed as users install it, `helm install` of charts/hpc-bridge
    (helm and kubectl built from Go modules), its credentials in a Secret and a BridgeCluster for the Slurm
    cluster over SSH; whatever the last test left installed is uninstalled afterwards (other modules run the
    operator as a process)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from tests.harness.operator_image import ensure_operator_image
    from tests.integration.kubernetes.test_operator_install import Tools

    image = ensure_operator_image()
    real_kube.load_image(image)
    real_kube.reach(netns_hosts)
    tools = Tools(real_kube.kube, tmp_path_factory.mktemp("helm-home"))
    rendered = tools.helm("template", RELEASE, str(CHART), "--namespace", SYSTEM, *_helm_values()).stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image.ref, \
        "the chart's default image is not the one built"
    # earlier modules create manifests/operator's RBAC and ServiceAccount by hand (they run the operator as a
    # process with its token); helm installs only what no one else owns, so those go first (each module that
    # needs them creates them again)
    (tools.home / "rendered.yaml").write_text(rendered)
    tools.kubectl("delete", "-f", str(tools.home / "rendered.yaml"), "--ignore-not-found", "--wait")
    # earlier modules created the CRDs too (the Python client, as their own field manager): Helm 4 applies crds/
    # server-side and stops at their fields unless it takes them over, as docs/operator-install.md says to
    tools.helm("install", RELEASE, str(CHART), "--namespace", SYSTEM, "--create-namespace", "--force-conflicts",
               *_helm_values())
    api = real_kube.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
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
    workdir = tmp_path_factory.mktemp("in-cluster-jobs")
    # the job's steps run on the Slurm hosts, which share this machine's files: this checkout's package, in a
    # directory of the test's own
    defaults = {"launchCommand": ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "bridge", "launch"],
                "workdir": str(workdir)}
    body = {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": CLUSTER}, "spec": {
        "type": "slurm", "tenants": TEST_TENANTS,
        "slurm": {"transport": "ssh", "host": netns_hosts.host("node-0").ip, "user": "root",
                  "slurmConf": str(netns_slurm.conf), "keySecretRef": {**ref, "key": "id_ed25519"},
                  "knownHostsSecretRef": {**ref, "key": "known_hosts"}},
        "defaults": defaults}}
    try:
        custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", body)
    except ApiException as exc:
        assert exc.status == 409, exc.body
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", plain_runtime("plain-slurm"))
    except ApiException as exc:
        assert exc.status == 409, exc.body
    deployed = Deployed(api, image, tools, workdir, defaults)
    try:
        yield deployed
    finally:
        if tools.helm("status", RELEASE, "--namespace", SYSTEM, ok=False).returncode == 0:
            tools.helm("uninstall", RELEASE, "--namespace", SYSTEM, "--wait", "--timeout", "120s")
        for name in deployed.clusters:  # and their virtual Nodes: a stopped operator's Nodes stay
            for delete, args in ((custom.delete_cluster_custom_object, ("hpcbridge.io", "v1alpha1", "bridgeclusters",
                                                                        name)),
                                 (core.delete_node, (node_name(name),))):
                try:
                    delete(*args)
                except ApiException as exc:
                    assert exc.status == 404, exc.body
        core.delete_namespaced_secret("hpcbridge-credentials", SYSTEM)
        api.close()


class Deployed:
    def __init__(self, api, image, tools, workdir: Path, defaults: dict) -> None:
        from kubernetes import client

        self.api, self.image, self.tools, self.workdir, self.defaults = api, image, tools, workdir, defaults
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.clusters = [CLUSTER]  # the BridgeClusters the module made

    def pods(self) -> list:
        return self.core.list_namespaced_pod(SYSTEM, label_selector=f"app.kubernetes.io/name={DEPLOYMENT}").items

    def logs(self) -> str:
        return "\n".join(f"--- {p.metadata.name} on {p.spec.node_name}: {p.status.phase} "
                         f"{[(c.ready, c.restart_count, c.state, c.last_state) for c in p.status.container_statuses or []]}"
                         f"\n{_pod_log(self.core, SYSTEM, p.metadata.name)}" for p in self.pods())

    def rolled_out(self) -> None:
        """`kubectl rollout status` of the Deployment, with the pods' states and logs when it does not finish."""
        done = self.tools.kubectl("-n", SYSTEM, "rollout", "status", f"deployment/{DEPLOYMENT}", "--timeout=180s",
                                  ok=False)
        assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{self.logs()}\n" + self.tools.kubectl(
            "-n", SYSTEM, "get", "events", ok=False).stdout

    def namespace(self) -> str:
        name = f"inc-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: "yes"}}})
        binding = yaml.safe_load((ROOT / "manifests" / "operator" / "namespace-binding.yaml").read_text())
        binding["metadata"]["namespace"] = name
        from kubernetes import client

        client.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(name, binding)
        return name

    def apply(self, namespace: str, name: str, cluster: str, command: list[str]) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
                "metadata": {"name": name, "annotations": {"hpcbridge.io/cluster": cluster}},
                "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain-slurm"},
                         "trainer": {"numNodes": 1, "command": command}}}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", body)

    def get(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)

    def until_complete(self, namespace: str, name: str) -> dict:
        def complete() -> dict | None:
            obj = self.get(namespace, name)
            return obj if (condition(obj, "Complete") or {}).get("status") == "True" else None

        return _wait(f"TrainJob {name} Complete", complete, 240, lambda: f"{self.get(namespace, name)}\n{self.logs()}")

    def until_running_on_slurm(self, namespace: str, name: str, slurm) -> str:
        """The Slurm job id of TrainJob *name*, once slurmctld says it runs."""
        def running() -> str | None:
            job_id = (self.get(namespace, name)["metadata"].get("annotations") or {}).get(
                "operator.hpcbridge.io/job-id")
            shown = slurm.run("scontrol", "show", "job", job_id, "-o").stdout if job_id else ""
            return job_id if "JobState=RUNNING" in shown else None

        return str(_wait(f"TrainJob {name}'s Slurm job running", running, 180,
                         lambda: f"{self.get(namespace, name)}\n{self.logs()}"))

    def release_file(self) -> tuple[Path, list[str]]:
        """A file, and a job command that runs until the file exists: a job in flight for as long as a test
        needs, without guessing how long that is (the Slurm hosts share this machine's files)."""
        release = self.workdir / f"release-{uuid.uuid4().hex[:8]}"
        return release, ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.2; done; echo released"]


def slurm_jobs(slurm, uid: str) -> list[str]:
    """The ids of every Slurm job carrying TrainJob *uid* (finished ones are kept MinJobAge, 5 minutes)."""
    listed = slurm.run("scontrol", "show", "job", "-o").stdout
    return [line.split()[0].removeprefix("JobId=") for line in listed.splitlines()
            if f"hpcbridge.io/uid={uid}" in line]


def test_the_chart_installed_operator_pod_runs_a_trainjob_on_slurm_over_the_pod_network(in_cluster_operator,
                                                                                      real_kube,
                                                                                      netns_slurm) -> None:
    op = in_cluster_operator
    op.rolled_out()
    (pod,) = [p for p in op.pods() if p.status.phase == "Running" and any(
        s.ready for s in p.status.container_statuses or [])]
    assert pod.spec.node_name in real_kube.node_names  # a real kubelet node ran it, from the image loaded there
    assert pod.status.container_statuses[0].image.endswith(op.image.ref.split("/", 1)[1])
    assert pod.spec.security_context.run_as_user == 65532 and pod.spec.service_account_name == DEPLOYMENT
    assert pod.metadata.labels["app.kubernetes.io/name"] == DEPLOYMENT
    ns = op.namespace()
    created = op.apply(ns, "in-cluster", CLUSTER, ["sh", "-c", "echo hello from $(hostname)"])
    done = op.until_complete(ns, "in-cluster")
    job_id = done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    shown = netns_slurm.run("scontrol", "show", "job", job_id, "-o").stdout
    # the Slurm job is this TrainJob's (its uid in the comment) and really ran to its end
    assert created["metadata"]["uid"] in shown and "JobState=COMPLETED" in shown, shown
    assert f"slurm job {job_id} on cluster {CLUSTER} succeeded" in condition(done, "Complete")["message"]


def test_helm_upgrade_to_a_new_tag_rolls_the_operator_and_the_job_in_flight_runs_once(in_cluster_operator,
                                                                                      real_kube,
                                                                                      netns_slurm) -> None:
    """`helm upgrade` to another image tag (the same image retagged in the nodes' containerd, as a new release
    pushed to a registry would be there) while a TrainJob runs on Slurm: the Deployment rolls, the new pod takes
    the Lease over and follows the job the old pod sent, to Complete, and no second Slurm job is sent."""
    from kubernetes import client

    from tests.harness.kubelet import NODE_RUN

    op = in_cluster_operator
    old_pods = {p.metadata.name for p in op.pods()}
    ns = op.namespace()
    release, command = op.release_file()
    created = op.apply(ns, "upgraded", CLUSTER, command)
    uid = created["metadata"]["uid"]
    job_id = op.until_running_on_slurm(ns, "upgraded", netns_slurm)
    tag = f"{op.image.ref.rsplit(':', 1)[1]}-next"
    ctr = ["ctr", "--address", f"{NODE_RUN}/containerd/containerd.sock", "--namespace", "k8s.io", "images"]
    for host in real_kube.hosts.hosts:
        listed = real_kube.hosts.exec_in_host(host, [*ctr, "ls", "-q"]).stdout.split()
        (source,) = [name for name in listed if name in (op.image.ref, f"docker.io/{op.image.ref}")]
        tagged = real_kube.hosts.exec_in_host(host, [*ctr, "tag", "--force", source, f"{source.rsplit(':', 1)[0]}:{tag}"])
        assert tagged.returncode == 0, tagged.stderr
    op.tools.helm("upgrade", RELEASE, str(CHART), "--namespace", SYSTEM, *_helm_values(tag))
    op.rolled_out()
    _wait("the old operator pods gone", lambda: not old_pods & {p.metadata.name for p in op.pods()}, 120, op.logs)
    (pod,) = op.pods()
    assert pod.spec.containers[0].image.endswith(f":{tag}") and pod.spec.node_name in real_kube.node_names
    leases = client.CoordinationV1Api(op.api)
    _wait("the new pod holding the Lease", lambda: leases.read_namespaced_lease(
        DEPLOYMENT, SYSTEM).spec.holder_identity == pod.metadata.name, 120, op.logs)
    # the job was in flight all along: it ends only now
    assert "JobState=RUNNING" in netns_slurm.run("scontrol", "show", "job", job_id, "-o").stdout
    release.touch()
    done = op.until_complete(ns, "upgraded")
    assert done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"] == job_id
    assert f"slurm job {job_id} on cluster {CLUSTER} succeeded" in condition(done, "Complete")["message"]
    assert slurm_jobs(netns_slurm, uid) == [job_id]  # neither lost nor sent twice


def test_a_bridgecluster_over_slurmrestd_runs_a_trainjob_from_the_operator_pod(in_cluster_operator, netns_hosts,
                                                                              netns_slurm) -> None:
    """transport rest: slurmrestd (JWT) on the Slurm hosts' network, reached from the operator pod as the
    login host is, its token a key of the credentials Secret."""
    from kubernetes.client.exceptions import ApiException

    op = in_cluster_operator
    url = netns_slurm.rest_url or netns_slurm.start_rest(netns_hosts.gateway)
    assert url.startswith(f"http://{netns_hosts.gateway}:"), url  # not loopback: the pod reaches it over the network
    op.core.patch_namespaced_secret("hpcbridge-credentials", SYSTEM,
                                    {"stringData": {"slurm_jwt": f"SLURM_JWT={netns_slurm.token()}"}})
    body = {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": REST_CLUSTER},
            "spec": {"type": "slurm", "tenants": TEST_TENANTS, "defaults": op.defaults,
                     "slurm": {"transport": "rest", "restUrl": url, "user": "root",
                               "slurmConf": str(netns_slurm.conf),
                               "tokenSecretRef": {"name": "hpcbridge-credentials", "key": "slurm_jwt"}}}}
    try:
        op.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", body)
    except ApiException as exc:
        assert exc.status == 409, exc.body
    op.clusters.append(REST_CLUSTER)
    ns = op.namespace()
    created = op.apply(ns, "via-rest", REST_CLUSTER, ["sh", "-c", "echo hello over rest from $(hostname)"])
    done = op.until_complete(ns, "via-rest")
    job_id = done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    assert done["metadata"]["annotations"]["operator.hpcbridge.io/job-cluster"] == REST_CLUSTER
    assert f"slurm job {job_id} on cluster {REST_CLUSTER} succeeded" in condition(done, "Complete")["message"]
    shown = netns_slurm.run("scontrol", "show", "job", job_id, "-o").stdout
    assert "JobState=COMPLETED" in shown and slurm_jobs(netns_slurm, created["metadata"]["uid"]) == [job_id], shown


def test_helm_uninstall_removes_what_install_made_and_the_backend_job_runs_on(in_cluster_operator,
                                                                            netns_slurm) -> None:
    """As docs/operator-install.md says: `helm uninstall` removes the operator and everything it installed; the
    CRDs stay, and with them the TrainJobs and BridgeClusters, and a backend job in flight runs on untracked."""
    from kubernetes import client

    op = in_cluster_operator
    ns = op.namespace()
    release, command = op.release_file()
    op.apply(ns, "outlives", CLUSTER, command)
    job_id = op.until_running_on_slurm(ns, "outlives", netns_slurm)
    made = [doc for doc in yaml.safe_load_all(op.tools.helm("get", "manifest", RELEASE, "-n", SYSTEM).stdout)
            if doc]
    assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
            "RoleBinding"} <= {doc["kind"] for doc in made}
    op.tools.helm("uninstall", RELEASE, "--namespace", SYSTEM, "--wait", "--timeout", "120s")
    for doc in made:
        where = ["-n", doc["metadata"]["namespace"]] if doc["metadata"].get("namespace") else []
        gone = op.tools.kubectl("get", doc["kind"], doc["metadata"]["name"], *where, "--ignore-not-found", "-o",
                                "name")
        assert gone.stdout.strip() == "", f"{doc['kind']}/{doc['metadata']['name']} outlived helm uninstall"
    _wait("the operator pods gone", lambda: not op.pods(), 120, op.logs)
    for crd in ("trainjobs.trainer.kubeflow.org", "bridgeclusters.hpcbridge.io"):  # helm never deletes crds/
        assert op.tools.kubectl("get", "crd", crd, "-o", "name").stdout.strip()
    assert {c["metadata"]["name"] for c in op.custom.list_cluster_custom_object(
        "hpcbridge.io", "v1alpha1", "bridgeclusters")["items"]} >= set(op.clusters)
    # what the operator wrote as it ran is not the install's and stays: its Lease (which its last pod may not
    # release, its Role going at the same time: it expires), and its virtual Nodes (NotReady soon)
    assert client.CoordinationV1Api(op.api).read_namespaced_lease(DEPLOYMENT, SYSTEM).metadata.name == DEPLOYMENT
    assert op.core.read_node(node_name(CLUSTER)).metadata.labels["hpcbridge.io/managed-by"] == "virtual-node"
    kept = op.get(ns, "outlives")
    assert "hpcbridge.io/finalizer" in kept["metadata"]["finalizers"]
    # nothing cancelled it: the job runs on, untracked, to its end
    assert "JobState=RUNNING" in netns_slurm.run("scontrol", "show", "job", job_id, "-o").stdout
    release.touch()
    _wait("the Slurm job completed", lambda: "JobState=COMPLETED" in netns_slurm.run(
        "scontrol", "show", "job", job_id, "-o").stdout, 120)
    assert (condition(op.get(ns, "outlives"), "Complete") or {}).get("status") != "True"  # no operator wrote it
    # with no operator to cancel the job, the finalizer is let go by hand (as the doc says)
    op.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "outlives",
                                             {"metadata": {"finalizers": None}})
    op.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "outlives")
