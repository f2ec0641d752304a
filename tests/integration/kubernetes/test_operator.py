"""`hpcbridge operator` against a real API server (the real-node control plane) and real backends: TrainJobs
applied as a Kubernetes user applies them run on the real Slurm cluster or as JobSets whose pods really run, and
their status follows the backend's state.

The operator runs as a separate process, as it would in its Deployment; the tests talk only to the API server
(and read the backend to check what was really submitted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[3]
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def kustomize_build(directory: Path) -> list[dict]:
    """What `kubectl apply -k DIRECTORY` applies: `kustomize build` (built from its Go module)."""
    from tests.harness.kube import KUSTOMIZE, ensure_built

    binary = ensure_built((KUSTOMIZE,))["kustomize"]
    built = subprocess.run([str(binary), "build", str(directory)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def _apply_kustomization(api, directory: Path) -> None:
    """`kubectl apply -k` of manifests/operator (its Deployment left out: the image is not on these nodes, the
    operator runs as a process instead), then wait for the CRDs to be served."""
    from kubernetes import client, utils
    from kubernetes.client.exceptions import ApiException

    for doc in kustomize_build(directory):
        if doc["kind"] == "Deployment":
            continue
        try:
            utils.create_from_dict(api, doc)
        except utils.FailToCreateError as exc:
            assert all(isinstance(e, ApiException) and e.status == 409 for e in exc.api_exceptions), exc
    ext = client.ApiextensionsV1Api(api)
    wanted = {"trainjobs.trainer.kubeflow.org", "bridgeclusters.hpcbridge.io", "trainingruntimes.trainer.kubeflow.org",
              "clustertrainingruntimes.trainer.kubeflow.org"}
    deadline = time.monotonic() + 60
    while not wanted <= {c.metadata.name for c in ext.list_custom_resource_definition().items
                         if any(x.type == "Established" and x.status == "True" for x in c.status.conditions or [])}:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _service_account_kubeconfig(api, admin_kubeconfig: Path, path: Path) -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount (a bound token), as its pod would."""
    from kubernetes import client

    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        "hpcbridge-operator", "hpcbridge-system", {"spec": {"expirationSeconds": 7200}}).status.token
    config = yaml.safe_load(admin_kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    return path


#: the label Operator.namespace() gives every namespace it makes, and the tenant that maps them: the test clusters
#: serve these namespaces under their own identity, as a single-tenant site would say explicitly
TEST_NAMESPACE_LABEL = "hpcbridge.test/operator-tests"
TEST_TENANTS = [{"name": "tests", "namespaceSelector": {"matchLabels": {TEST_NAMESPACE_LABEL: "yes"}}}]


def plain_runtime(name: str) -> dict:
    """A one-node ClusterTrainingRuntime of one `node` container (the node image on real pods)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterTrainingRuntime", "metadata": {"name": name},
            "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
                "name": "node", "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"backoffLimit": 0, "template": {"spec": {
                        "restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                        "containers": [{"name": "node", "image": "hpcbridge.test/plain"}]}}}}}]}}}}


class Operator:
    """One `hpcbridge operator` process and what the tests need around it."""

    def __init__(self, cluster, slurm, base: Path) -> None:
        from kubernetes import client

        self.cluster, self.slurm, self.base = cluster, slurm, base
        self.api = cluster.api_client()
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        # the operator runs as its ServiceAccount, with the RBAC manifests/operator grants and nothing more
        kubeconfig = _service_account_kubeconfig(self.api, cluster.kube.kubeconfig, base / "operator.kubeconfig")
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "XDG_STATE_HOME": str(base / "state"),
                    "SLURM_CONF": str(slurm.conf), "HPCBRIDGE_CONFIG": str(base / "no-clusters.yaml")}
        (base / "no-clusters.yaml").write_text("")
        # the virtual nodes' kubelet API (bridge.operator.kubelet_api): where the API server reaches it, a serving
        # certificate of the test PKI, and the client CA the API server's kubelet client certificate comes from
        import socket

        with socket.socket() as probe:
            probe.bind(("", 0))
            self.kubelet_port = probe.getsockname()[1]
        pki = cluster.kube.pki
        self.env.update({"HPCBRIDGE_KUBELET_ADDRESS": cluster.kube.address,
                         "HPCBRIDGE_KUBELET_PORT": str(self.kubelet_port),
                         "HPCBRIDGE_KUBELET_CERT": str(pki["serving"]), "HPCBRIDGE_KUBELET_KEY": str(pki["serving_key"]),
                         "HPCBRIDGE_KUBELET_CLIENT_CA": str(pki["ca"])})
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log = open(self.base / f"operator-{time.monotonic_ns()}.log", "w")
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.metrics = f"127.0.0.1:{probe.getsockname()[1]}"
        self.proc = subprocess.Popen([sys.executable, "-m", "bridge", "operator", "--metrics", self.metrics],
                                     env=self.env, cwd=self.base, stdout=self.log, stderr=subprocess.STDOUT)

    def define_clusters(self, clusters: dict[str, dict]) -> None:
        """BridgeCluster objects, name → spec; one of that name that another module defined is replaced (the
        kueue module's `pods` has no pod policy for hostPath, which this module's migrate test needs)."""
        from kubernetes.client.exceptions import ApiException

        for name, spec in clusters.items():
            body = {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": name},
                    "spec": spec}
            try:
                self.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", body)
            except ApiException as exc:
                assert exc.status == 409, exc.body
                existing = self.custom.get_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", name)
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                self.custom.replace_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", name, body)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def close(self) -> None:
        """End the operator for good: its process, then the virtual nodes it registered, which stay after it as a
        stopped kubelet's Node does (other modules count the cluster's nodes), then the API connection."""
        self.kill(signal.SIGTERM)
        self.core.delete_collection_node(label_selector="hpcbridge.io/managed-by=virtual-node")
        self.api.close()

    def logs(self, tail: int | None = 4000) -> str:
        """The operator's output: the last *tail* characters, every start's with ``tail=None``."""
        if tail is None:
            return "".join(path.read_text() for path in sorted(self.base.glob("operator-*.log")))
        return (Path(self.log.name).read_text()[-tail:]) if self.proc else ""

    def namespace(self) -> str:
        """A namespace for TrainJobs, where the operator may run JobSets (manifests/operator/namespace-binding)."""
        name = f"op-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: "yes"}}})
        binding = yaml.safe_load((ROOT / "manifests" / "operator" / "namespace-binding.yaml").read_text())
        binding["metadata"]["namespace"] = name
        from kubernetes import client

        client.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(name, binding)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.core.read_namespaced_service_account("default", name)
                return name
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.1)

    def apply(self, namespace: str, name: str, cluster: str, command: list[str], runtime: str = "plain-slurm",
              nodes: int = 1, suspend: bool = False, annotations: dict | None = None) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
                "metadata": {"name": name, "annotations": {"hpcbridge.io/cluster": cluster, **(annotations or {})}},
                "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": runtime}, "suspend": suspend,
                         "trainer": {"numNodes": nodes, "command": command}}}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", body)

    def suspend(self, namespace: str, name: str, value: bool) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name,
                                                   {"spec": {"suspend": value}})

    def slurm_state(self, job_id: str) -> str:
        shown = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True, text=True,
                               env=self.env).stdout
        return next((f.split("=", 1)[1] for f in shown.split() if f.startswith("JobState=")), "")

    def get(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)

    def until(self, namespace: str, name: str, check, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            obj = self.get(namespace, name)
            if check(obj):
                return obj
            assert time.monotonic() < deadline, (obj.get("metadata", {}).get("annotations"), obj.get("status"),
                                                 self.logs())
            time.sleep(0.2)

    def events(self, namespace: str, name: str) -> list[tuple[str, str, str]]:
        items = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        return [(e.type, e.reason, e.message) for e in sorted(items, key=lambda e: e.metadata.creation_timestamp)]

    def slurm_jobs(self, uid: str) -> list[str]:
        """Slurm jobs (any state) whose comment carries this TrainJob uid."""
        out = subprocess.run(["squeue", "--noheader", "--states=all", "--Format=JobID:20,Comment:400"],
                             capture_output=True, text=True, env=self.env).stdout
        return [line.split()[0] for line in out.splitlines() if uid in line]


def condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def is_true(kind: str):
    return lambda obj: (condition(obj, kind) or {}).get("status") == "True"


@pytest.fixture(scope="module")
def operator(real_kube, slurm_cluster, tmp_path_factory):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    base = tmp_path_factory.mktemp("operator")
    admin = real_kube.api_client()
    _apply_kustomization(admin, ROOT / "manifests" / "operator")
    admin.close()
    op = Operator(real_kube, slurm_cluster, base)
    slurm_spec = {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                  "defaults": {"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]}}
    clusters = {
        "slurm": {**slurm_spec, "tenants": TEST_TENANTS},
        "slurm-restricted": {**slurm_spec, "allowedNamespaces": ["somewhere-else"]},
        "pods": {"type": "kubernetes", "tenants": TEST_TENANTS, "kubernetes": {
            "kubeconfig": str(real_kube.kube.kubeconfig), "imagePullPolicy": "Never",
            "images": {"hpcbridge.test/plain": real_kube.images["node"].ref},
            # the movable runtime's checkpoint directory is a hostPath (test_migrate_to_moves_...)
            "podPolicy": {"volumes": ["hostPath"]}}},
    }
    op.define_clusters(clusters)
    runtime = plain_runtime("plain-slurm")
    try:
        client.CustomObjectsApi(op.api).create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes",
                                                                     runtime)
    except ApiException as exc:
        assert exc.status == 409, exc.body
    op.start()
    yield op
    op.close()


def test_a_trainjob_applied_runs_on_slurm_and_completes(operator) -> None:
    ns = operator.namespace()
    created = operator.apply(ns, "hello", "slurm", ["sh", "-c", "echo hello from slurm"])
    done = operator.until(ns, "hello", is_true("Complete"))
    uid = created["metadata"]["uid"]
    job_id = done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    assert done["metadata"]["annotations"]["operator.hpcbridge.io/job-cluster"] == "slurm"
    assert operator.slurm_jobs(uid) == [job_id]  # exactly one Slurm job carries this TrainJob
    assert condition(done, "Submitted")["status"] == "True"
    assert (condition(done, "Running") or {}).get("status") != "True"  # absent when it ended between two polls
    assert done["status"]["conditions"][-1]["type"] == "Complete"  # kubectl's State column
    assert f"slurm job {job_id} on cluster slurm succeeded" in condition(done, "Complete")["message"]
    reasons = [reason for _, reason, _ in operator.events(ns, "hello")]
    # one Event per change of state (Running only when a poll saw it run; Queued only when Slurm gave a reason)
    assert {"Submitted", "Succeeded"} <= set(reasons) <= {"Submitted", "Queued", "Running", "Succeeded"}, reasons
    assert len([r for r in reasons if r != "Queued"]) == len(set(reasons) - {"Queued"}), reasons
    # the CLI sees the same job, by the id the TrainJob records
    config = operator.base / "cli-clusters.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                      "metadata": {"name": "slurm"}, "spec": {"type": "slurm", "slurm": {
                                          "transport": "local", "slurmConf": str(operator.slurm.conf)}}}))
    shown = subprocess.run([sys.executable, "-m", "bridge", "status", job_id, "--cluster", "slurm", "-o", "yaml"],
                           capture_output=True, text=True, env={**operator.env, "HPCBRIDGE_CONFIG": str(config)})
    assert yaml.safe_load(shown.stdout)[0]["state"] == "Succeeded", shown.stderr


def test_a_failing_command_fails_the_trainjob_with_its_exit_code(operator) -> None:
    ns = operator.namespace()
    operator.apply(ns, "fails", "slurm", ["sh", "-c", "exit 7"])
    failed = operator.until(ns, "fails", is_true("Failed"))
    assert "with exit code 7" in condition(failed, "Failed")["message"], failed["status"]
    assert ("Warning", "Failed") in [(kind, reason) for kind, reason, _ in operator.events(ns, "fails")]


def test_a_namespace_the_cluster_does_not_allow_is_refused_and_nothing_is_submitted(operator) -> None:
    ns = operator.namespace()
    created = operator.apply(ns, "not-here", "slurm-restricted", ["true"])
    refused = operator.until(ns, "not-here", is_true("Failed"))
    failed = condition(refused, "Failed")
    assert failed["reason"] == "NamespaceNotAllowed", failed
    assert "maps no tenant to this namespace" in failed["message"] and ns in failed["message"]
    assert operator.slurm_jobs(created["metadata"]["uid"]) == []
    assert "operator.hpcbridge.io/job-id" not in (refused["metadata"].get("annotations") or {})


def test_deleting_a_running_trainjob_cancels_its_slurm_job(operator) -> None:
    ns = operator.namespace()
    created = operator.apply(ns, "long", "slurm", ["sleep", "600"])
    running = operator.until(ns, "long", is_true("Running"))
    job_id = running["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    assert "hpcbridge.io/finalizer" in running["metadata"]["finalizers"]
    operator.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "long")
    deadline = time.monotonic() + 60
    from kubernetes.client.exceptions import ApiException

    while True:  # the finalizer lets it go once the Slurm job is cancelled
        try:
            operator.get(ns, "long")
        except ApiException as exc:
            assert exc.status == 404
            break
        assert time.monotonic() < deadline, operator.logs()
        time.sleep(0.2)
    state = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True, text=True,
                           env=operator.env).stdout
    assert "JobState=CANCELLED" in state, state
    assert operator.slurm_jobs(created["metadata"]["uid"]) == [job_id]


def test_a_trainjob_for_the_kubernetes_cluster_runs_as_a_jobset_on_real_pods(operator) -> None:
    ns = operator.namespace()
    created = operator.apply(ns, "on-pods", "pods", ["sh", "-c", "echo hello from a pod"],
                             annotations={"hpcbridge.io/sbatch.mail-type": "END"})
    done = operator.until(ns, "on-pods", is_true("Complete"), timeout=180)
    # the Slurm-only option it carries is dropped off Slurm with a note, which kubectl describe shows
    notes = [message for kind, reason, message in operator.events(ns, "on-pods") if reason == "Note"]
    assert any("--mail-type=END dropped on cluster 'pods'" in note for note in notes), notes
    assert created["metadata"]["annotations"]["hpcbridge.io/sbatch.mail-type"] == "END"
    assert done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"] == f"{ns}/on-pods"
    from kubernetes import client

    pods = client.CoreV1Api(operator.api).list_namespaced_pod(
        ns, label_selector="jobset.sigs.k8s.io/jobset-name=on-pods").items
    assert pods and pods[0].status.phase == "Succeeded"
    log = client.CoreV1Api(operator.api).read_namespaced_pod_log(pods[0].metadata.name, ns)
    assert "hello from a pod" in log


def test_a_killed_operator_restarts_without_duplicating_or_losing_jobs(operator) -> None:
    ns = operator.namespace()
    names = [f"crash-{i}" for i in range(6)]
    uids = {}
    for name in names[:3]:
        uids[name] = operator.apply(ns, name, "slurm", ["sleep", "3"])["metadata"]["uid"]
    time.sleep(1.0)
    operator.kill(signal.SIGKILL)  # mid-flight: some submitted, some maybe not yet
    for name in names[3:]:
        uids[name] = operator.apply(ns, name, "slurm", ["sleep", "3"])["metadata"]["uid"]
    operator.start()
    for name in names:
        operator.until(ns, name, is_true("Complete"), timeout=180)
    for name in names:
        assert len(operator.slurm_jobs(uids[name])) == 1, (name, operator.slurm_jobs(uids[name]))


def test_suspend_stops_the_slurm_job_and_resume_runs_it_again(operator) -> None:
    ns = operator.namespace()
    created = operator.apply(ns, "pausable", "slurm", ["sleep", "600"])
    first = operator.until(ns, "pausable", is_true("Running"))["metadata"]["annotations"][
        "operator.hpcbridge.io/job-id"]
    operator.suspend(ns, "pausable", True)
    suspended = operator.until(ns, "pausable", is_true("Suspended"))
    assert suspended["status"]["conditions"][-1]["type"] == "Suspended"
    assert cond_false(suspended, "Running") and not is_true("Failed")(suspended)
    assert operator.slurm_state(first) == "CANCELLED"
    operator.suspend(ns, "pausable", False)
    resumed = operator.until(ns, "pausable", lambda o: is_true("Running")(o) and o["metadata"]["annotations"][
        "operator.hpcbridge.io/job-id"] != first)
    assert condition(resumed, "Suspended")["reason"] == "Resumed" and cond_false(resumed, "Suspended")
    second = resumed["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    assert sorted(operator.slurm_jobs(created["metadata"]["uid"]), key=int) == [first, second]
    operator.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "pausable")


def test_a_trainjob_created_suspended_waits_until_resumed(operator) -> None:
    # how Kueue holds a TrainJob until it is admitted
    ns = operator.namespace()
    created = operator.apply(ns, "held", "slurm", ["true"], suspend=True)
    operator.until(ns, "held", is_true("Suspended"))
    time.sleep(2)
    assert operator.slurm_jobs(created["metadata"]["uid"]) == []
    operator.suspend(ns, "held", False)
    done = operator.until(ns, "held", is_true("Complete"))
    assert len(operator.slurm_jobs(created["metadata"]["uid"])) == 1
    assert cond_false(done, "Suspended")


def test_a_slurmctld_outage_is_backend_unavailable_and_nothing_fails(operator) -> None:
    ns = operator.namespace()
    running = operator.apply(ns, "through-outage", "slurm", ["sleep", "12"])
    operator.until(ns, "through-outage", is_true("Running"))
    operator.slurm.stop_controller()
    stopped = time.monotonic()
    try:
        operator.until(ns, "through-outage", is_true("BackendUnavailable"), timeout=60)
        # applied while Slurm is down: retried until it is back, then submitted once
        later = operator.apply(ns, "during-outage", "slurm", ["true"])
        operator.until(ns, "during-outage", is_true("BackendUnavailable"), timeout=60)
        time.sleep(5)
        for name in ("through-outage", "during-outage"):
            assert not is_true("Failed")(operator.get(ns, name))
        time.sleep(max(0.0, 60 - (time.monotonic() - stopped)))  # the outage the issue asks for: 60 s
        for name in ("through-outage", "during-outage"):
            assert not is_true("Failed")(operator.get(ns, name))
    finally:
        operator.slurm.start_controller()
    for name, created in (("through-outage", running), ("during-outage", later)):
        done = operator.until(ns, name, is_true("Complete"), timeout=120)
        assert cond_false(done, "BackendUnavailable"), done["status"]
        assert done["status"]["conditions"][-1]["type"] == "Complete"
        assert len(operator.slurm_jobs(created["metadata"]["uid"])) == 1


def cond_false(obj: dict, kind: str) -> bool:
    return (condition(obj, kind) or {}).get("status") == "False"


def test_the_operators_service_account_can_do_its_work_and_read_no_other_secret(operator) -> None:
    """RBAC from manifests/operator, asked of the real API server (SubjectAccessReview): every test in this file
    runs the operator as that ServiceAccount, so what it needs it has; here, what it must not have."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(operator.api)
    sa = "system:serviceaccount:hpcbridge-system:hpcbridge-operator"
    bound = operator.namespace()  # a namespace whose TrainJobs may run as JobSets here

    def allowed(verb: str, resource: str, namespace: str | None = None, group: str = "",
                subresource: str | None = None, name: str | None = None) -> bool:
        attributes = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attributes["namespace"] = namespace
        if subresource:
            attributes["subresource"] = subresource
        if name:
            attributes["name"] = name
        review = authz.create_subject_access_review({"spec": {"user": sa, "resourceAttributes": attributes}})
        return bool(review.status.allowed)

    assert allowed("watch", "trainjobs", group=GROUP) and allowed("patch", "trainjobs", "any-ns", GROUP, "status")
    assert allowed("list", "bridgeclusters", group="hpcbridge.io")
    # its BridgeClusters' credentials, by name; no other Secret of its namespace
    assert allowed("get", "secrets", "hpcbridge-system", name="hpcbridge-credentials")
    assert not allowed("get", "secrets", "hpcbridge-system", name="someone-elses")
    assert not allowed("list", "secrets", "hpcbridge-system")
    assert allowed("create", "jobsets", bound, "jobset.x-k8s.io") and allowed("get", "secrets", bound, name="x")
    assert allowed("delete", "secrets", bound, name="x") and not allowed("list", "secrets", bound)
    assert not allowed("watch", "secrets", bound) and allowed("get", "namespaces", name=bound)
    for namespace in ("kube-system", "default", None):
        assert not allowed("get", "secrets", namespace), namespace
        assert not allowed("list", "secrets", namespace), namespace
        assert not allowed("create", "jobsets", namespace, "jobset.x-k8s.io"), namespace
    # stand-in pods of the virtual nodes (clusterrole-nodes.yaml): created and their status written, never
    # deleted, listed or exec'd into
    assert allowed("create", "pods", bound) and allowed("patch", "pods", bound, subresource="status")
    assert not allowed("delete", "pods", "default") and not allowed("list", "pods", "default")
    assert not allowed("create", "pods", "default", subresource="exec")
    assert allowed("patch", "nodes", subresource="status") and allowed("create", "subjectaccessreviews",
                                                                      group="authorization.k8s.io")
    assert not allowed("delete", "trainjobs", bound, GROUP)
    assert not allowed("update", "clusterroles", group="rbac.authorization.k8s.io")


@pytest.fixture(scope="module")
def ssh_cluster(operator, netns_slurm, netns_hosts) -> str:
    """A BridgeCluster that reaches Slurm over SSH (login host node-0), its key and known_hosts only in a Secret
    in the operator's namespace; and one whose Secret is elsewhere."""
    from kubernetes.client.exceptions import ApiException

    operator.core.create_namespaced_secret("hpcbridge-system", {
        "metadata": {"name": "hpcbridge-credentials"}, "type": "Opaque",  # the one its Role names
        "stringData": {"id_ed25519": netns_hosts.client_key.read_text(),
                       "known_hosts": netns_hosts.known_hosts.read_text()}})
    login = netns_hosts.host("node-0")
    for name, namespace in (("slurm-ssh", None), ("slurm-ssh-elsewhere", "default")):
        ref = {"name": "hpcbridge-credentials", **({"namespace": namespace} if namespace else {})}
        try:
            operator.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", {
                "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": name},
                "spec": {"type": "slurm", "slurm": {
                    "transport": "ssh", "host": login.ip, "user": "root", "slurmConf": str(netns_slurm.conf),
                    "keySecretRef": {**ref, "key": "id_ed25519"}, "knownHostsSecretRef": {**ref, "key": "known_hosts"}},
                    "tenants": TEST_TENANTS,
                    "defaults": {"launchCommand": [sys.executable, "-m", "bridge", "launch"]}}})
        except ApiException as exc:
            assert exc.status == 409, exc.body
    return "slurm-ssh"


def test_credentials_come_from_a_secret_and_never_show(operator, ssh_cluster, netns_hosts, netns_slurm) -> None:
    ns = operator.namespace()
    created = operator.apply(ns, "over-ssh", ssh_cluster, ["sh", "-c", "echo hello over ssh from $(hostname)"])
    done = operator.until(ns, "over-ssh", is_true("Complete"))
    job_id = done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    shown = netns_slurm.run("scontrol", "show", "job", job_id, "-o").stdout
    assert created["metadata"]["uid"] in shown and "JobState=COMPLETED" in shown, shown
    # a Secret outside the operator's namespace is refused, and nothing is submitted
    operator.apply(ns, "elsewhere", "slurm-ssh-elsewhere", ["true"])
    refused = condition(operator.until(ns, "elsewhere", is_true("Failed")), "Failed")
    assert refused["reason"] == "InvalidBridgeCluster" and "only from Secrets in its own namespace" in \
        refused["message"], refused
    key = netns_hosts.client_key.read_text()
    secret_line = next(line for line in key.splitlines() if line and not line.startswith("-----"))
    seen = operator.logs(tail=None) + yaml.safe_dump([operator.get(ns, n) for n in ("over-ssh", "elsewhere")]) + \
        "".join(f"{e}" for n in ("over-ssh", "elsewhere") for e in operator.events(ns, n))
    assert secret_line not in seen


def flux_bridge_cluster(operator, flux_uri: str) -> str:
    """The BridgeCluster ``flux`` (the suite's two brokers), made once for the module; the flux command's path."""
    import shutil

    from kubernetes.client.exceptions import ApiException

    flux = shutil.which("flux")
    assert flux
    try:
        operator.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", {
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "flux"},
            "spec": {"type": "flux", "flux": {"uri": flux_uri, "fluxCommand": flux}, "tenants": TEST_TENANTS,
                     "defaults": {"launchCommand": [sys.executable, "-m", "bridge", "launch"]}}})
    except ApiException as exc:
        assert exc.status == 409, exc.body
    return flux


def test_a_trainjob_for_the_flux_cluster_runs_on_flux_and_its_journal_drives_the_status(operator, flux_uri) -> None:
    """The Flux path: submitted through the flux command, followed through the job manager's event journal
    (``flux python`` JournalConsumer), which wakes the cluster's sync loop on each start and end."""
    import re
    import urllib.request

    flux = flux_bridge_cluster(operator, flux_uri)
    ns = operator.namespace()
    created = operator.apply(ns, "on-flux", "flux", ["sh", "-c", "echo hello from flux"])
    failing = operator.apply(ns, "fails-on-flux", "flux", ["sh", "-c", "exit 3"])
    done = operator.until(ns, "on-flux", is_true("Complete"))
    failed = condition(operator.until(ns, "fails-on-flux", is_true("Failed")), "Failed")
    assert "exit code 3" in failed["message"], failed
    env = {**os.environ, "FLUX_URI": flux_uri}
    for obj, item, result in ((done, created, "COMPLETED"), (operator.get(ns, "fails-on-flux"), failing, "FAILED")):
        job_id = obj["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
        assert obj["metadata"]["annotations"]["operator.hpcbridge.io/job-cluster"] == "flux"
        shown = subprocess.run([flux, "jobs", "-n", "-o", "{result}", job_id], capture_output=True, text=True,
                               env=env).stdout.strip()
        assert shown == result, (job_id, shown)
        spec = subprocess.run([flux, "job", "info", job_id, "jobspec"], capture_output=True, text=True,
                              env=env).stdout
        assert item["metadata"]["uid"] in spec
    text = urllib.request.urlopen(f"http://{operator.metrics}/metrics", timeout=10).read().decode()
    events = re.search(r'hpcbridge_journal_events_total\{cluster="flux"\} (\d+)', text)
    assert events and int(events.group(1)) >= 4, text  # a start and a clean for each of the two jobs


def test_ssh_connections_cut_while_jobs_are_submitted_and_followed_duplicate_and_lose_nothing(
        operator, ssh_cluster, netns_hosts, netns_slurm) -> None:
    """The login host's sshd drops every connection of the operator every 0.3 s for 8 s (its session processes
    killed) while three TrainJobs are submitted and followed over SSH: commands cut mid-way are sent again
    where that is safe, a cut sbatch is looked up before it is sent again, and each TrainJob ends Complete
    with exactly one Slurm job."""
    import threading

    login = netns_hosts.host("node-0")
    ns = operator.namespace()
    stop = threading.Event()
    cuts = []

    def cut() -> None:
        while not stop.is_set():
            done = subprocess.run(["pkill", "-KILL", "-P", str(login.sshd_pid)], check=False)
            cuts.append(done.returncode == 0)
            stop.wait(0.3)

    cutter = threading.Thread(target=cut)
    cutter.start()
    try:
        created = [operator.apply(ns, f"cut-{i}", ssh_cluster, ["sleep", "4"]) for i in range(3)]
        time.sleep(8)
    finally:
        stop.set()
        cutter.join()
    assert any(cuts)  # connections were there to cut
    for index, item in enumerate(created):
        done = operator.until(ns, f"cut-{index}", is_true("Complete"), timeout=180)
        assert not is_true("Failed")(done)
        listing = netns_slurm.run("squeue", "--noheader", "--states=all", "--Format=JobID:20,Comment:400").stdout
        jobs = [line.split()[0] for line in listing.splitlines() if item["metadata"]["uid"] in line]
        assert jobs == [done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]], (jobs, listing)


def test_metrics_count_submissions_cycles_errors_and_states(operator) -> None:
    import re
    import urllib.request

    ns = operator.namespace()
    operator.apply(ns, "counted", "slurm", ["true"])
    operator.until(ns, "counted", is_true("Complete"))
    operator.apply(ns, "refused", "no-such-cluster", ["true"])
    operator.until(ns, "refused", is_true("Failed"))
    text = urllib.request.urlopen(f"http://{operator.metrics}/metrics", timeout=10).read().decode()

    def value(pattern: str) -> float:
        found = re.search(rf"^{pattern} (\S+)$", text, re.M)
        assert found, (pattern, text)
        return float(found.group(1))

    assert value(r'hpcbridge_submissions_total\{cluster="slurm",result="submitted"\}') >= 1
    # a name no BridgeCluster has is not a label of its own (tenants could make series without end)
    assert value(r'hpcbridge_submissions_total\{cluster="other",result="refused"\}') >= 1 and \
        "no-such-cluster" not in text
    assert value(r'hpcbridge_sync_cycle_seconds_count\{cluster="slurm"\}') >= 1
    assert value(r'hpcbridge_sync_cycle_seconds_bucket\{cluster="slurm",le="\+Inf"\}') == \
        value(r'hpcbridge_sync_cycle_seconds_count\{cluster="slurm"\}')
    assert value(r'hpcbridge_trainjobs\{cluster="slurm",state="Succeeded"\}') >= 1
    assert "# TYPE hpcbridge_backend_errors_total counter" in text


def test_the_overlay_for_upstream_trainer_installs_the_operator_without_trainers_crds() -> None:
    base = {(d["kind"], d["metadata"]["name"]) for d in kustomize_build(ROOT / "manifests" / "operator")}
    overlay = {(d["kind"], d["metadata"]["name"]) for d in kustomize_build(ROOT / "manifests" / "upstream-trainer")}
    trainer_crds = {("CustomResourceDefinition", f"{plural}.trainer.kubeflow.org")
                    for plural in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")}
    assert trainer_crds <= base and not trainer_crds & overlay
    assert overlay == base - trainer_crds
    assert ("CustomResourceDefinition", "bridgeclusters.hpcbridge.io") in overlay
    assert ("Deployment", "hpcbridge-operator") in overlay


SDK_VERSION = "0.5.0"

SDK_SCRIPT = """
import json, os, sys, time
from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import CustomTrainer, TrainerClient
from kubernetes import client, config


def train_fn():
    import os, socket
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} on node {os.environ['GROUP_RANK']} of host "
          f"{socket.gethostname()}", flush=True)


def train_until_cancelled():
    import os, time
    print(f"waiting on node {os.environ['GROUP_RANK']}", flush=True)
    time.sleep(3600)


namespace, kubeconfig, path, runtime_name = sys.argv[1:5]
sdk = TrainerClient(backend_config=KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig))
runtime = sdk.get_runtime(runtime_name)
env = {"PATH": path}  # where the Slurm nodes' torchrun is, as a user names their cluster's environment
name = sdk.train(runtime=runtime, trainer=CustomTrainer(func=train_fn, num_nodes=2, env=env))
job = sdk.wait_for_job_status(name, status={"Complete"}, timeout=240, polling_interval=1)
logs = {step: list(sdk.get_job_logs(name, step=step)) for step in ("node-0", "node-1")}

# a job that runs until it is deleted: its node 1's lines followed as they come, then delete_job
running = sdk.train(runtime=runtime, trainer=CustomTrainer(func=train_until_cancelled, num_nodes=2, env=env))
deadline = time.monotonic() + 240
while sorted(step.status for step in sdk.get_job(running).steps if step.name.startswith("node")) != ["Running"] * 2:
    assert time.monotonic() < deadline, sdk.get_job(running)
    time.sleep(1)
followed = next(line for line in sdk.get_job_logs(running, step="node-1", follow=True) if "waiting" in line)
config.load_kube_config(kubeconfig)
job_id = client.CustomObjectsApi().get_namespaced_custom_object(
    "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", running)["metadata"]["annotations"][
    "operator.hpcbridge.io/job-id"]
sdk.delete_job(running)
print(json.dumps({"name": name, "status": job.status, "logs": logs, "followed": followed, "job_id": job_id}))
"""


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    """A venv with Kubeflow's SDK (PyPI kubeflow), apart from ours: it pins an older kubernetes client."""
    from tests.harness.kube import cache_root

    venv = cache_root() / f"kubeflow-sdk-{SDK_VERSION}"
    python = venv / "bin" / "python"
    if not (venv / "ready").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"kubeflow=={SDK_VERSION}"], check=True,
                       timeout=600)
        (venv / "ready").write_text(SDK_VERSION)
    return python


def test_the_kubeflow_sdk_trains_a_function_on_two_slurm_nodes_reads_each_nodes_logs_and_deletes(
        operator, sdk_python, tmp_path) -> None:
    """Kubeflow's Python SDK (TrainerClient) as a data scientist uses it, with a torch runtime whose cluster is
    Slurm: train(CustomTrainer(func=..., num_nodes=2)) (the SDK's own function packing and torchrun), its
    wait_for_job_status, get_job_logs of each node (the SDK's own node steps), get_job_logs(follow=True) of a
    running job and delete_job, which cancels it on Slurm. The SDK cannot set managedBy: the operator takes
    TrainJobs without one whose runtime names a BridgeCluster (with upstream Trainer, its CRD defaults managedBy
    to its own)."""
    def slurm_output(job_id: str) -> str:
        shown = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True, text=True,
                               env=operator.env).stdout
        out = next((Path(f[7:]) for f in shown.split() if f.startswith("StdOut=")), None)
        return out.read_text()[-4000:] if out is not None and out.is_file() else shown

    _sdk_flow(operator, sdk_python, tmp_path, "slurm", operator.slurm_state, ("COMPLETED", "CANCELLED"),
              slurm_output)
    # a TrainJob without managedBy whose runtime names no BridgeCluster is not hpc-bridge's: left alone
    ns = operator.namespace()
    operator.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": "not-ours"},
        "spec": {"runtimeRef": {"name": "plain-slurm"}, "trainer": {"command": ["true"]}}})
    time.sleep(3)
    untouched = operator.get(ns, "not-ours")
    assert not (untouched.get("status") or {}).get("conditions") and not untouched["metadata"].get("finalizers")


def test_the_kubeflow_sdk_trains_a_function_on_two_flux_nodes_reads_each_nodes_logs_and_deletes(
        operator, sdk_python, flux_uri, tmp_path) -> None:
    """The same SDK flow with a torch runtime whose cluster is Flux (where flux-core is on PATH): delete_job
    cancels the Flux job."""
    flux = flux_bridge_cluster(operator, flux_uri)

    def flux_state(job_id: str) -> str:
        return subprocess.run([flux, "jobs", "-n", "-o", "{result}", job_id], capture_output=True, text=True,
                              env={**os.environ, "FLUX_URI": flux_uri}, timeout=30).stdout.strip()

    def flux_output(job_id: str) -> str:
        shown = subprocess.run([flux, "job", "attach", job_id], capture_output=True, text=True,
                               env={**os.environ, "FLUX_URI": flux_uri}, timeout=30)
        return (shown.stdout + shown.stderr)[-4000:]

    # the job's PATH as its user names it: where this cluster's flux is, as /usr/bin is on a site's nodes
    _sdk_flow(operator, sdk_python, tmp_path, "flux", flux_state, ("COMPLETED", "CANCELED"), flux_output,
              os.path.dirname(flux))


def _sdk_flow(operator, sdk_python: Path, tmp_path: Path, cluster: str, backend_state,
              states: tuple[str, str], backend_output, tools: str = "/usr/bin") -> None:
    """SDK_SCRIPT against a torch runtime bound to *cluster*; *backend_state* of a job id is the backend's
    word for it, *states* those of a finished and of a cancelled job, *backend_output* its output (printed
    when the SDK fails); *tools* the folder of the backend's commands on its nodes."""
    import json
    import re

    from kubernetes.client.exceptions import ApiException

    runtime_name = f"torch-on-{cluster}"
    try:
        operator.custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": runtime_name, "annotations": {"hpcbridge.io/cluster": cluster},
                         "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {
                "replicatedJobs": [{"name": "node", "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": {"spec": {"containers": [
                        {"name": "node", "image": "hpcbridge.test/plain"}]}}}}}]}}}})
    except ApiException as exc:
        assert exc.status == 409, exc.body
    ns = operator.namespace()
    script = tmp_path / "sdk_train.py"  # the SDK packs a function from its source file
    script.write_text(SDK_SCRIPT)
    # the project's venv (torch and its torchrun) before a tenant job's own PATH, where the cluster's commands are
    path = ":".join(dict.fromkeys([str(Path(sys.executable).parent), tools, "/usr/local/bin", "/usr/bin", "/bin"]))
    ran = subprocess.run([str(sdk_python), str(script), ns, str(operator.cluster.kube.kubeconfig), path,
                          runtime_name], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    if ran.returncode != 0:  # what went wrong: each TrainJob's conditions and its backend job's output
        for item in operator.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs")["items"]:
            job_id = item["metadata"].get("annotations", {}).get("operator.hpcbridge.io/job-id", "")
            print(item["metadata"]["name"], (item.get("status") or {}).get("conditions"),
                  backend_output(job_id) if job_id else "")
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["status"] == "Complete"
    done = operator.get(ns, result["name"])
    assert "managedBy" not in done["spec"]
    assert done["metadata"]["annotations"]["operator.hpcbridge.io/job-cluster"] == cluster
    assert backend_state(done["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]) == states[0]
    # the SDK reads each node's logs from its pod: the stand-in pods on the cluster's virtual node, whose
    # kubelet API (the operator's) serves that node's lines of the backend job's output
    ranks = []
    for node in (0, 1):  # a line an item, as the SDK splits them; a worker's rank tag where a node runs several
        said = [match.groups() for line in result["logs"][f"node-{node}"] if (match := re.fullmatch(
            r"(?:\[rank-\d+\] )?rank (\d+) of (\d+) on node (\d+) of host \S+", line))]
        assert said and all(int(on) == node for _, _, on in said), result["logs"]
        ranks += [(int(rank), int(world)) for rank, world, _ in said]
    assert sorted(ranks) == [(rank, len(ranks)) for rank in range(len(ranks))], result["logs"]
    assert "waiting on node 1" in result["followed"], result["followed"]
    # delete_job: the TrainJob goes, and its backend job is cancelled
    deadline = time.monotonic() + 120
    while backend_state(result["job_id"]) != states[1]:
        assert time.monotonic() < deadline, backend_state(result["job_id"])
        time.sleep(0.5)


def test_migrate_to_moves_a_running_trainjob_from_slurm_to_pods_where_it_resumes(operator, tmp_path) -> None:
    """``hpcbridge.io/migrate-to: pods`` on a TrainJob running on Slurm, as a user annotates it: the Slurm job
    gets SIGUSR1 (``hpcbridge.io/migrate-signal``) and checkpoints, the TrainJob runs on as a JobSet whose pods
    resume from the shared checkpoint directory (a hostPath, the same path as on the Slurm nodes), every step
    runs once, and the TrainJob's status and annotations say where it ran and why it moved."""
    import json
    import shutil

    from kubernetes.client.exceptions import ApiException

    ns = operator.namespace()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shutil.copy(ROOT / "examples" / "checkpointed_train.py", shared / "train.py")
    from tests.integration.engines import movable_runtime

    runtime = movable_runtime(shared, "hpcbridge.test/plain", kind="TrainingRuntime")
    try:
        operator.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "trainingruntimes", runtime)
    except ApiException as exc:
        assert exc.status == 409, exc.body
    checkpoint = shared / "checkpoint"
    operator.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
        "metadata": {"name": "mover", "annotations": {"hpcbridge.io/cluster": "slurm",
                                                      "hpcbridge.io/workdir": str(shared),
                                                      "hpcbridge.io/checkpoint-dir": str(checkpoint)}},
        "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "movable", "kind": "TrainingRuntime"},
                 "trainer": {"command": ["python3", str(shared / "train.py"), str(checkpoint), "40", "0.5"]}}})
    first = operator.until(ns, "mover", is_true("Running"))["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
    log = checkpoint / "steps.log"
    for _ in range(1200):  # a few steps on Slurm first (a bound on the wait, not a timing assertion)
        if log.exists() and len(log.read_text().splitlines()) >= 4:
            break
        time.sleep(0.1)
    operator.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", "mover", {"metadata": {
        "annotations": {"hpcbridge.io/migrate-to": "pods", "hpcbridge.io/migrate-signal": "USR1@60",
                        "hpcbridge.io/migrate-reason": "slurm drains"}}})
    done = operator.until(ns, "mover", lambda o: is_true("Complete")(o) and o["metadata"]["annotations"].get(
        "operator.hpcbridge.io/job-cluster") == "pods", timeout=300)
    annotations = done["metadata"]["annotations"]
    assert annotations["operator.hpcbridge.io/job-id"] == f"{ns}/mover"
    assert annotations["hpcbridge.io/cluster"] == "pods" and "hpcbridge.io/migrate-to" not in annotations
    (move,) = json.loads(annotations["operator.hpcbridge.io/history"])
    assert move["from"] == {"cluster": "slurm", "job": first, "state": "Succeeded", "exitCode": 0}
    assert (move["signal"], move["reason"], move["to"]["cluster"]) == ("SIGUSR1", "slurm drains", "pods")
    migrated = condition(done, "Migrated")
    assert migrated["status"] == "True" and migrated["message"] == (
        f"moved from slurm job {first} (Succeeded after SIGUSR1) to pods job {ns}/mover: slurm drains")
    assert ("Normal", "Migrated", migrated["message"]) in operator.events(ns, "mover")  # kubectl describe's
    steps = [line.split() for line in log.read_text().splitlines()]
    assert [int(number) for number, _ in steps] == list(range(1, 41))  # every step, once
    assert steps[0][1] == "slurm" and steps[-1][1] == "pods"
    assert operator.slurm_state(first) == "COMPLETED"
