"""kubeflow.org/v1 PyTorchJob → TrainJob on the built-in ``torch-distributed`` runtime: Master and Worker
replicas are the TrainJob's nodes, ``nprocPerNode`` its processes per node."""

from __future__ import annotations

from typing import Any

from bridge.convert.kubeflow_v1.conversion import Conversion, Converted, normalized_pod, runtime_patches


def pytorch(conv: Conversion, builtin: dict[str, dict[str, Any]]) -> Converted:
    specs = conv.replicas("pytorchReplicaSpecs")
    for role in specs:
        if role not in ("Master", "Worker"):
            raise conv.fail(f"spec.pytorchReplicaSpecs.{role}", role, "a PyTorchJob has Master and Worker replicas")
    nodes = sum(conv.count(spec, f"spec.pytorchReplicaSpecs.{role}") for role, spec in specs.items())
    if nodes < 1:
        raise conv.fail("spec.pytorchReplicaSpecs", 0, "no replicas to run")
    chosen = ("Worker" if "Worker" in specs and conv.count(specs["Worker"], "spec.pytorchReplicaSpecs.Worker")
              else "Master")
    path = f"spec.pytorchReplicaSpecs.{chosen}"
    metadata, pod = conv.pod(specs[chosen], path)
    index, container = conv.framework_container(pod, "pytorch", path)
    for role, spec in specs.items():
        if role != chosen:
            other_meta, other_pod = conv.pod(spec, f"spec.pytorchReplicaSpecs.{role}")
            conv.compare((path, normalized_pod(pod)), (f"spec.pytorchReplicaSpecs.{role}", normalized_pod(other_pod)),
                         f"the {chosen}'s")
    trainer = conv.trainer_from(container, f"{path}.template.spec.containers[{index}]")
    trainer["numNodes"] = nodes
    spec = conv.doc.get("spec") or {}
    nproc = spec.get("nprocPerNode")
    elastic = conv.mapping(spec.get("elasticPolicy"), "spec.elasticPolicy")
    if elastic.get("nProcPerNode") is not None and nproc is None:
        nproc = str(elastic["nProcPerNode"])
    if nproc is not None:
        text = nproc if isinstance(nproc, str) else str(nproc) if isinstance(nproc, int) and \
            not isinstance(nproc, bool) and nproc.bit_length() < 64 else "?"
        if text.isdigit() and int(text) > 0:
            trainer["numProcPerNode"] = int(text)
        elif text in ("auto", "gpu"):
            gpus = _gpus(container)
            if gpus:
                trainer["numProcPerNode"] = gpus
            elif text == "gpu":
                conv.note("spec.nprocPerNode", text, "the container asks for no GPUs: one process per node")
        elif text == "cpu":
            conv.note("spec.nprocPerNode", text, "a TrainJob counts processes, not CPUs: one process per node; "
                      "set spec.trainer.numProcPerNode")
        else:
            raise conv.fail("spec.nprocPerNode", nproc, "must be auto, cpu, gpu or a whole number")
    for key, value in elastic.items():
        if key != "nProcPerNode":
            conv.note(f"spec.elasticPolicy.{key}", value, f"no elastic training in Trainer v2 (removed in v2.2): "
                      f"the TrainJob runs {nodes} nodes, fixed")
    for key, value in spec.items():
        if key not in ("pytorchReplicaSpecs", "runPolicy", "elasticPolicy", "nprocPerNode"):
            conv.note(f"spec.{key}", value, "no equivalent; dropped")
    trainjob = conv.trainjob(trainer, "torch-distributed", "ClusterTrainingRuntime")
    priority = conv.run_policy(trainjob, nodes)
    patch = conv.pod_patch(metadata, pod, container, index, path)
    job_names = [job["name"] for job in builtin["torch-distributed"]["spec"]["template"]["spec"]["replicatedJobs"]]
    patches = runtime_patches(job_names, patch, priority)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return Converted(trainjob, None, conv.notes)


def _gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        amounts = resources.get(part)
        for name, value in (amounts.items() if isinstance(amounts, dict) else ()):
            if "gpu" in str(name):
                try:
                    return int(str(value))
                except ValueError:
                    return 0
    return 0
