"""The pod policy of a kubernetes BridgeCluster, the namespace its JobSets are created in, and the names of the
objects it creates: what `render` prints is what `submit` creates, and a tenant's pod template gets only what
the cluster admin allows (issue 36, "Pods")."""

from __future__ import annotations

import pytest
import yaml

from bridge import tenancy
from bridge.adapters.base import Identity
from bridge.adapters.kubernetes import KubernetesAdapter
from bridge.annotations import UID_LABEL
from bridge.api import load_documents
from bridge.api.catalog import builtin_runtimes
from bridge.api.cluster import BridgeCluster, Tenant
from bridge.errors import BackendRejected, InvalidSpec
from bridge.plan import find_runtime, resolve
from tests import builders
from tests.unit.test_render_golden import CASES


def cluster(namespace: str | None = None, **policy) -> BridgeCluster:
    kube: dict = {}
    if namespace:
        kube["namespace"] = namespace
    if policy:
        kube["podPolicy"] = policy
    return builders.cluster("kubernetes", "k8s", kubernetes=kube)


def trainjob(pod: dict | None = None, *, name: str = "train", namespace: str = "team-a",
             runtime: str = "torch-distributed", job: str = "node", uid: str | None = None, **trainer):
    spec: dict = {}
    if pod is not None:
        spec["runtimePatches"] = [{"manager": "example.io/tenant", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": job, "template": {"spec": {"template": {"spec": pod}}}}]}}}}]
    return builders.trainjob(name, runtime=runtime, namespace=namespace, uid=uid or None,
                             trainer={"command": ["python3", "train.py"], **trainer}, **spec)


def as_tenant(on: BridgeCluster, namespace: str) -> tuple[BridgeCluster, Tenant | None]:
    """A cluster with a namespace of its own (``shared``) as the operator uses it: for the tenant of the
    TrainJob's *namespace*, whose JobSets the admin maps there (a namespace several tenants share)."""
    target = on.spec.kubernetes.namespace if on.spec.kubernetes else None
    if not target:
        return on, None
    tenant = Tenant.model_validate({"name": f"t-{namespace}", "namespaces": [namespace], "targetNamespace": target})
    return tenancy.as_tenant(on, tenant), tenant


def plan_of(job, on: BridgeCluster, runtimes=None):
    on, tenant = as_tenant(on, job.namespace)
    return resolve(job, find_runtime(job, runtimes or builtin_runtimes()), on, tenant)


def render(job, on: BridgeCluster, runtimes=None) -> list[dict]:
    """The objects `render` prints for *job* on cluster *on* (what `submit` creates)."""
    return list(yaml.safe_load_all(KubernetesAdapter(as_tenant(on, job.namespace)[0]).render(
        plan_of(job, on, runtimes)).main))


def initializer_job(namespace: str = "team-a", patch: dict | None = None, uri: str | None = None,
                    empty_dir: bool = False):
    """tests/cases/initializers.yaml's TrainJob (an initializer secretRef) and its runtime, as from *namespace*;
    with *empty_dir*, the runtime's ``initializer`` volume an emptyDir instead of a claim."""
    text = (CASES / "initializers.yaml").read_text(encoding="utf-8")
    if empty_dir:
        text = text.replace("persistentVolumeClaim:\n                        claimName: initializer", "emptyDir: {}")
        assert "claimName" not in text
    job, runtime = load_documents(text)
    spec = job.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    if patch is not None:
        spec["runtimePatches"] = [{"manager": "example.io/tenant", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "dataset-initializer", "template": {"spec": {"template": {
                "spec": patch}}}}]}}}}]
    if uri is not None:
        spec["initializer"]["dataset"]["storageUri"] = uri
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": job.name, "namespace": namespace, "uid": job.metadata.uid}, "spec": spec}
    return load_documents(yaml.safe_dump(doc))[0], [runtime]


def node(containers_patch: dict) -> dict:
    return {"containers": [{"name": "node", **containers_patch}]}


#: (pod template patch of the trainer's replicated job, the field refused, the value, the policy that allows it)
FORBIDDEN = [
    (node({"securityContext": {"privileged": True}}), "containers[node].securityContext.privileged", "True",
     {"privileged": True}),
    (node({"securityContext": {"allowPrivilegeEscalation": True}}),
     "containers[node].securityContext.allowPrivilegeEscalation", "True", {"allowPrivilegeEscalation": True}),
    (node({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
     "containers[node].securityContext.capabilities.add", "'SYS_ADMIN'", {"capabilities": ["CAP_SYS_ADMIN"]}),
    (node({"securityContext": {"runAsUser": 0}}), "containers[node].securityContext.runAsUser", "0",
     {"runAsRoot": True}),
    (node({"securityContext": {"procMount": "Unmasked"}}), "containers[node].securityContext.procMount",
     "'Unmasked'", {"privileged": True}),
    (node({"ports": [{"containerPort": 8080, "hostPort": 8080}]}), "containers[node].ports[8080].hostPort", "8080",
     {"hostNetwork": True}),
    ({"securityContext": {"runAsNonRoot": False}}, "spec.securityContext.runAsNonRoot", "False",
     {"runAsRoot": True}),
    ({"hostNetwork": True}, "spec.hostNetwork", "True", {"hostNetwork": True}),
    ({"hostPID": True}, "spec.hostPID", "True", {"hostPID": True}),
    ({"hostIPC": True}, "spec.hostIPC", "True", {"hostIPC": True}),
    ({"serviceAccountName": "operator-admin"}, "spec.serviceAccountName", "'operator-admin'",
     {"serviceAccountNames": ["operator-admin"]}),
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "spec.volumes[root].hostPath", "{'path': '/'}",
     {"volumes": ["hostPath"]}),
    ({"volumes": [{"name": "home", "nfs": {"server": "filer", "path": "/home"}}]}, "spec.volumes[home].nfs",
     "'server': 'filer'", {"volumes": ["other"]}),
    ({"initContainers": [{"name": "setup", "image": "busybox", "securityContext": {"privileged": True}}]},
     "initContainers[setup].securityContext.privileged", "True", {"privileged": True}),
]


@pytest.mark.parametrize(("patch", "field", "value", "allowing"), FORBIDDEN,
                         ids=[case[1].split("spec.")[-1] for case in FORBIDDEN])
def test_the_default_policy_refuses_a_pod_field_naming_it_and_a_policy_allows_it(patch, field, value,
                                                                                  allowing) -> None:
    job = trainjob(patch)
    with pytest.raises(InvalidSpec) as refused:
        render(job, cluster())
    message = str(refused.value)
    assert "replicatedJobs[node].template.spec.template.spec" in refused.value.field
    assert refused.value.field.endswith(field), refused.value.field
    assert value in message and "spec.kubernetes.podPolicy" in message, message
    assert "\n" not in message
    render(job, cluster(**allowing))  # the cluster admin allows it: rendered


def test_a_relaxed_policy_allows_only_what_it_names() -> None:
    privileged = trainjob(node({"securityContext": {"privileged": True, "capabilities": {"add": ["NET_ADMIN"]}}}))
    with pytest.raises(InvalidSpec, match=r"capabilities\.add.*NET_ADMIN"):
        render(privileged, cluster(privileged=True, capabilities=["IPC_LOCK"]))
    render(privileged, cluster(privileged=True, capabilities=["*"]))
    with pytest.raises(InvalidSpec, match="serviceAccountName"):
        render(trainjob({"serviceAccountName": "other"}), cluster(serviceAccountNames=["trainer"]))
    render(trainjob({"serviceAccountName": "default"}), cluster())


def test_an_initializer_jobs_pods_pass_the_policy_too() -> None:
    job, runtimes = initializer_job(patch={"hostNetwork": True})
    with pytest.raises(InvalidSpec) as refused:
        render(job, cluster(), runtimes)
    assert refused.value.field.endswith("replicatedJobs[dataset-initializer].template.spec.template.spec.hostNetwork")


#: references to objects of the namespace the pods run in: (patch, TrainJob trainer fields, the field refused)
REFERENCES = [
    ({"volumes": [{"name": "keys", "secret": {"secretName": "team-b-keys"}}]}, {}, "spec.volumes[keys].secret"),
    ({"volumes": [{"name": "cfg", "configMap": {"name": "team-b-config"}}]}, {}, "spec.volumes[cfg].configMap"),
    ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "team-b-data"}}]}, {},
     "spec.volumes[data].persistentVolumeClaim"),
    ({"volumes": [{"name": "all", "projected": {"sources": [{"secret": {"name": "team-b-keys"}}]}}]}, {},
     "spec.volumes[all].projected"),
    ({"imagePullSecrets": [{"name": "team-b-registry"}]}, {}, "spec.imagePullSecrets[team-b-registry]"),
    (node({"envFrom": [{"secretRef": {"name": "team-b-keys"}}]}), {}, "containers[node].envFrom[0].secretRef.name"),
    (None, {"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "team-b-keys", "key": "token"}}}]},
     "spec.trainer.env[TOKEN].valueFrom.secretKeyRef.name"),
    (None, {"env": [{"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "team-b-config", "key": "c"}}}]},
     "spec.trainer.env[CFG].valueFrom.configMapKeyRef.name"),
]
ALL_NAMESPACED = {"volumes": ["secret", "configMap", "persistentVolumeClaim", "projected"]}


@pytest.mark.parametrize(("patch", "trainer", "field"), REFERENCES, ids=[case[2] for case in REFERENCES])
def test_the_namespaces_objects_only_in_the_trainjobs_own_namespace_unless_the_policy_allows(patch, trainer,
                                                                                           field) -> None:
    job = trainjob(patch, **trainer)
    render(job, cluster())  # its own namespace's: the tenant's own
    render(job, cluster("team-a"))  # the cluster's namespace is the TrainJob's own
    with pytest.raises(InvalidSpec) as refused:
        render(job, cluster("shared"))
    assert refused.value.field.endswith(field), refused.value.field
    assert "namespace shared" in str(refused.value) and "podPolicy.volumes" in str(refused.value)
    render(job, cluster("shared", **ALL_NAMESPACED))


def test_the_cli_reads_its_own_namespaces_secrets_and_claims_where_its_user_sends_its_jobs() -> None:
    """No tenant: the namespace the CLI's user configured is that user's own, so its Secrets and claims pass."""
    job, runtimes = initializer_job(namespace="default")
    on = cluster("mine")
    objects = list(yaml.safe_load_all(KubernetesAdapter(on).render(
        resolve(job, find_runtime(job, runtimes), on)).main))
    assert {obj["metadata"]["namespace"] for obj in objects} == {"mine"}


def test_an_initializers_secret_and_claim_only_in_the_trainjobs_own_namespace() -> None:
    job, runtimes = initializer_job()
    with pytest.raises(InvalidSpec) as refused:
        render(job, cluster("shared", volumes=["persistentVolumeClaim"]), runtimes)
    assert refused.value.field == "spec.initializer.dataset.secretRef.name"
    assert refused.value.value == "s3-credentials"
    # the runtime's own claim is one claim of the shared namespace, every tenant's: refused there too
    with pytest.raises(InvalidSpec) as refused:
        render(job, cluster("shared", volumes=["secret"]), runtimes)
    assert refused.value.field == ("runtime torch-with-initializers with spec.runtimePatches: "
                                   "replicatedJobs[dataset-initializer].template.spec.template.spec"
                                   ".volumes[initializer].persistentVolumeClaim")
    claim, runtimes = initializer_job(uri="pvc://team-b-data/alpaca", empty_dir=True)
    with pytest.raises(InvalidSpec) as refused:
        render(claim, cluster("shared", volumes=["secret"]), runtimes)
    assert (refused.value.field, refused.value.value) == ("spec.initializer.dataset.storageUri",
                                                          "pvc://team-b-data/alpaca")
    render(claim, cluster(), runtimes)
    render(claim, cluster("shared", volumes=["secret", "persistentVolumeClaim"]), runtimes)


def test_what_hpc_bridge_generates_passes_in_a_shared_namespace() -> None:
    """The MPI SSH key Secret and hostfile ConfigMap are hpc-bridge's, not the tenant's."""
    objects = render(trainjob(runtime="mpi-distributed", numNodes=2), cluster("shared"))
    assert [o["kind"] for o in objects] == ["Secret", "ConfigMap", "JobSet"]


def test_render_shows_the_namespace_and_names_submit_creates() -> None:
    job = trainjob(runtime="mpi-distributed", numNodes=2)
    own = render(job, cluster())
    assert {o["metadata"]["namespace"] for o in own} == {"team-a"} and own[-1]["metadata"]["name"] == "train"
    shared = render(job, cluster("shared"))
    assert {o["metadata"]["namespace"] for o in shared} == {"shared"}
    name = shared[-1]["metadata"]["name"]
    assert name.startswith("train-") and len(name) <= 63
    # every name inside follows the JobSet's: hostfile, hostnames, Secret and ConfigMap
    secret, configmap, jobset = shared
    assert configmap["metadata"]["name"] == f"{name}-mpi-hostfile"
    assert all(line.startswith(f"{name}-") and f".{name} " in line for line in configmap["data"]["hostfile"].splitlines())
    pods = [j["template"]["spec"]["template"]["spec"] for j in jobset["spec"]["replicatedJobs"]]
    assert {v["secret"]["secretName"] for p in pods for v in p.get("volumes", []) if "secret" in v} == \
        {secret["metadata"]["name"]}
    # the TrainJob's own identity stays on it
    assert jobset["metadata"]["labels"]["trainer.kubeflow.org/trainjob-name"] == "train"


def test_same_named_trainjobs_of_two_namespaces_sharing_one_get_two_names() -> None:
    a = render(trainjob(namespace="team-a"), cluster("shared"))[-1]["metadata"]["name"]
    b = render(trainjob(namespace="team-b"), cluster("shared"))[-1]["metadata"]["name"]
    assert a != b
    assert render(trainjob(namespace="team-a"), cluster("shared"))[-1]["metadata"]["name"] == a  # pure
    long = "x" * 63
    assert len(render(trainjob(name=long), cluster("shared"))[-1]["metadata"]["name"]) == 63


def test_the_adapter_refers_to_a_trainjobs_jobset_where_it_runs() -> None:
    job = trainjob(namespace="team-a")
    jobset = render(job, cluster("shared"))[-1]["metadata"]["name"]
    ref = KubernetesAdapter(as_tenant(cluster("shared"), "team-a")[0]).ref("train", Identity("u", "train", "team-a"))
    assert ref.job_id == f"shared/{jobset}"
    assert KubernetesAdapter(cluster()).ref("train", Identity("u", "train", "team-a")).job_id == "team-a/train"


def test_the_cli_keeps_the_trainjobs_name_in_the_namespace_its_user_configured() -> None:
    """One user, no tenants: the CLI's `spec.kubernetes.namespace` is where that user's jobs go, by their names."""
    job = trainjob(namespace="default")
    on = cluster("mine")
    objects = list(yaml.safe_load_all(KubernetesAdapter(on).render(
        resolve(job, find_runtime(job, builtin_runtimes()), on)).main))
    assert objects[-1]["metadata"] == {**objects[-1]["metadata"], "name": "train", "namespace": "mine"}
    assert KubernetesAdapter(on).ref("train", Identity("u", "train", "default")).job_id == "mine/train"


def test_the_ssh_secret_name_cannot_be_guessed_from_the_trainjobs_name() -> None:
    first = "6f1c3b4e-0000-4000-8000-000000000001"
    second = "6f1c3b4e-0000-4000-8000-000000000002"
    name = render(trainjob(runtime="mpi-distributed", uid=first), cluster())[0]["metadata"]["name"]
    assert name != "train-mpi-ssh-auth" and first not in name
    assert render(trainjob(runtime="mpi-distributed", uid=first), cluster())[0]["metadata"]["name"] == name
    assert render(trainjob(runtime="mpi-distributed", uid=second), cluster())[0]["metadata"]["name"] != name


def test_submit_checks_the_policy_before_it_creates_anything() -> None:
    job = trainjob({"hostNetwork": True})
    artifact = KubernetesAdapter(cluster(hostNetwork=True)).render(plan_of(job, cluster(hostNetwork=True)))

    class NoApi:  # anything reaching the API server is a failure of this test
        def __getattr__(self, name):
            raise AssertionError(f"the API was used: {name}")

    with pytest.raises(InvalidSpec, match="hostNetwork"):
        KubernetesAdapter(cluster(), api_client=NoApi()).submit(artifact)


def test_a_name_taken_by_another_trainjob_is_refused_without_its_uid() -> None:
    from kubernetes.client.exceptions import ApiException

    other = "0b7f9d2e-0000-4000-8000-00000000beef"

    def create(namespace, body):
        raise ApiException(status=409, reason="AlreadyExists")

    def read(name, namespace):
        return {"metadata": {"name": name, "labels": {UID_LABEL: other}}}

    body = {"kind": "JobSet", "metadata": {"name": "train", "labels": {UID_LABEL: "mine"}}}
    with pytest.raises(BackendRejected) as refused:
        KubernetesAdapter(as_tenant(cluster("shared"), "team-a")[0])._create(create, "shared", body, "create jobset", read)
    assert other not in str(refused.value) and "another TrainJob" in str(refused.value)
