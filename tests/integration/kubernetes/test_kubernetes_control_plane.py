"""The test control plane is real: API server, kwok nodes, scheduler, Job and JobSet controllers, webhooks.

Each test uses its own namespace; pods run on kwok nodes (no containers): Running, then Succeeded for pods
of a Job, or Failed for pods carrying the kwok failure label (tests/harness/kube.py, FAIL_LABEL).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from tests.harness.kube import (
    COMPLETE_DELAY_ANNOTATION,
    FAIL_EXIT_CODE_ANNOTATION,
    FAIL_LABEL,
    GPU_RESOURCE,
    KubeCluster,
)

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

IMAGE = "registry.invalid/hpcbridge/noop:1"  # never pulled: kwok runs no containers
T = TypeVar("T")


def wait_for(fetch: Callable[[], T], done: Callable[[T], bool], timeout: float = 60.0) -> T:
    """Poll ``fetch`` until ``done`` holds; the deadline only bounds a hung test, the caller asserts."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def condition(obj: Any, kind: str) -> Any:
    """The status condition of type ``kind`` of a typed object, or None."""
    return next((c for c in (obj.status.conditions or []) if c.type == kind), None)


def dict_condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind`` of a custom object (a dict), or None."""
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def container(name: str = "main", resources: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["true"], "resources": resources or {}}


def job_body(name: str, completions: int, labels: dict[str, str] | None = None, backoff: int = 0,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completionMode": "Indexed", "completions": completions, "parallelism": completions,
                     "backoffLimit": backoff,
                     "template": {"metadata": {"labels": labels or {}, "annotations": annotations or {}},
                                  "spec": {"restartPolicy": "Never", "containers": [container()]}}}}


@pytest.fixture(scope="module")
def core(kube_api):
    from kubernetes import client

    return client.CoreV1Api(kube_api)


@pytest.fixture(scope="module")
def batch(kube_api):
    from kubernetes import client

    return client.BatchV1Api(kube_api)


@pytest.fixture(scope="module")
def custom(kube_api):
    from kubernetes import client

    return client.CustomObjectsApi(kube_api)


def test_api_server_answers(kube_cluster: KubeCluster, kube_api) -> None:
    from kubernetes import client

    version = client.VersionApi(kube_api).get_code()
    assert version.git_version == "v1.36.3"
    assert (version.major, version.minor) == ("1", "36")
    assert kube_cluster.api_url.startswith("https://127.0.0.1:")
    groups = {g.name for g in client.ApisApi(kube_api).get_api_versions().groups}
    assert {"batch", "apps", "jobset.x-k8s.io", "admissionregistration.k8s.io"} <= groups
    assert kube_cluster.kubeconfig.is_file()


def test_kwok_nodes_ready_with_advertised_resources(kube_cluster: KubeCluster, core) -> None:
    nodes = core.list_node(label_selector="type=kwok").items
    assert sorted(n.metadata.name for n in nodes) == sorted(kube_cluster.node_names)
    assert len(nodes) == 4
    for node in nodes:
        assert condition(node, "Ready").status == "True"
        assert node.status.allocatable["cpu"] == "8"
        assert node.status.allocatable["memory"] == "32Gi"
        assert node.status.allocatable[GPU_RESOURCE] == "4"
        assert node.status.capacity[GPU_RESOURCE] == "4"
        assert not node.spec.unschedulable


def test_indexed_job_completes_on_kwok_nodes(kube_cluster: KubeCluster, namespace: str, core, batch) -> None:
    batch.create_namespaced_job(namespace, job_body("indexed", completions=2))
    job = wait_for(lambda: batch.read_namespaced_job("indexed", namespace),
                   lambda j: condition(j, "Complete") is not None or condition(j, "Failed") is not None)
    assert condition(job, "Complete") is not None and condition(job, "Complete").status == "True", job.status
    assert job.status.succeeded == 2

    pods = core.list_namespaced_pod(namespace, label_selector="job-name=indexed").items
    assert len(pods) == 2
    assert sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    for pod in pods:
        assert pod.status.phase == "Succeeded"
        assert pod.spec.node_name in kube_cluster.node_names
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    scheduled = core.list_namespaced_event(namespace, field_selector="reason=Scheduled").items
    assert {e.involved_object.name for e in scheduled} == {p.metadata.name for p in pods}
    assert {e.reporting_component or e.source.component for e in scheduled} == {"default-scheduler"}


def test_jobset_completes_through_the_real_controller(kube_cluster: KubeCluster, namespace: str, core,
                                                       custom) -> None:
    body = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "trainer"},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {
                "parallelism": 1, "completions": 1, "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [container()]}}}}}]}}
    created = custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", body)
    # defaulted by the mutating webhook (mjobset.kb.io): the CRD itself has no default for it
    assert created["spec"]["successPolicy"]["operator"] == "All"

    jobset = wait_for(lambda: custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace,
                                                                  "jobsets", "trainer"),
                      lambda js: bool(dict_condition(js, "Completed") or dict_condition(js, "Failed")))
    done = dict_condition(jobset, "Completed")
    assert done is not None and done["status"] == "True", jobset.get("status")

    pods = core.list_namespaced_pod(namespace, label_selector="jobset.sigs.k8s.io/jobset-name=trainer").items
    assert len(pods) == 2
    assert {p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] for p in pods} == {"workers"}
    assert {p.status.phase for p in pods} == {"Succeeded"}
    assert all(p.spec.node_name in kube_cluster.node_names for p in pods)


def test_jobset_validating_webhook_rejects_invalid_spec(namespace: str, custom) -> None:
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "bad"},
            "spec": {"successPolicy": {"operator": "All", "targetReplicatedJobs": ["nope"]},
                     "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                         "template": {"spec": {"restartPolicy": "Never", "containers": [container()]}}}}}]}}
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", body)
    assert err.value.status in (400, 422)
    assert "vjobset.kb.io" in err.value.body and "nope" in err.value.body


def test_pod_asking_for_100_gpus_stays_pending_unschedulable(namespace: str, core) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "greedy"},
           "spec": {"restartPolicy": "Never",
                    "containers": [container(resources={"limits": {GPU_RESOURCE: "100"}})]}}
    core.create_namespaced_pod(namespace, pod)
    got = wait_for(lambda: core.read_namespaced_pod("greedy", namespace),
                   lambda p: condition(p, "PodScheduled") is not None)
    scheduled = condition(got, "PodScheduled")
    assert got.status.phase == "Pending"
    assert scheduled.status == "False" and scheduled.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in scheduled.message
    events = wait_for(lambda: core.list_namespaced_event(namespace, field_selector="reason=FailedScheduling").items,
                      lambda items: bool(items))
    assert events and events[0].involved_object.name == "greedy"
    time.sleep(2)
    assert core.read_namespaced_pod("greedy", namespace).status.phase == "Pending"


def test_pod_with_failure_label_ends_failed(namespace: str, core) -> None:
    def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels, "annotations": {FAIL_EXIT_CODE_ANNOTATION: "3"}},
                "spec": {"restartPolicy": "Never", "containers": [container()]}}

    core.create_namespaced_pod(namespace, pod("doomed", {FAIL_LABEL: "true"}))
    core.create_namespaced_pod(namespace, pod("server", {}))
    failed = wait_for(lambda: core.read_namespaced_pod("doomed", namespace),
                      lambda p: p.status.phase in ("Failed", "Succeeded"))
    assert failed.status.phase == "Failed"
    assert failed.status.container_statuses[0].state.terminated.exit_code == 3
    # without a Job owner and without the label, a pod stays Running (a long-running server)
    running = wait_for(lambda: core.read_namespaced_pod("server", namespace), lambda p: p.status.phase != "Pending")
    assert running.status.phase == "Running"


def test_job_with_failing_pods_is_marked_failed(namespace: str, core, batch) -> None:
    batch.create_namespaced_job(namespace, job_body("crashy", completions=1, labels={FAIL_LABEL: "true"}))
    job = wait_for(lambda: batch.read_namespaced_job("crashy", namespace),
                   lambda j: condition(j, "Complete") is not None or condition(j, "Failed") is not None)
    failed = condition(job, "Failed")
    assert failed is not None and failed.status == "True", job.status
    assert failed.reason == "BackoffLimitExceeded"
    pods = core.list_namespaced_pod(namespace, label_selector="job-name=crashy").items
    assert pods and all(p.status.phase == "Failed" for p in pods)


def test_complete_delay_annotation_keeps_a_job_pod_running(namespace: str, core, batch) -> None:
    batch.create_namespaced_job(namespace, job_body("slow", completions=1,
                                                    annotations={COMPLETE_DELAY_ANNOTATION: "4s"}))
    pod = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector="job-name=slow").items,
                   lambda pods: bool(pods) and pods[0].status.phase != "Pending")[0]
    assert pod.status.phase == "Running"
    started = time.monotonic()
    job = wait_for(lambda: batch.read_namespaced_job("slow", namespace), lambda j: condition(j, "Complete") is not None)
    assert condition(job, "Complete").status == "True"
    assert time.monotonic() - started > 2  # the default (pod_run_ms) is 0.5 s
