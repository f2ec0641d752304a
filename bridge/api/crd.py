"""CustomResourceDefinitions generated from the pydantic models, so the two never drift.

The models' JSON schema is turned into a structural OpenAPI v3 schema (refs inlined, optional fields
unwrapped, free-form maps marked to preserve unknown fields), and the rules pydantic checks in Python are
added as CEL ``x-kubernetes-validations`` with the same messages our validator gives.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from bridge.annotations import GENERATED_FROM_ANNOTATION, JOB_CLUSTER_ANNOTATION, JOB_ID_ANNOTATION
from bridge.api.cluster import BridgeCluster
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import MANAGED_BY_VALUES, TrainJob

_DROP = {"title", "default", "$defs", "description"}

#: CEL rules for what pydantic validators check (JSON path inside the schema → rules)
_RULES: dict[str, dict[tuple[str, ...], list[dict[str, str]]]] = {
    "TrainJob": {
        (): [{"rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
              "message": "must be an RFC 1035 DNS label: lowercase letters, digits and '-', starting with a letter"},
             {"rule": "size(self.metadata.name) <= 63", "message": "must be at most 63 characters"}],
        ("spec", "managedBy"): [{"rule": f"self in {list(MANAGED_BY_VALUES)}",
                                 "message": f"must be one of {', '.join(MANAGED_BY_VALUES)}"},
                                {"rule": "self == oldSelf", "message": "field is immutable"}],
        ("spec", "runtimeRef"): [{"rule": "self == oldSelf", "message": "field is immutable"}],
    },
    "TrainingRuntime": {
        ("spec", "mlPolicy"): [{"rule": "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost), "
                                        "has(self.flux)].filter(x, x).size() <= 1",
                                "message": "Only one of the policy can be configured"}],
    },
}
_RULES["ClusterTrainingRuntime"] = _RULES["TrainingRuntime"]

#: defaults the API server fills in, as Kubeflow's CRDs have them: Kueue's TrainJob integration (and any other
#: controller reading TrainJobs) finds the runtime by apiGroup and kind, and reports "unsupported runtime"
#: when they are empty
_DEFAULTS: dict[str, dict[tuple[str, ...], Any]] = {
    "TrainJob": {("spec", "runtimeRef", "apiGroup"): "trainer.kubeflow.org",
                 ("spec", "runtimeRef", "kind"): "ClusterTrainingRuntime"},
}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            return _resolve(defs[node["$ref"].rsplit("/", 1)[1]], defs)
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            if len(options) == 1:
                merged = {k: v for k, v in node.items() if k != "anyOf"}
                return _resolve({**options[0], **{k: v for k, v in merged.items() if k in ("description",)}}, defs)
            types = sorted({o.get("type") for o in options})
            if {"integer", "string"} <= set(types) and set(types) <= {"integer", "number", "string"}:
                return {"x-kubernetes-int-or-string": True}  # Kubernetes quantities
            return {"x-kubernetes-preserve-unknown-fields": True}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROP or key == "const":
                continue
            if key == "properties":
                out[key] = {name: _resolve(prop, defs) for name, prop in value.items()}
            elif key == "items":
                out[key] = _resolve(value, defs)
            elif key == "additionalProperties":
                if isinstance(value, dict) and "properties" not in node:
                    out[key] = _resolve(value, defs)  # map[string]X
                # False (extra="forbid") has no structural form: the API server prunes unknown fields
            elif key == "enum" and len(value) == 1:
                continue  # Literal apiVersion/kind: the API server fills and checks those
            else:
                out[key] = value
        if out.get("type") == "integer" and out.get("maximum") == 2**63 - 1:
            # int64's bound: the API server reads schema bounds as float64, and 2**63-1 rounds to 2**63, which
            # it refuses as no integer, rejecting every value of the field; Kubernetes writes format int64
            del out["maximum"]
            out["format"] = "int64"
        if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in out:
            out["x-kubernetes-preserve-unknown-fields"] = True
        if not out.get("type") and not any(k.startswith("x-kubernetes") for k in out):
            out["x-kubernetes-preserve-unknown-fields"] = True
        return out
    return node


def _set_rules(schema: dict[str, Any], path: tuple[str, ...], rules: list[dict[str, str]]) -> None:
    node = schema
    for part in path:
        node = node["properties"][part]
    node["x-kubernetes-validations"] = rules


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    schema: dict[str, Any] = _resolve({k: v for k, v in raw.items() if k != "$defs"}, raw.get("$defs", {}))
    props = schema["properties"]
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"type": "object"}  # the API server owns ObjectMeta's schema
    schema["required"] = [name for name in schema.get("required", []) if name not in ("apiVersion", "kind",
                                                                                     "metadata")]
    for path, rules in _RULES.get(model.__name__, {}).items():
        _set_rules(schema, path, rules)
    for path, value in _DEFAULTS.get(model.__name__, {}).items():
        node = schema
        for part in path:
            node = node["properties"][part]
        node["default"] = value
    return schema


def _annotation_path(name: str) -> str:
    """A JSONPath to a metadata annotation: its dots escaped, as kubectl's JSONPath reads them."""
    return ".metadata.annotations." + name.replace(".", "\\.")


#: ``kubectl get trainjobs``: Kubeflow's State and Age, and between them the cluster and the backend job the
#: operator records on the TrainJob when it sends it (the annotations it reads itself after a restart)
TRAINJOB_COLUMNS = [
    {"name": "Cluster", "type": "string", "jsonPath": _annotation_path(JOB_CLUSTER_ANNOTATION),
     "description": "The BridgeCluster the TrainJob's backend job runs on"},
    {"name": "Job ID", "type": "string", "jsonPath": _annotation_path(JOB_ID_ANNOTATION),
     "description": "The backend's id of the TrainJob's job (Slurm job id, Flux job id, JobSet)"},
    {"name": "State", "type": "string", "jsonPath": ".status.conditions[-1:].type"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]


def crd(model: type[BaseModel], group: str, kind: str, plural: str, scope: str, short: list[str]) -> dict[str, Any]:
    schema = openapi_schema(model)
    version: dict[str, Any] = {"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": schema}}
    if "status" in schema["properties"]:
        version["subresources"] = {"status": {}}
    if kind == "TrainJob":
        version["additionalPrinterColumns"] = TRAINJOB_COLUMNS
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}",
                     "annotations": {GENERATED_FROM_ANNOTATION: f"bridge.api {model.__name__}"}},
        "spec": {"group": group, "scope": scope,
                 "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                           "shortNames": short},
                 "versions": [version]},
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """File name → CRD, for manifests/crds/."""
    trainer = "trainer.kubeflow.org"
    return {
        f"{trainer}_trainjobs.yaml": crd(TrainJob, trainer, "TrainJob", "trainjobs", "Namespaced", ["tj"]),
        f"{trainer}_trainingruntimes.yaml": crd(TrainingRuntime, trainer, "TrainingRuntime", "trainingruntimes",
                                                "Namespaced", []),
        f"{trainer}_clustertrainingruntimes.yaml": crd(ClusterTrainingRuntime, trainer, "ClusterTrainingRuntime",
                                                       "clustertrainingruntimes", "Cluster", []),
        "hpcbridge.io_bridgeclusters.yaml": crd(BridgeCluster, "hpcbridge.io", "BridgeCluster", "bridgeclusters",
                                                "Cluster", ["bc"]),
    }
