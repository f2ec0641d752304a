"""The pod templates of a JobSet's replicated jobs: where a job's pod spec and ``node`` container are, env
upserts, pod counts, resources, initializer inputs, cluster images and label checks. Pure, like render."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from bridge.annotations import ANCESTOR_LABEL
from bridge.api.names import check_labels
from bridge.errors import InvalidSpec
from bridge.plan import TRAINER_CONTAINER, LaunchPlan

if TYPE_CHECKING:
    from bridge.api.storage import StageSource

DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


#: resources the API server takes in requests alone; any other (nvidia.com/gpu…) needs a limit to match
_OVERCOMMITTABLE = ("cpu", "memory", "ephemeral-storage")


def container_resources(plan: LaunchPlan) -> dict[str, Any]:
    """Requests and limits as the TrainJob and runtime give them (each merged per key, as Kubeflow does). An
    extended resource asked for only in requests also gets it as its limit: the API server refuses such pods."""
    requests = dict(plan.resources.given_requests)
    limits = dict(plan.resources.given_limits)
    for name, value in requests.items():
        if name not in limits and name not in _OVERCOMMITTABLE and not name.startswith("hugepages-"):
            limits[name] = value
    return {key: value for key, value in (("limits", limits), ("requests", requests)) if value}


def trainer_job(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    for job in jobs:
        labels = ((job.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_LABEL) == "trainer":
            return job
    return next((job for job in jobs if job.get("name") == "node"), None)


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    job_spec = job.setdefault("template", {}).setdefault("spec", {})
    pod: dict[str, Any] = job_spec.setdefault("template", {}).setdefault("spec", {})
    return pod


def node_container(job: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in pod_spec(job).get("containers", []) if c.get("name") == TRAINER_CONTAINER), None)


def set_env(container: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    env = [e for e in container.get("env", []) if e["name"] not in {x["name"] for x in entries}]
    container["env"] = env + entries


def set_pod_count(job: dict[str, Any], count: int) -> None:
    spec = job.setdefault("template", {}).setdefault("spec", {})
    spec["parallelism"] = count
    spec["completions"] = count


def hostnames(jobset_name: str, job_name: str, count: int, subdomain: str) -> list[str]:
    return [f"{jobset_name}-{job_name}-0-{i}.{subdomain}" for i in range(count)]


def initializers(plan: LaunchPlan, jobs: list[dict[str, Any]]) -> None:
    """Kubeflow's JobSet plugin: each initializer job's container of its name gets STORAGE_URI and the
    initializer's env (upserted in place), and its Secret as envFrom."""
    if plan.staging is None:
        return
    for source in plan.staging.sources:
        for job in jobs:
            labels = ((job.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if labels.get(ANCESTOR_LABEL) != source.container:
                continue
            for container in pod_spec(job).get("containers", []):
                if container.get("name") != source.container:
                    continue
                env = container.setdefault("env", [])
                for name, value in (("STORAGE_URI", source.uri), *source.env):
                    entry = next((e for e in env if e.get("name") == name), None)
                    if entry is None:
                        env.append({"name": name, "value": value})
                    else:
                        entry.clear()
                        entry.update({"name": name, "value": value})
                if source.secret:
                    container.setdefault("envFrom", []).append({"secretRef": {"name": source.secret}})
                if source.uri.lower().startswith("pvc://"):
                    _mount_source_claim(pod_spec(job), container, source)


def _mount_source_claim(pod: dict[str, Any], container: dict[str, Any], source: StageSource) -> None:
    """``pvc://claim/path``: data already on a claim of the namespace. The initializer pod mounts the claim
    read-only where ``hpcbridge initialize`` copies it from into the ``initializer`` volume (Kubeflow's own
    initializer images read hf:// and s3:// only)."""
    from bridge.api.storage import PVC_SOURCE_MOUNT, PVC_SOURCE_VOLUME, parse_storage_uri

    claim = parse_storage_uri(source.uri, source.role).authority
    pod.setdefault("volumes", []).append({"name": PVC_SOURCE_VOLUME,
                                          "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    container.setdefault("volumeMounts", []).append({"name": PVC_SOURCE_VOLUME, "mountPath": PVC_SOURCE_MOUNT,
                                                     "readOnly": True})


def cluster_images(plan: LaunchPlan, jobs: list[dict[str, Any]]) -> None:
    """The cluster's copies of the images named (``spec.kubernetes.images``) and its pull policy, on every
    container and init container of every replicated job."""
    kubernetes = plan.on_kubernetes()
    images = dict(kubernetes.image_map)
    for job in jobs:
        pod = pod_spec(job)
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            if container.get("image") in images:
                container["image"] = images[container["image"]]
            if kubernetes.image_pull_policy:
                container["imagePullPolicy"] = kubernetes.image_pull_policy


def check_jobset_labels(where: str, labels: dict[str, Any]) -> None:
    """Every label the JobSet carries is one the API server admits; refused here, before anything is sent."""
    for key, value in labels.items():
        try:
            if not isinstance(value, str):
                raise ValueError("label values are strings")
            check_labels({key: value})
        except ValueError as exc:
            raise InvalidSpec(f"{where}[{key}]", value, str(exc)) from None
