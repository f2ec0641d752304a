"""Queues and gangs on real engines: a real Kueue (v0.17, built from its Go module) on the real-node control
plane, the operator as its own process, real Slurm and real pods.

Kueue decides *when* (quota, priorities), hpc-bridge *where*: a TrainJob labelled with a LocalQueue is held
suspended by Kueue until admitted, then the operator runs it on the cluster its flavor names.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.integration.kubernetes.test_operator import (
    GROUP,
    TEST_TENANTS,
    VERSION,
    Operator,
    _apply_kustomization,
    is_true,
    plain_runtime,
)

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[3]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_ID = "operator.hpcbridge.io/job-id"
JOB_CLUSTER = "operator.hpcbridge.io/job-cluster"
#: a runtime Kueue can charge: Kueue's TrainJob integration computes the pods' requests with Trainer's v2.2 code
RUNTIME = plain_runtime("queued")


class Queues:
    """Kueue's objects for one test: flavors, a ClusterQueue and a LocalQueue in a fresh namespace."""

    def __init__(self, operator: Operator) -> None:
        self.op = operator
        self.made: list[tuple[str, str]] = []

    def flavor(self, name: str, node_labels: dict[str, str] | None = None) -> str:
        body = {"apiVersion": "/".join(KUEUE), "kind": "ResourceFlavor", "metadata": {"name": name},
                "spec": {"nodeLabels": node_labels} if node_labels else {}}
        self.op.custom.create_cluster_custom_object(*KUEUE, "resourceflavors", body)
        self.made.append(("resourceflavors", name))
        return name

    def cluster_queue(self, name: str, flavors: list[tuple[str, int]], preemption: bool = False) -> str:
        spec: dict = {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory"],
            "flavors": [{"name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpus},
                                                       {"name": "memory", "nominalQuota": "64Gi"}]}
                        for flavor, cpus in flavors]}]}
        if preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        self.op.custom.create_cluster_custom_object(*KUEUE, "clusterqueues", {
            "apiVersion": "/".join(KUEUE), "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec})
        self.made.append(("clusterqueues", name))
        return name

    def local_queue(self, namespace: str, name: str, cluster_queue: str) -> str:
        self.op.custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", {
            "apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": name},
            "spec": {"clusterQueue": cluster_queue}})
        return name

    def delete(self) -> None:
        for plural, name in reversed(self.made):
            try:
                self.op.custom.delete_cluster_custom_object(*KUEUE, plural, name)
            except Exception:  # noqa: BLE001 - best effort: the next test uses names of its own
                pass


@pytest.fixture(scope="module")
def queued(real_kube, slurm_cluster, tmp_path_factory):
    """The operator (as its ServiceAccount) with Kueue on the same control plane; clusters `slurm` and `pods`."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    base = tmp_path_factory.mktemp("kueue")
    admin = real_kube.api_client()
    _apply_kustomization(admin, ROOT / "manifests" / "operator")
    started = time.monotonic()
    real_kube.kube.start_kueue()
    print(f"kueue started in {time.monotonic() - started:.1f}s")
    op = Operator(real_kube, slurm_cluster, base)
    clusters = {
        "slurm": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                  "tenants": TEST_TENANTS,
                  "defaults": {"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]}},
        "pods": {"type": "kubernetes", "tenants": TEST_TENANTS, "kubernetes": {
            "kubeconfig": str(real_kube.kube.kubeconfig), "imagePullPolicy": "Never",
            "images": {"hpcbridge.test/plain": real_kube.images["node"].ref}}},
    }
    op.define_clusters(clusters)
    try:
        client.CustomObjectsApi(admin).create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", RUNTIME)
    except ApiException as exc:
        assert exc.status == 409, exc.body
    op.start()
    try:
        yield op
    finally:
        op.close()
        real_kube.kube.stop_kueue()
        admin.close()


def submit(op: Operator, namespace: str, name: str, queue: str, cpus: int, command: list[str],
           cluster: str | None = None, priority: str | None = None) -> dict:
    labels = {QUEUE_LABEL: queue, **({"kueue.x-k8s.io/priority-class": priority} if priority else {})}
    metadata: dict = {"name": name, "labels": labels}
    if cluster:
        metadata["annotations"] = {"hpcbridge.io/cluster": cluster}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": metadata,
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "queued"},
                     "trainer": {"command": command, "resourcesPerNode": {"requests": {"cpu": str(cpus)}}}}}
    return op.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", body)


def slurm_states(op: Operator, uid: str) -> list[str]:
    return [op.slurm_state(job) for job in op.slurm_jobs(uid)]


def test_quota_holds_the_third_trainjob_with_no_slurm_job_until_one_finishes(queued) -> None:
    """ClusterQueue of 4 CPUs, three TrainJobs of 2 CPUs bound for Slurm: two Slurm jobs run, the third TrainJob
    (whichever Kueue admits last) stays suspended and has no Slurm job at all; it runs when one finishes; each
    ends with exactly one."""
    op, queues = queued, Queues(queued)
    ns = op.namespace()
    suffix = uuid.uuid4().hex[:6]
    names = ("first", "second", "third")
    try:
        cq = queues.cluster_queue(f"cq-{suffix}", [(queues.flavor(f"any-{suffix}"), 4)])
        lq = queues.local_queue(ns, "lq", cq)
        uids = {}
        # each runs until the test lets it end (its marker file), so "two run" holds while it looks
        release = op.base / f"release-{suffix}"
        for name in names:
            command = ["sh", "-c", f'while [ ! -e "{release}" ]; do sleep 0.2; done']
            uids[name] = submit(op, ns, name, lq, 2, command, cluster="slurm")["metadata"]["uid"]
        deadline = time.monotonic() + 180
        while len(running := [n for n in names if is_true("Running")(op.get(ns, n))]) < 2:
            assert time.monotonic() < deadline, [op.get(ns, n).get("status") for n in names]
            time.sleep(0.5)
        time.sleep(3)  # what Kueue and the operator would do wrong has had time to happen
        assert len(running) == 2, running
        (held,) = [n for n in names if n not in running]
        # while two run, the third is held: suspended, no Slurm job, and Kueue says it lacks quota
        assert op.get(ns, held)["spec"].get("suspend") is True
        assert op.slurm_jobs(uids[held]) == []
        workloads = op.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
        pending = [w for w in workloads if w["metadata"]["labels"].get("kueue.x-k8s.io/job-uid") == uids[held]]
        assert pending and any(c["type"] == "QuotaReserved" and c["status"] == "False"
                               for c in pending[0]["status"]["conditions"]), pending
        release.touch()
        for name in names:
            done = op.until(ns, name, is_true("Complete"), timeout=180)
            assert done["metadata"]["annotations"][JOB_CLUSTER] == "slurm"
        for name in names:
            assert slurm_states(op, uids[name]) == ["COMPLETED"], name  # exactly one Slurm job each
    finally:
        queues.delete()


def test_a_higher_priority_trainjob_preempts_a_lower_one_that_then_runs_again(queued) -> None:
    """The lower's Slurm job is stopped (cancelled by the operator when Kueue suspends it), its quota goes to
    the higher, and once that finishes the lower runs again and completes: two Slurm jobs for the lower (one
    cancelled, one completed), one for the higher, never both of the lower's at once."""
    op, queues = queued, Queues(queued)
    ns = op.namespace()
    suffix = uuid.uuid4().hex[:6]
    try:
        for name, value in ((f"low-{suffix}", 10), (f"high-{suffix}", 1000)):
            op.custom.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", {
                "apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass", "metadata": {"name": name},
                "value": value})
            queues.made.append(("workloadpriorityclasses", name))
        cq = queues.cluster_queue(f"cq-{suffix}", [(queues.flavor(f"any-{suffix}"), 2)], preemption=True)
        lq = queues.local_queue(ns, "lq", cq)
        # the lower's first run would take 10 minutes; run again after the preemption, it ends at once (a job
        # that resumes from the checkpoint its first run left)
        marker = op.base / f"low-{suffix}.started"
        low = submit(op, ns, "low", lq, 2, ["sh", "-c", f'[ -e "{marker}" ] && exit 0; touch "{marker}"; sleep 600'],
                     cluster="slurm", priority=f"low-{suffix}")
        first = op.until(ns, "low", is_true("Running"), timeout=120)["metadata"]["annotations"][JOB_ID]
        # Running is Slurm's word that the job has its nodes, not that its command got as far as the marker: under
        # load the preemption below could cancel it first, and then its second run would be the 10-minute one
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline, op.slurm_state(first)
            time.sleep(0.2)
        high = submit(op, ns, "high", lq, 2, ["sleep", "3"], cluster="slurm", priority=f"high-{suffix}")
        suspended = op.until(ns, "low", is_true("Suspended"), timeout=120)
        assert suspended["spec"]["suspend"] is True
        deadline = time.monotonic() + 60
        while op.slurm_state(first) != "CANCELLED":
            assert time.monotonic() < deadline, op.slurm_state(first)
            time.sleep(0.5)
        op.until(ns, "high", is_true("Complete"), timeout=180)
        assert slurm_states(op, high["metadata"]["uid"]) == ["COMPLETED"]
        # readmitted once the higher one released the quota: the lower runs again, as a new Slurm job, and ends
        done = op.until(ns, "low", is_true("Complete"), timeout=180)
        second = done["metadata"]["annotations"][JOB_ID]
        assert second != first
        assert sorted(op.slurm_jobs(low["metadata"]["uid"]), key=int) == [first, second]
        assert op.slurm_state(first) == "CANCELLED" and op.slurm_state(second) == "COMPLETED"
    finally:
        for name in ("low", "high"):
            try:
                op.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", name)
            except Exception:  # noqa: BLE001
                pass
        queues.delete()


def test_two_flavors_send_the_next_job_to_the_cluster_that_still_has_quota(queued) -> None:
    """A ClusterQueue with two flavors, one per cluster (nodeLabels hpcbridge.io/cluster): the first TrainJob
    takes the Slurm flavor's quota, so Kueue admits the second on the Kubernetes flavor, and the operator runs
    it there as a JobSet whose pods really run."""
    op, queues = queued, Queues(queued)
    ns = op.namespace()
    suffix = uuid.uuid4().hex[:6]
    try:
        on_slurm = queues.flavor(f"slurm-{suffix}", {"hpcbridge.io/cluster": "slurm"})
        on_pods = queues.flavor(f"pods-{suffix}", {"hpcbridge.io/cluster": "pods"})
        cq = queues.cluster_queue(f"cq-{suffix}", [(on_slurm, 2), (on_pods, 2)])
        lq = queues.local_queue(ns, "lq", cq)
        submit(op, ns, "one", lq, 2, ["sh", "-c", "echo one; sleep 10"])
        op.until(ns, "one", lambda o: JOB_ID in o["metadata"].get("annotations", {}), timeout=120)
        submit(op, ns, "two", lq, 2, ["sh", "-c", "echo two; sleep 1"])
        two = op.until(ns, "two", is_true("Complete"), timeout=240)
        one = op.until(ns, "one", is_true("Complete"), timeout=240)
        assert one["metadata"]["annotations"][JOB_CLUSTER] == "slurm"
        assert two["metadata"]["annotations"][JOB_CLUSTER] == "pods", two["metadata"]["annotations"]
        assert two["metadata"]["annotations"][JOB_ID].startswith(f"{ns}/")  # a JobSet in the TrainJob's namespace
        # admitted once, as the TrainJob: the JobSet made for it is not queued (nor charged) a second time
        jobset = op.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "two")
        assert QUEUE_LABEL not in jobset["metadata"].get("labels", {})
        workloads = op.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
        assert sorted(w["metadata"]["name"].rsplit("-", 1)[0] for w in workloads) == ["trainjob-one", "trainjob-two"]
    finally:
        queues.delete()


def test_a_queued_jobset_waits_suspended_runs_on_admission_and_status_names_the_queue(queued, tmp_path) -> None:
    """The JobSet path: `hpcbridge submit --queue` labels the JobSet, Kueue holds it suspended while the quota
    is taken, `hpcbridge status` says why (from the Workload), and it runs once admitted."""
    op, queues = queued, Queues(queued)
    ns = op.namespace()
    suffix = uuid.uuid4().hex[:6]
    config = tmp_path / "clusters.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                      "metadata": {"name": "pods"}, "spec": {"type": "kubernetes", "kubernetes": {
                                          "kubeconfig": str(op.cluster.kube.kubeconfig), "namespace": ns,
                                          "imagePullPolicy": "Never",
                                          "images": {"hpcbridge.test/plain": op.cluster.images["node"].ref}}}}))
    env = {**op.env, "HPCBRIDGE_CONFIG": str(config), "KUBECONFIG": str(op.cluster.kube.kubeconfig)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, env=env,
                              timeout=300, cwd=ROOT)

    def job(name: str, seconds: int) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all([RUNTIME, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": "queued"}, "trainer": {
                "command": ["sh", "-c", f"echo {name} ran; sleep {seconds}"],
                "resourcesPerNode": {"requests": {"cpu": "1"}}}}}]))
        return path

    try:
        cq = queues.cluster_queue(f"cq-{suffix}", [(queues.flavor(f"any-{suffix}"), 1)])
        queues.local_queue(ns, "lq", cq)
        refused = cli("submit", str(job("nowhere", 1)), "--cluster", "local", "--queue", "lq")
        assert refused.returncode == 2 and "--queue" in refused.stderr, refused.stderr
        holder = cli("submit", str(job("holder", 15)), "--cluster", "pods", "--queue", "lq")
        assert holder.returncode == 0, holder.stderr
        waiter = cli("submit", str(job("waiter", 1)), "--cluster", "pods", "--queue", "lq")
        assert waiter.returncode == 0, waiter.stderr
        jobset = op.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "waiter")
        assert jobset["metadata"]["labels"][QUEUE_LABEL] == "lq"
        deadline = time.monotonic() + 60
        while True:
            shown = cli("status", waiter.stdout.strip(), "--cluster", "pods", "-o", "yaml")
            status = (yaml.safe_load(shown.stdout) or [{}])[0]
            if "waiting for quota in ClusterQueue" in str(status.get("message")):
                break
            assert time.monotonic() < deadline, (shown.stdout, shown.stderr)
            time.sleep(1)
        assert status["state"] == "Pending" and status["reason"] == "Queued"
        assert f"ClusterQueue {cq}" in status["message"] and "insufficient unused quota for cpu" in status["message"]
        assert op.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets",
                                                      "waiter")["spec"]["suspend"] is True
        waited = cli("status", waiter.stdout.strip(), "--cluster", "pods")
        assert "waiting for quota in ClusterQueue" in waited.stdout, waited.stdout
        # the holder ends, the waiter is admitted and runs
        done = subprocess.run([sys.executable, "-m", "bridge", "logs", "--follow", waiter.stdout.strip(), "--cluster",
                               "pods"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
        assert "waiter ran" in done.stdout, done.stdout + done.stderr
        final = yaml.safe_load(cli("status", waiter.stdout.strip(), "--cluster", "pods", "-o", "yaml").stdout)[0]
        deadline = time.monotonic() + 120
        while final["state"] != "Succeeded":
            assert time.monotonic() < deadline, final
            time.sleep(1)
            final = yaml.safe_load(cli("status", waiter.stdout.strip(), "--cluster", "pods", "-o", "yaml").stdout)[0]
    finally:
        queues.delete()


def scheduler_plugins_crd() -> dict:
    """scheduler-plugins' PodGroup CRD, from the Go module Kubeflow Trainer builds with (module cache)."""
    from tests.harness.kube import BUILD_ROOT, _go, go_env

    text = (BUILD_ROOT / "trainer" / "go.mod").read_text()
    version = re.search(r"sigs\.k8s\.io/scheduler-plugins (\S+)", text).group(1)
    found = subprocess.run([_go(), "mod", "download", "-json", f"sigs.k8s.io/scheduler-plugins@{version}"],
                           cwd=BUILD_ROOT / "trainer", env=go_env(), capture_output=True, text=True, check=True)
    path = Path(json.loads(found.stdout)["Dir"]) / "config" / "crd" / "bases" / "scheduling.x-k8s.io_podgroups.yaml"
    return yaml.safe_load(path.read_text())


def test_a_gang_gets_its_podgroup_and_a_cluster_without_that_scheduler_refuses_it(queued, tmp_path) -> None:
    """A coscheduling runtime on a cluster that declares coscheduling: the PodGroup (minMember = every pod) is
    created before the JobSet and owned by it; declared nowhere, the same TrainJob is refused with exit 2 and
    nothing is created."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    op = queued
    ns = op.namespace()
    try:
        client.ApiextensionsV1Api(op.api).create_custom_resource_definition(scheduler_plugins_crd())
    except ApiException as exc:
        assert exc.status in (403, 409), exc.body  # 403: the operator's kubeconfig; use the admin's below
    admin = op.cluster.api_client()
    try:
        client.ApiextensionsV1Api(admin).create_custom_resource_definition(scheduler_plugins_crd())
    except ApiException as exc:
        assert exc.status == 409, exc.body
    gang_runtime = json.loads(json.dumps(RUNTIME))
    gang_runtime["metadata"]["name"] = "gang"
    gang_runtime["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 30}}
    path = tmp_path / "gang.yaml"
    path.write_text(yaml.safe_dump_all([gang_runtime, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": "gang"},
        "spec": {"runtimeRef": {"name": "gang"}, "trainer": {"numNodes": 2, "command": ["true"],
                                                              "resourcesPerNode": {"requests": {"cpu": "1"}}}}}]))
    cluster = {"kubeconfig": str(op.cluster.kube.kubeconfig), "namespace": ns, "imagePullPolicy": "Never",
               "images": {"hpcbridge.test/plain": op.cluster.images["node"].ref}}
    config = tmp_path / "clusters.yaml"
    config.write_text(yaml.safe_dump_all([
        {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "gangs"},
         "spec": {"type": "kubernetes", "kubernetes": {**cluster, "gangScheduler": "coscheduling"}}},
        {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "no-gangs"},
         "spec": {"type": "kubernetes", "kubernetes": cluster}}]))
    env = {**op.env, "HPCBRIDGE_CONFIG": str(config)}
    custom = client.CustomObjectsApi(admin)
    try:
        refused = subprocess.run([sys.executable, "-m", "bridge", "submit", str(path), "--cluster", "no-gangs"],
                                 capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert "spec.podGroupPolicy.coscheduling" in refused.stderr and "'no-gangs'" in refused.stderr
        assert custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets")["items"] == []
        assert custom.list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups")["items"] == []
        ran = subprocess.run([sys.executable, "-m", "bridge", "submit", str(path), "--cluster", "gangs", "--wait"],
                             capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
        assert ran.returncode == 0, ran.stderr
        group = custom.get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", "gang")
        jobset = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "gang")
        assert group["spec"]["minMember"] == 2 and group["spec"]["scheduleTimeoutSeconds"] == 30
        assert group["spec"]["minResources"] == {"cpu": "2"}
        assert [o["uid"] for o in group["metadata"]["ownerReferences"]] == [jobset["metadata"]["uid"]]
        pod_labels = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["scheduling.x-k8s.io/pod-group"] == "gang"
    finally:
        admin.close()
