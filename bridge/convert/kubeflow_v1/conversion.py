"""What converting any Training Operator v1 job takes: the kinds it reads, the result, and the checks, notes
and TrainJob pieces every kind shares (``Conversion``)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from bridge.annotations import QUEUE_LABEL
from bridge.errors import InvalidSpec

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
#: the manager named on the runtime patches this converter writes
PATCH_MANAGER = "hpcbridge.io/convert"

#: (apiVersion, kind) → (replica specs field, framework container name)
KINDS = {
    ("kubeflow.org/v1", "PyTorchJob"): ("pytorchReplicaSpecs", "pytorch"),
    ("kubeflow.org/v1", "TFJob"): ("tfReplicaSpecs", "tensorflow"),
    ("kubeflow.org/v2beta1", "MPIJob"): ("mpiReplicaSpecs", None),
}

#: container fields that become spec.trainer
_TRAINER_FIELDS = ("name", "image", "command", "args", "env", "resources")
#: container fields carried to the runtime's container through a runtime patch
_PATCHED_CONTAINER_FIELDS = ("envFrom", "volumeMounts", "volumeDevices", "workingDir", "securityContext",
                             "imagePullPolicy")
#: pod fields carried through a runtime patch
_PATCHED_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "volumes", "serviceAccountName",
                       "imagePullSecrets", "priorityClassName", "schedulerName", "securityContext",
                       "runtimeClassName", "topologySpreadConstraints", "dnsPolicy", "dnsConfig", "hostAliases",
                       "initContainers", "terminationGracePeriodSeconds", "hostIPC", "hostPID", "hostNetwork",
                       "shareProcessNamespace", "automountServiceAccountToken", "enableServiceLinks",
                       "overhead", "preemptionPolicy", "priority", "readinessGates", "resourceClaims",
                       "schedulingGates", "setHostnameAsFQDN", "subdomain", "hostname", "os", "nodeName")


def is_v1_job(document: Any) -> bool:
    if not isinstance(document, dict):
        return False
    api_version, kind = document.get("apiVersion"), document.get("kind")
    return isinstance(api_version, str) and isinstance(kind, str) and (api_version, kind) in KINDS


@dataclass
class Converted:
    """The TrainJob, the TrainingRuntime written for it (if any), and what did not carry over."""

    trainjob: dict[str, Any]
    runtime: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def documents(self) -> list[dict[str, Any]]:
        return [self.trainjob, *([self.runtime] if self.runtime else [])]


class Conversion:
    def __init__(self, document: dict[str, Any], source: str) -> None:
        self.doc, self.source = document, source
        self.kind = document["kind"]
        self.notes: list[str] = []

    def note(self, path: str, value: Any, why: str) -> None:
        try:
            shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        except ValueError:  # an int past Python's digit limit
            shown = "<a number too long to show>"
        if len(shown) > 120:
            shown = shown[:117] + "..."
        self.notes.append(f"{self.kind} {path} {shown}: {why}")

    def fail(self, path: str, value: Any, why: str) -> InvalidSpec:
        return InvalidSpec(path, value, why, source=self.source)

    # --- pieces shared by every kind

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, value, "must be a mapping")
        return value

    def items(self, value: Any, path: str) -> list[dict[str, Any]]:
        """A list of mappings (containers, env), or InvalidSpec naming the field."""
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise self.fail(path, value, "must be a list of mappings")
        return value

    def strings(self, value: Any, path: str) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.fail(path, value, "must be a list of strings")
        return value

    def replicas(self, specs_field: str) -> dict[str, dict[str, Any]]:
        specs = self.mapping(self.doc.get("spec"), "spec").get(specs_field)
        if not isinstance(specs, dict) or not specs:
            raise self.fail(f"spec.{specs_field}", specs, f"a {self.kind} needs its replica specs")
        for role, spec in specs.items():
            path = f"spec.{specs_field}.{role}"
            if not isinstance(spec, dict):
                raise self.fail(path, spec, "must be a mapping")
            for key, value in spec.items():
                if key == "restartPolicy":
                    if value != "Never":
                        self.note(f"{path}.restartPolicy", value, "a TrainJob's pods are not restarted (its "
                                  "runtimes fail the job at a non-zero exit)")
                elif key not in ("replicas", "template"):
                    self.note(f"{path}.{key}", value, "no equivalent; dropped")
        return specs

    def count(self, spec: dict[str, Any], path: str, default: int = 1) -> int:
        from bridge.plan import MAX_NODES_DEFAULT

        value = spec.get("replicas", default)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_NODES_DEFAULT:
            raise self.fail(f"{path}.replicas", value, f"must be a whole number from 0 to {MAX_NODES_DEFAULT}")
        return value

    def pod(self, spec: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(pod template metadata, pod spec) of a replica spec."""
        template = self.mapping(spec.get("template"), f"{path}.template")
        pod = self.mapping(template.get("spec"), f"{path}.template.spec")
        containers = pod.get("containers")
        if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
            raise self.fail(f"{path}.template.spec.containers", containers, "needs at least one container")
        return self.mapping(template.get("metadata"), f"{path}.template.metadata"), pod

    def framework_container(self, pod: dict[str, Any], name: str | None, path: str) -> tuple[int, dict[str, Any]]:
        containers = pod["containers"]
        if name is None:
            return 0, containers[0]
        for index, container in enumerate(containers):
            self.items(container.get("env"), f"{path}.template.spec.containers[{index}].env")
            for key in ("command", "args"):
                self.strings(container.get(key), f"{path}.template.spec.containers[{index}].{key}")
            self.mapping(container.get("resources"), f"{path}.template.spec.containers[{index}].resources")
        for index, container in enumerate(containers):
            if container.get("name") == name:
                return index, container
        raise self.fail(f"{path}.template.spec.containers", [c.get("name") for c in containers],
                        f"a {self.kind} runs the container named {name!r}; there is none")

    def trainer_from(self, container: dict[str, Any], path: str) -> dict[str, Any]:
        trainer: dict[str, Any] = {}
        for key in ("image", "command", "args", "env"):
            if container.get(key) is not None:
                trainer[key] = copy.deepcopy(container[key])
        if container.get("resources"):
            trainer["resourcesPerNode"] = copy.deepcopy(container["resources"])
        for key, value in container.items():
            if key not in _TRAINER_FIELDS and key not in _PATCHED_CONTAINER_FIELDS:
                self.note(f"{path}.{key}", value, "no equivalent on a TrainJob's trainer; dropped")
        return trainer

    def pod_patch(self, metadata: dict[str, Any], pod: dict[str, Any], container: dict[str, Any],
                  container_index: int, path: str) -> dict[str, Any]:
        """The pod-level settings for the runtime's pods, in the shape of a PodTemplateSpec."""
        spec: dict[str, Any] = {}
        for key, value in pod.items():
            if key in _PATCHED_POD_FIELDS:
                spec[key] = copy.deepcopy(value)
            elif key == "restartPolicy":
                if value != "Never":
                    self.note(f"{path}.template.spec.restartPolicy", value,
                              "a TrainJob's pods are not restarted (its runtimes fail the job on a non-zero exit)")
            elif key != "containers":
                self.note(f"{path}.template.spec.{key}", value, "no equivalent; dropped")
        own = {key: copy.deepcopy(value) for key, value in container.items() if key in _PATCHED_CONTAINER_FIELDS}
        containers = [{"name": "node", **own}] if own else []
        for index, other in enumerate(pod["containers"]):
            if index != container_index:
                containers.append(copy.deepcopy(other))
                self.note(f"{path}.template.spec.containers[{index}]", other.get("name"),
                          "kept as a sidecar container of every node's pod (Kubernetes only)")
        if containers:
            spec["containers"] = containers
        patch: dict[str, Any] = {}
        labels = dict(self.mapping(metadata.get("labels"), f"{path}.template.metadata.labels"))
        annotations = dict(self.mapping(metadata.get("annotations"), f"{path}.template.metadata.annotations"))
        if labels or annotations:
            patch["metadata"] = {**({"labels": labels} if labels else {}),
                                 **({"annotations": annotations} if annotations else {})}
        for key in metadata:
            if key not in ("labels", "annotations"):
                self.note(f"{path}.template.metadata.{key}", metadata[key], "no equivalent; dropped")
        if spec:
            patch["spec"] = spec
        return patch

    def run_policy(self, trainjob: dict[str, Any], total_nodes: int) -> str | None:
        """spec.runPolicy onto the TrainJob; returns the pod priority class it asks for, if any."""
        policy = self.mapping(self.mapping(self.doc.get("spec"), "spec").get("runPolicy"), "spec.runPolicy")
        priority = None
        for key, value in policy.items():
            path = f"spec.runPolicy.{key}"
            if key == "activeDeadlineSeconds":
                trainjob["spec"]["activeDeadlineSeconds"] = value
            elif key == "suspend":
                trainjob["spec"]["suspend"] = value
            elif key == "backoffLimit":
                self.note(path, value, "a TrainJob is not retried: it fails at its first failure")
            elif key == "cleanPodPolicy":
                self.note(path, value, "no equivalent: a finished TrainJob's pods stay until it is deleted")
            elif key == "ttlSecondsAfterFinished":
                self.note(path, value, "no equivalent: delete the TrainJob to remove it")
            elif key == "managedBy":
                self.note(path, value, "not carried: hpc-bridge manages the TrainJob (spec.managedBy)")
            elif key == "schedulingPolicy":
                priority = self.scheduling(self.mapping(value, path), trainjob, total_nodes)
            else:
                self.note(path, value, "no equivalent; dropped")
        return priority

    def scheduling(self, policy: dict[str, Any], trainjob: dict[str, Any], total_nodes: int) -> str | None:
        priority = None
        for key, value in policy.items():
            path = f"spec.runPolicy.schedulingPolicy.{key}"
            if key == "queue":
                trainjob["metadata"].setdefault("labels", {})[QUEUE_LABEL] = value
            elif key == "priorityClass":
                priority = value
            elif key == "minAvailable":
                if value != total_nodes:
                    self.note(path, value, f"a TrainJob's {total_nodes} nodes start together, all of them")
            else:
                self.note(path, value, "no equivalent; dropped")
        return priority

    def trainjob(self, trainer: dict[str, Any], runtime_name: str, runtime_kind: str) -> dict[str, Any]:
        meta = self.mapping(self.doc.get("metadata"), "metadata")
        if not isinstance(meta.get("name"), str) or not meta.get("name"):
            raise self.fail("metadata.name", meta.get("name"), f"a {self.kind} needs a name")
        metadata: dict[str, Any] = {"name": meta["name"]}
        for key in ("labels", "annotations"):
            if meta.get(key):
                metadata[key] = copy.deepcopy(self.mapping(meta[key], f"metadata.{key}"))
        if meta.get("namespace"):
            metadata["namespace"] = meta["namespace"]
        ref = {"name": runtime_name, **({"kind": runtime_kind} if runtime_kind != "ClusterTrainingRuntime" else {})}
        return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata,
                "spec": {"runtimeRef": ref, "trainer": trainer}}

    def compare(self, first: tuple[str, dict[str, Any]], other: tuple[str, dict[str, Any]], what: str) -> None:
        """One pod template runs on every node: say so when another replica type's differs."""
        if first[1] != other[1]:
            differing = sorted(k for k in set(first[1]) | set(other[1]) if first[1].get(k) != other[1].get(k))
            self.note(f"{other[0]}.template", ", ".join(differing) or "(metadata)",
                      f"differs from {first[0]}'s; every node of the TrainJob runs {what}")


def runtime_patches(job_names: list[str], pod_patch: dict[str, Any], priority: str | None) -> list[dict[str, Any]]:
    if priority:
        pod_patch = {**pod_patch, "spec": {**pod_patch.get("spec", {}), "priorityClassName": priority}}
    if not pod_patch:
        return []
    jobs = [{"name": name, "template": {"spec": {"template": copy.deepcopy(pod_patch)}}} for name in job_names]
    return [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}}}]


def normalized_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod spec without what legitimately differs between roles of one job (none of it becomes the trainer)."""
    return {k: v for k, v in pod.items() if k != "restartPolicy"}
