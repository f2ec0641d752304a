"""The runtime's JobSet template merged with the TrainJob: runtime patches, the trainer container, its env and
per-node resources, by Kubeflow's precedence rules."""

from __future__ import annotations

import copy
import math
from typing import Any

from pydantic import ValidationError

from bridge.annotations import ANCESTOR_LABEL
from bridge.api.k8s import Container, EnvVar, JobSetSpec, ReplicatedJob, ResourceRequirements
from bridge.api.loader import invalid_from_validation
from bridge.api.quantity import parse_quantity
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import TrainJob
from bridge.errors import InvalidSpec
from bridge.plan.model import TRAINER_CONTAINER, EnvEntry, NodeResources


def merged_template(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime) -> JobSetSpec:
    """The runtime's JobSet spec with every runtime patch applied in list order (strategic merge)."""
    base = runtime.spec.template.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    job_names = [job["name"] for job in base.get("replicatedJobs", [])]
    for index, patch in enumerate(trainjob.spec.runtime_patches or []):
        where = f"spec.runtimePatches[{index}]"
        # the patch is free-form until merged: every level this function reads must have the right shape
        template = _patch_part(patch.training_runtime_spec, "template", f"{where}.trainingRuntimeSpec", dict)
        spec_patch = _patch_part(template, "spec", f"{where}.trainingRuntimeSpec.template", dict)
        jobs = _patch_part(spec_patch, "replicatedJobs", f"{where}.trainingRuntimeSpec.template.spec", list)
        for job_index, job_patch in enumerate(jobs):
            name = job_patch.get("name") if isinstance(job_patch, dict) else None
            if name not in job_names:
                raise InvalidSpec(f"{where}.trainingRuntimeSpec.template.spec.replicatedJobs[{job_index}].name", name,
                                  f"runtime {runtime.name!r} has no such replicated job")
        base = strategic_merge(base, spec_patch)
    try:
        return JobSetSpec.model_validate(base)
    except ValidationError as exc:
        raise invalid_from_validation(exc, prefix="spec.runtimePatches (merged template)", model=JobSetSpec) from None


def _patch_part(parent: Any, key: str, where: str, kind: type) -> Any:
    """``parent[key]`` of a runtime patch, empty when absent; InvalidSpec when it is not a *kind*."""
    value = (parent or {}).get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        shape = "a mapping" if kind is dict else "a list"
        raise InvalidSpec(f"{where}.{key}", value, f"must be {shape}")
    return value


# List fields merged by a key, as Kubernetes' strategic merge patch does for these types.
_MERGE_KEYS = {"replicatedJobs": "name", "containers": "name", "initContainers": "name", "env": "name",
               "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort",
               "schedulingGates": "name", "imagePullSecrets": "name"}


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """*patch* over *base* as a strategic merge patch: mappings merged, keyed lists (``_MERGE_KEYS``) merged
    by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for name, value in patch.items():
            merged[name] = strategic_merge(base.get(name), value, name) if name in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in _MERGE_KEYS:
        merge_key = _MERGE_KEYS[key]
        merged_list = copy.deepcopy(base)
        positions = {item.get(merge_key): i for i, item in enumerate(merged_list)
                     if isinstance(item, dict) and isinstance(item.get(merge_key), (str, int))}
        for item in patch:
            if isinstance(item, dict) and isinstance(item.get(merge_key), (str, int)) \
                    and item.get(merge_key) in positions:
                i = positions[item[merge_key]]
                merged_list[i] = strategic_merge(merged_list[i], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def trainer_container(template: JobSetSpec, runtime_name: str) -> tuple[ReplicatedJob, Container]:
    """The replicated job labelled as the trainer ancestor (or named ``node``) and its ``node`` container."""
    jobs = template.replicated_jobs
    chosen = next((job for job in jobs if ((job.template.metadata and job.template.metadata.labels) or {})
                   .get(ANCESTOR_LABEL) == "trainer"), None)
    chosen = chosen or next((job for job in jobs if job.name == "node"), None)
    if chosen is None:
        # A runtime without a template (common for HPC-only runtimes): an empty `node` container.
        return ReplicatedJob(name="node"), Container(name=TRAINER_CONTAINER)
    pod = chosen.template.spec.template.spec
    for container in (pod.containers if pod else []):
        if container.name == TRAINER_CONTAINER:
            return chosen, container
    raise InvalidSpec(f"runtime {runtime_name}: spec.template.spec.replicatedJobs[{chosen.name}].containers",
                      [c.name for c in (pod.containers if pod else [])], "the trainer job has no container named 'node'")


def merged_env(runtime_env: list[EnvVar], trainjob_env: list[EnvVar]) -> tuple[EnvEntry, ...]:
    """Runtime env with the TrainJob's entries upserted by name (Kubeflow's merge), order kept."""
    merged: dict[str, EnvEntry] = {}
    for entry in [*runtime_env, *trainjob_env]:
        merged[entry.name] = EnvEntry(entry.name, entry.value, entry.value_from)
    return tuple(merged.values())


def node_resources(runtime: ResourceRequirements | None, trainjob: ResourceRequirements | None) -> NodeResources:
    """Per-key merge (TrainJob wins), then requests with limits as the fallback, as Kubernetes defaults them."""
    requests: dict[str, Any] = {}
    for source in (runtime, trainjob):
        if source is None:
            continue
        for name, value in (source.limits or {}).items():
            requests.setdefault(name, value)
        for name, value in (source.requests or {}).items():
            requests[name] = value
        # a TrainJob limit overrides a runtime request of the same resource
        if source is trainjob:
            for name, value in (source.limits or {}).items():
                if name not in (source.requests or {}):
                    requests[name] = value
    cpu = memory = None
    gpus, gpu_resource, extra = 0, None, []
    for name, value in sorted(requests.items()):
        amount = parse_quantity(value)
        if name == "cpu":
            cpu = amount
        elif name == "memory":
            memory = math.ceil(amount)
        elif "gpu" in name:
            if amount != int(amount):
                raise InvalidSpec(f"spec.trainer.resourcesPerNode.requests[{name}]", value, "GPUs come in whole numbers")
            if gpu_resource is not None and amount:
                raise InvalidSpec(f"spec.trainer.resourcesPerNode.requests[{name}]", value,
                                  f"only one GPU resource per node (also {gpu_resource})")
            if amount:
                gpus, gpu_resource = int(amount), name
        else:
            extra.append((name, str(value)))
    given: dict[str, dict[str, Any]] = {"requests": {}, "limits": {}}
    for source in (runtime, trainjob):
        if source is not None:
            given["requests"].update(source.requests or {})
            given["limits"].update(source.limits or {})
    return NodeResources(cpu=cpu, memory_bytes=memory, gpus=gpus, gpu_resource=gpu_resource, extra=tuple(extra),
                         quantities=tuple((name, str(value)) for name, value in sorted(requests.items())),
                         given_requests=tuple((n, str(v)) for n, v in given["requests"].items()),
                         given_limits=tuple((n, str(v)) for n, v in given["limits"].items()))
