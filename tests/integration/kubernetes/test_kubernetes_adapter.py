"""The Kubernetes adapter against the real control plane: JobSets scheduled on kwok nodes by the real
scheduler, run by the real Job and JobSet controllers; CRDs applied to the real API server."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bridge.adapters.base import JobState
from bridge.adapters.kubernetes import GROUP, PLURAL, VERSION, KubernetesAdapter
from bridge.api import load_documents
from bridge.api.catalog import builtin_runtimes
from bridge.api.cluster import BridgeCluster
from bridge.plan import find_runtime, resolve
from tests import builders
from tests.harness import layer
from tests.harness.kube import FAIL_LABEL
from tests.harness.polling import poll_until as wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]
ROOT = Path(__file__).resolve().parents[3]


def cluster_for(kube_cluster, namespace: str, pod_policy: dict | None = None) -> BridgeCluster:
    kube = {"kubeconfig": str(kube_cluster.kubeconfig), "namespace": namespace}
    if pod_policy is not None:
        kube["podPolicy"] = pod_policy
    return builders.cluster("kubernetes", "k8s", kubernetes=kube)


def trainjob(name: str, runtime: str, namespace: str, pod_labels: dict | None = None, backoff_limit=None,
             **trainer):
    spec = {}
    if pod_labels:
        job_spec = {"template": {"metadata": {"labels": pod_labels}}}
        if backoff_limit is not None:
            job_spec["backoffLimit"] = backoff_limit
        spec["runtimePatches"] = [{"manager": "hpcbridge.io/tests", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": job_spec}}]}}}}]
    return builders.trainjob(name, runtime=runtime, namespace=namespace,
                             trainer={"command": ["python3", "train.py"], **trainer}, **spec)


def submit(adapter, job):
    plan = resolve(job, find_runtime(job, builtin_runtimes()), adapter.cluster)
    return plan, layer.submit(adapter, plan)


def pods(kube_api, namespace: str, jobset: str):
    from kubernetes import client

    return client.CoreV1Api(kube_api).list_namespaced_pod(
        namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset}").items


def test_torch_two_nodes_scheduled_and_completed(kube_cluster, kube_api, namespace) -> None:
    adapter = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    plan, ref = submit(adapter, trainjob("torch-two", "torch-distributed", namespace, numNodes=2,
                                         env=[{"name": "EPOCHS", "value": "3"}],
                                         resourcesPerNode={"requests": {"cpu": "2", "memory": "4Gi",
                                                                        "nvidia.com/gpu": "1"}}))
    status = wait_for(adapter, ref, lambda s: s.state.finished)
    assert status.state == JobState.SUCCEEDED, status
    created = pods(kube_api, namespace, "torch-two")
    assert len(created) == 2
    for pod in created:
        assert pod.spec.node_name in kube_cluster.node_names
        node = next(c for c in pod.spec.containers if c.name == "node")
        assert node.resources.requests == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
        env = {e.name: e.value for e in node.env}
        assert env["EPOCHS"] == "3" and env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "auto"  # GPUs, no numProcPerNode: as Kubeflow
        assert env["PET_MASTER_ADDR"] == "torch-two-node-0-0.torch-two"
        assert pod.metadata.labels["hpcbridge.io/uid"] == plan.uid


def test_failing_pod_fails_the_trainjob_with_a_reason(kube_cluster, namespace) -> None:
    adapter = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    _, ref = submit(adapter, trainjob("torch-fails", "torch-distributed", namespace, pod_labels={FAIL_LABEL: "true"},
                                      backoff_limit=0))  # no retries with growing back-off
    status = wait_for(adapter, ref, lambda s: s.state.finished)
    assert status.state == JobState.FAILED
    assert status.reason  # the JobSet controller's reason, e.g. FailedJobs


def test_mpi_four_nodes_two_slots(kube_cluster, kube_api, namespace) -> None:
    from kubernetes import client

    from bridge.adapters.kubernetes.render import ssh_secret_name

    adapter = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    plan, ref = submit(adapter, trainjob("mpi-four", "mpi-distributed", namespace, numNodes=4, numProcPerNode=2))
    core = client.CoreV1Api(kube_api)
    hostfile = core.read_namespaced_config_map("mpi-four-mpi-hostfile", namespace).data["hostfile"]
    assert hostfile.splitlines() == [f"mpi-four-node-0-{i}.mpi-four slots=2" for i in range(3)] + \
        ["mpi-four-launcher-0-0.mpi-four slots=2"]
    # named after a digest of the TrainJob's uid, which another tenant cannot know
    secret = core.read_namespaced_secret(ssh_secret_name("mpi-four", plan.uid), namespace)
    assert secret.type == "kubernetes.io/ssh-auth" and secret.immutable
    assert base64.b64decode(secret.data["ssh-privatekey"]).startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert base64.b64decode(secret.data["ssh-publickey"]).startswith(b"ssh-ed25519 ")
    jobset = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                             "mpi-four")
    jobs = {job["name"]: job for job in jobset["spec"]["replicatedJobs"]}
    assert list(jobs) == ["node", "launcher"]
    assert jobs["node"]["template"]["spec"]["parallelism"] == 3
    assert jobs["launcher"]["dependsOn"] == [{"name": "node", "status": "Ready"}]
    launcher = jobs["launcher"]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "mpi-hostfile", "mountPath": "/etc/mpi"} in launcher["volumeMounts"]
    assert wait_for(adapter, ref, lambda s: s.state.finished).state == JobState.SUCCEEDED


def test_unsatisfiable_gpu_request_is_pending_with_the_schedulers_reason(kube_cluster, namespace) -> None:
    adapter = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    _, ref = submit(adapter, trainjob("too-many-gpus", "torch-distributed", namespace,
                                      resourcesPerNode={"requests": {"nvidia.com/gpu": "100"}}))
    status = wait_for(adapter, ref, lambda s: s.reason == "Unschedulable")
    assert status.state == JobState.PENDING
    assert "Insufficient nvidia.com/gpu" in (status.message or "")
    adapter.cancel(ref)


def test_pods_refused_by_a_quota_leave_it_pending_with_the_controllers_reason(kube_cluster, kube_api,
                                                                          namespace) -> None:
    """No pod can be created (a ResourceQuota allows none): the Jobs exist, the scheduler never sees a pod, and
    the status says why instead of a bare Pending."""
    from kubernetes import client

    client.CoreV1Api(kube_api).create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}})
    adapter = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    _, ref = submit(adapter, trainjob("over-quota", "torch-distributed", namespace))
    status = wait_for(adapter, ref, lambda s: s.reason is not None)
    assert (status.state, status.reason) == (JobState.PENDING, "FailedCreate"), status
    assert "exceeded quota: no-pods" in (status.message or ""), status.message
    adapter.cancel(ref)


def test_submit_twice_is_one_jobset_cancel_stops_and_remove_deletes_everything(kube_cluster, kube_api, namespace) -> None:
    from kubernetes import client

    adapter = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    job = trainjob("once", "mpi-distributed", namespace, numNodes=2,
                   pod_labels={"pod-complete.stage.kwok.x-k8s.io/never": "true"})
    _, first = submit(adapter, job)
    _, second = submit(adapter, job)
    assert first == second
    custom = client.CustomObjectsApi(kube_api)
    assert len(custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]) == 1
    adapter.cancel(first)
    # the JobSet stays as the job's record, Cancelled; its pods go
    assert wait_for(adapter, first, lambda s: s.state.finished).state == JobState.CANCELLED
    poll_pods = lambda: [p for p in pods(kube_api, namespace, "once") if not p.metadata.deletion_timestamp]  # noqa: E731
    deadline = time.monotonic() + 60
    while poll_pods() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not poll_pods()
    adapter.remove(first)
    core = client.CoreV1Api(kube_api)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = (custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
                core.list_namespaced_secret(namespace, label_selector="hpcbridge.io/uid").items,
                core.list_namespaced_config_map(namespace, label_selector="hpcbridge.io/uid").items,
                [p for p in pods(kube_api, namespace, "once") if not p.metadata.deletion_timestamp])
        if not any(left):
            break
        time.sleep(0.2)
    assert not any(left), left


def test_cli_submit_status_list_cancel(kube_cluster, namespace, tmp_path) -> None:
    config = tmp_path / "clusters.yaml"
    config.write_text(yaml.safe_dump(cluster_for(kube_cluster, namespace).to_wire()))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                   "metadata": {"name": "from-cli", "namespace": namespace},
                                   "spec": {"runtimeRef": {"name": "torch-distributed"},
                                            "trainer": {"numNodes": 2, "command": ["python3", "t.py"]}}}))
    env = {**os.environ, "HPCBRIDGE_CONFIG": str(config)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, env=env,
                              timeout=180)

    submitted = cli("submit", str(job), "--cluster", "k8s", "--wait")
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == f"{namespace}/from-cli"
    status = yaml.safe_load(cli("status", "from-cli", "--cluster", "k8s", "-o", "yaml").stdout)
    assert status[0]["state"] == "Succeeded"
    assert [row["job"] for row in yaml.safe_load(cli("list", "--cluster", "k8s", "-o", "yaml").stdout)] == \
        [f"{namespace}/from-cli"]
    assert cli("cancel", "from-cli", "--cluster", "k8s").returncode == 0
    assert "ok: Kubernetes v1.36" in cli("clusters", "check").stdout


def test_crds_accept_examples_and_reject_invalid_objects(kube_cluster, kube_api, namespace) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api(kube_api)
    for path in sorted((ROOT / "manifests" / "crds").glob("*_*.yaml")):  # not kustomization.yaml
        crd = yaml.safe_load(path.read_text())
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as exc:
            assert exc.status == 409, exc.body  # created by an earlier test in this run
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = {c.metadata.name for c in ext.list_custom_resource_definition().items
                 if any(cond.type == "Established" and cond.status == "True" for cond in (c.status.conditions or []))}
        if {"trainjobs.trainer.kubeflow.org", "clustertrainingruntimes.trainer.kubeflow.org"} <= names:
            break
        time.sleep(0.2)
    custom = client.CustomObjectsApi(kube_api)
    runtimes = list(yaml.safe_load_all((ROOT / "bridge" / "api" / "builtin_runtimes.yaml").read_text()))
    for runtime in runtimes:
        try:
            custom.create_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime)
        except ApiException as exc:
            assert exc.status == 409, exc.body
    for example in ("mpi-allreduce.yaml", "torch-ddp.yaml"):
        body = yaml.safe_load((ROOT / "examples" / example).read_text())
        body["metadata"]["namespace"] = namespace
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", body)
    bad = yaml.safe_load((ROOT / "examples" / "mpi-allreduce.yaml").read_text())
    bad["metadata"]["name"] = "Bad_Name"
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", bad)
    assert "RFC 1035 DNS label" in info.value.body
    bad = yaml.safe_load((ROOT / "examples" / "mpi-allreduce.yaml").read_text())
    bad["metadata"]["name"] = "negative"
    bad["spec"]["trainer"]["numNodes"] = -1
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", bad)
    assert "spec.trainer.numNodes" in info.value.body and "greater than or equal to 0" in info.value.body


def test_logs_are_what_the_api_server_gives(kube_cluster, namespace) -> None:
    """kwok runs no kubelet, so the API server cannot fetch container logs: the adapter says so with a typed
    error instead of a traceback (on a real cluster the same call returns each node pod's log)."""
    from bridge.errors import BridgeError

    adapter = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    _, ref = submit(adapter, trainjob("logs", "torch-distributed", namespace))
    wait_for(adapter, ref, lambda s: s.state.finished)
    with pytest.raises(BridgeError) as info:
        list(adapter.logs(ref))
    assert "read log" in str(info.value)


def _with_uid(job, uid: str):
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": uid})})


def test_a_shared_namespace_keeps_same_named_trainjobs_of_two_namespaces_apart(kube_cluster, kube_api,
                                                                                namespace) -> None:
    """Two tenants the admin maps to one namespace (the operator's overlay of the cluster for each): each JobSet
    is created where and as `render` shows it, same-named ones do not collide, and a name another TrainJob
    holds is refused without its uid."""
    import uuid

    from kubernetes import client

    from bridge import tenancy
    from bridge.api.cluster import Tenant
    from bridge.errors import BackendRejected

    def adapter_of(tenant_namespace: str) -> tuple[KubernetesAdapter, Tenant]:
        tenant = Tenant.model_validate({"name": tenant_namespace, "namespaces": [tenant_namespace],
                                        "targetNamespace": namespace})
        return KubernetesAdapter(tenancy.as_tenant(cluster_for(kube_cluster, namespace), tenant)), tenant

    custom, core = client.CustomObjectsApi(kube_api), client.CoreV1Api(kube_api)
    names, uids = [], []
    for tenant_namespace in ("team-a", "team-b"):
        adapter, tenant = adapter_of(tenant_namespace)
        job = _with_uid(trainjob("same", "mpi-distributed", tenant_namespace, numNodes=2,
                                 pod_labels={"pod-complete.stage.kwok.x-k8s.io/never": "true"}), str(uuid.uuid4()))
        plan = resolve(job, find_runtime(job, builtin_runtimes()), adapter.cluster, tenant)
        artifact = adapter.render(plan)
        shown = list(yaml.safe_load_all(artifact.main))
        assert {obj["metadata"]["namespace"] for obj in shown} == {namespace}
        ref = adapter.submit(artifact)
        jobset = shown[-1]["metadata"]["name"]
        assert ref.job_id == f"{namespace}/{jobset}"
        created = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, jobset)
        assert created["metadata"]["labels"]["hpcbridge.io/uid"] == plan.uid
        assert core.read_namespaced_secret(shown[0]["metadata"]["name"], namespace).metadata.labels[
            "hpcbridge.io/uid"] == plan.uid
        names.append(jobset)
        uids.append(plan.uid)
    assert len(set(names)) == 2
    # team-a's TrainJob deleted and made again (a new uid) while its JobSet is still there
    again = _with_uid(trainjob("same", "torch-distributed", "team-a"), str(uuid.uuid4()))
    adapter, tenant = adapter_of("team-a")
    with pytest.raises(BackendRejected) as refused:
        adapter.submit(adapter.render(resolve(again, find_runtime(again, builtin_runtimes()), adapter.cluster,
                                              tenant)))
    assert "belongs to another TrainJob" in str(refused.value) and uids[0] not in str(refused.value)


def test_a_pod_field_the_policy_forbids_creates_nothing(kube_cluster, kube_api, namespace) -> None:
    from kubernetes import client

    from bridge.errors import InvalidSpec

    job = load_documents(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "on-host", "namespace": namespace},
        "spec": {"runtimeRef": {"name": "mpi-distributed"}, "trainer": {"command": ["python3", "train.py"]},
                 "runtimePatches": [{"manager": "example.io/tenant", "trainingRuntimeSpec": {"template": {"spec": {
                     "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
                         "hostNetwork": True}}}}}]}}}}]}}))[0]
    relaxed = KubernetesAdapter(cluster_for(kube_cluster, namespace, {"hostNetwork": True}))
    artifact = relaxed.render(resolve(job, find_runtime(job, builtin_runtimes()), relaxed.cluster))
    strict = KubernetesAdapter(cluster_for(kube_cluster, namespace))
    with pytest.raises(InvalidSpec) as refused:
        strict.submit(artifact)
    assert refused.value.field.endswith("replicatedJobs[node].template.spec.template.spec.hostNetwork")
    selector = f"hpcbridge.io/uid={artifact.plan.uid}"
    assert not client.CustomObjectsApi(kube_api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=selector)["items"]
    assert not client.CoreV1Api(kube_api).list_namespaced_config_map(namespace, label_selector=selector).items
