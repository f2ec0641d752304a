"""What a plan does with the Kubernetes-only parts of a TrainJob and its runtime: honoured (a gang policy, a
Kueue queue, the JobSet's metadata), refused, or one note each for the user."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.annotations import QUEUE_LABEL
from bridge.api.cluster import BridgeCluster
from bridge.api.k8s import Container, JobSetSpec, ReplicatedJob
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import TrainJob
from bridge.errors import InvalidSpec
from bridge.plan.model import LaunchPlan, PodGroupPlan
from bridge.plan.traits import traits_of


def pod_group_plan(runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster) -> PodGroupPlan | None:
    """A runtime's podGroupPolicy, honoured or refused, never dropped. On Kubernetes the cluster must run that
    gang scheduler (spec.kubernetes.gangScheduler), or the pods would be scheduled one by one and a job could
    hold half its nodes forever; on Slurm and Flux one allocation starts every node together, which is what the
    policy asks for."""
    policy = runtime.spec.pod_group_policy
    if policy is None:
        return None
    kind = "coscheduling" if policy.coscheduling is not None else "volcano"
    if traits_of(cluster).runs_pods:
        has = cluster.spec.kubernetes.gang_scheduler if cluster.spec.kubernetes else None
        if has != kind:
            raise InvalidSpec(f"runtime {runtime.name}: spec.podGroupPolicy.{kind}", kind,
                              f"cluster {cluster.name!r} has {'no gang scheduler' if has is None else has} "
                              f"(spec.kubernetes.gangScheduler): its pods would be scheduled one by one")
    conn = cluster.spec.kubernetes
    if policy.coscheduling is not None:  # kind == "coscheduling"
        timeout = policy.coscheduling.schedule_timeout_seconds
        return PodGroupPlan(kind, 60 if timeout is None else timeout,
                            scheduler_name=conn.scheduler_name if conn else None)
    assert policy.volcano is not None  # PodGroupPolicy holds exactly one of the two
    return PodGroupPlan(kind, network_topology=policy.volcano.network_topology,
                        scheduler_name=(conn.scheduler_name if conn else None) or "volcano")


def gang_note(plan: LaunchPlan) -> str | None:
    """What an HPC artifact says of the runtime's gang policy: one allocation is already a gang."""
    if plan.pod_group is None:
        return None
    return (f"runtime {plan.runtime_name}'s podGroupPolicy.{plan.pod_group.kind} is met by the allocation "
            f"itself: all {plan.nodes} nodes start together or not at all")


def queue_name(trainjob: TrainJob, cluster: BridgeCluster) -> str | None:
    """The Kueue LocalQueue: the TrainJob's queue label, else the Kubernetes cluster's spec.kubernetes.queue."""
    labelled = (trainjob.metadata.labels or {}).get(QUEUE_LABEL)
    if labelled:
        return labelled
    return cluster.spec.kubernetes.queue if traits_of(cluster).runs_pods and cluster.spec.kubernetes else None


#: what a non-Kubernetes backend reads of the trainer's container; every other container field is Kubernetes'
_CONTAINER_READ = {"name", "image", "command", "args", "env", "resources", "workingDir", "ports"}
#: pod spec fields that only say how Kubernetes runs the pod, with nothing to honour elsewhere
_POD_NEUTRAL = {"containers", "restartPolicy"}


def unhonoured_notes(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, template: JobSetSpec,
                trainer_job: ReplicatedJob, container: Container, image: str | None,
                cluster: BridgeCluster) -> tuple[str, ...]:
    """One note per Kubernetes-only field the TrainJob sets (its runtime patches, image, initializer) that
    *cluster* cannot honour; refused instead when the cluster lists the field in ``spec.defaults.mustHonour``
    (or ``"*"``). What the runtime itself says for Kubernetes is the runtime author's, and not repeated."""
    found: list[tuple[str, str, Any]] = []
    job_name = trainer_job.name
    merged_jobs = template.model_dump(by_alias=True, exclude_none=True, mode="json").get("replicatedJobs", [])
    base_jobs = runtime.spec.template.spec.model_dump(by_alias=True, exclude_none=True, mode="json").get(
        "replicatedJobs", [])

    def pod_of(jobs: list[dict[str, Any]], name: str) -> dict[str, Any]:
        job = next((j for j in jobs if j.get("name") == name), {})
        return (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}

    pod_doc, base_pod = pod_of(merged_jobs, job_name), pod_of(base_jobs, job_name)
    where = f"spec.runtimePatches: replicatedJobs[{job_name}] pod spec"
    for key, value in pod_doc.items():
        if key not in _POD_NEUTRAL and value != base_pod.get(key):
            found.append((key, f"{where}.{key}", value))
    base_containers = {c.get("name"): c for c in base_pod.get("containers", [])}
    for other in pod_doc.get("containers", []):
        name = other.get("name")
        if name != container.name and other != base_containers.get(name):
            found.append(("containers", f"{where}.containers[{name}]", "a container beside 'node'"))
    base_node = base_containers.get(container.name) or {}
    container_doc = container.model_dump(by_alias=True, exclude_none=True, mode="json")
    for key, value in container_doc.items():
        if key not in _CONTAINER_READ and value != base_node.get(key):
            found.append((key, f"{where}.containers[node].{key}", value))
    if image and cluster.spec.defaults.container_runtime == "none" and trainjob.spec.trainer is not None \
            and trainjob.spec.trainer.image:
        found.append(("image", "spec.trainer.image", image))
    required = set(cluster.spec.defaults.must_honour)
    notes = []
    for key, where, value in found:
        if key in required or "*" in required:
            raise InvalidSpec(where, value, f"a Kubernetes field a {cluster.spec.type} cluster cannot honour, and "
                              f"cluster {cluster.name!r} requires it honoured (spec.defaults.mustHonour)")
        what = ("runs on the host: the cluster has no container runtime (spec.defaults.containerRuntime)"
                if key == "image" else f"not honoured on a {cluster.spec.type} cluster")
        notes.append(f"{where}: {what}")
    return tuple(notes)


def jobset_metadata(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime) -> Mapping[str, Mapping[str, str]]:
    """The JobSet's own labels and annotations, as Kubeflow propagates them: the runtime template's metadata,
    then each runtime patch's ``template.metadata`` in order."""
    merged: dict[str, dict[str, str]] = {"labels": {}, "annotations": {}}
    meta = runtime.spec.template.metadata
    if meta is not None:
        merged["labels"].update(meta.labels or {})
        merged["annotations"].update(meta.annotations or {})
    for index, patch in enumerate(trainjob.spec.runtime_patches or []):
        where = f"spec.runtimePatches[{index}].trainingRuntimeSpec.template.metadata"
        spec = patch.training_runtime_spec if isinstance(patch.training_runtime_spec, dict) else {}
        given = spec.get("template")
        template: dict[str, Any] = given if isinstance(given, dict) else {}
        patch_meta = template.get("metadata")
        if patch_meta is None:
            continue
        if not isinstance(patch_meta, dict):
            raise InvalidSpec(where, patch_meta, "must be a mapping with labels and annotations")
        for key in ("labels", "annotations"):
            values = patch_meta.get(key) or {}
            if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
                raise InvalidSpec(f"{where}.{key}", values, "must map names to strings")
            merged[key].update(values)
    from bridge.api.names import check_annotations

    try:
        check_annotations(merged["annotations"])
    except ValueError as exc:
        raise InvalidSpec("spec.runtimePatches (JobSet metadata.annotations)", None, str(exc)) from None
    return merged
