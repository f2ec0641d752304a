"""kubeflow.org/v1 TFJob → TrainJob and a TrainingRuntime written for it (no built-in runtime runs
TensorFlow): every role's replicas are nodes, and each node gets TF_CONFIG for its role."""

from __future__ import annotations

import copy
from typing import Any

from bridge.annotations import FRAMEWORK_LABEL
from bridge.convert.kubeflow_v1.conversion import (
    TRAINER_API,
    Conversion,
    Converted,
    normalized_pod,
    runtime_patches,
)
from bridge.envnames import TF_ROLES_ENV

#: TFJob roles in the order their nodes are ranked (the chief is node 0, as TF_CONFIG's cluster lists it)
_TF_ROLES = (("Chief", "chief"), ("Master", "chief"), ("Worker", "worker"), ("PS", "ps"))


def tensorflow(conv: Conversion, builtin: dict[str, dict[str, Any]]) -> Converted:
    specs = conv.replicas("tfReplicaSpecs")
    roles, nodes = _roles(conv, specs)
    # the template every node runs: the Worker's, else the chief's, else the parameter server's
    chosen = next(role for role in ("Worker", "Chief", "Master", "PS") if role in specs and
                  conv.count(specs[role], f"spec.tfReplicaSpecs.{role}"))
    path = f"spec.tfReplicaSpecs.{chosen}"
    metadata, pod = conv.pod(specs[chosen], path)
    index, container = conv.framework_container(pod, "tensorflow", path)
    for role, _ in _TF_ROLES:
        if role in specs and role != chosen:
            _, other = conv.pod(specs[role], f"spec.tfReplicaSpecs.{role}")
            conv.compare((path, normalized_pod(pod)), (f"spec.tfReplicaSpecs.{role}", normalized_pod(other)),
                         f"the {chosen}'s (with TF_CONFIG naming its role)")
    trainer = conv.trainer_from(container, f"{path}.template.spec.containers[{index}]")
    env = [e for e in trainer.get("env") or [] if not (isinstance(e, dict) and e.get("name") == "TF_CONFIG")]
    trainer["env"] = [*env, {"name": TF_ROLES_ENV, "value": ",".join(roles)}]
    trainer["numNodes"] = nodes
    _note_spec(conv)
    runtime_name, runtime = _runtime(conv, trainer, builtin)
    conv.note("kind", "TFJob", f"no built-in runtime runs TensorFlow: TrainingRuntime {runtime_name} is written; "
              f"each node gets TF_CONFIG for its role ({TF_ROLES_ENV}={','.join(roles)})")
    trainjob = conv.trainjob(trainer, runtime_name, "TrainingRuntime")
    priority = conv.run_policy(trainjob, nodes)
    patches = runtime_patches(["node"], conv.pod_patch(metadata, pod, container, index, path), priority)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return Converted(trainjob, runtime, conv.notes)


def _roles(conv: Conversion, specs: dict[str, dict[str, Any]]) -> tuple[list[str], int]:
    """``role=count`` for each role that runs nodes, in rank order, and the nodes in all."""
    known = {role for role, _ in _TF_ROLES} | {"Evaluator"}
    for role in specs:
        if role not in known:
            raise conv.fail(f"spec.tfReplicaSpecs.{role}", role, "a TFJob has Chief, Worker, PS and Evaluator "
                            "replicas")
    if "Chief" in specs and "Master" in specs:
        raise conv.fail("spec.tfReplicaSpecs.Master", "Master", "give Chief or Master (its old name), not both")
    roles, nodes = [], 0
    for role, name in _TF_ROLES:
        if role in specs:
            count = conv.count(specs[role], f"spec.tfReplicaSpecs.{role}")
            if count:
                roles.append(f"{name}={count}")
                nodes += count
    if "Evaluator" in specs:
        conv.note("spec.tfReplicaSpecs.Evaluator", conv.count(specs["Evaluator"], "spec.tfReplicaSpecs.Evaluator"),
                  "no evaluator beside the training nodes: run the evaluation as a TrainJob of its own; dropped")
    if not nodes:
        raise conv.fail("spec.tfReplicaSpecs", 0, "no replicas to run")
    return roles, nodes


def _note_spec(conv: Conversion) -> None:
    spec = conv.doc.get("spec") or {}
    for key, value in spec.items():
        if key == "successPolicy":
            if value not in ("", "AllWorkers"):
                conv.note(f"spec.{key}", value, "the TrainJob succeeds when every node's command does")
        elif key == "enableDynamicWorker":
            if value:
                conv.note(f"spec.{key}", value, "no dynamic workers: the TrainJob runs its nodes, fixed")
        elif key not in ("tfReplicaSpecs", "runPolicy"):
            conv.note(f"spec.{key}", value, "no equivalent; dropped")


def _runtime(conv: Conversion, trainer: dict[str, Any], builtin: dict[str, dict[str, Any]],
             ) -> tuple[str, dict[str, Any]]:
    """The TrainingRuntime written for the TFJob, and its name."""
    # no built-in runtime runs TensorFlow: one like torch-distributed without its torch policy (every node
    # runs the command; the launcher gives each its TF_CONFIG from HPCBRIDGE_TF_ROLES)
    tfjob_name = conv.mapping(conv.doc.get("metadata"), "metadata").get("name")
    base = copy.deepcopy(builtin["torch-distributed"])
    base["spec"]["mlPolicy"] = {"numNodes": 1}
    for job in base["spec"]["template"]["spec"]["replicatedJobs"]:
        for runtime_container in job["template"]["spec"]["template"]["spec"]["containers"]:
            runtime_container["image"] = trainer.get("image") or "tensorflow/tensorflow"
    namespace = (conv.doc.get("metadata") or {}).get("namespace")
    runtime_name = f"{tfjob_name}-tensorflow"
    runtime = {"apiVersion": TRAINER_API, "kind": "TrainingRuntime",
               "metadata": {"name": runtime_name, **({"namespace": namespace} if namespace else {}),
                            "labels": {FRAMEWORK_LABEL: "tensorflow"}},
               "spec": base["spec"]}
    return runtime_name, runtime
