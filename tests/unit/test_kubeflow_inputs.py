"""Kubeflow's own files as a user points hpc-bridge at them: runtime folders, resources, runtime patches,
image entrypoints, stale fields from older releases, and Kubernetes-only fields on other backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bridge.api import load_documents
from bridge.api.catalog import load_runtimes
from bridge.api.cluster import BridgeCluster
from bridge.errors import InvalidSpec
from bridge.plan import find_runtime, resolve
from tests import builders

ROOT = Path(__file__).resolve().parents[2]

TORCH_RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-like", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {
        "metadata": {"labels": {"from-runtime": "yes"}},
        "spec": {"replicatedJobs": [{"name": "node", "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "pytorch/pytorch:2"}]}}}}}]}}}}


def cluster(kind: str = "slurm", **defaults) -> BridgeCluster:
    return builders.cluster(kind, kind, defaults=defaults)


def trainjob(spec: dict | None = None, trainer: dict | None = None):
    return builders.trainjob("j", runtime="torch-like", trainer=trainer, **(spec or {}))


def runtime():
    return load_documents(yaml.safe_dump(TORCH_RUNTIME))[0]


def render_jobset(job) -> dict:
    from bridge.adapters.kubernetes.render import jobset

    return jobset(resolve(job, runtime(), cluster("kubernetes")))[0]


# --- runtime folders -----------------------------------------------------------------------------------------


def write(path: Path, docs: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs))


def test_a_runtimes_folder_as_kubeflow_ships_it(tmp_path: Path) -> None:
    folder = tmp_path / "runtimes"
    write(folder / "kustomization.yaml", [{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                           "resources": ["torch.yaml"]}])
    write(folder / "torch.yaml", [TORCH_RUNTIME])
    sub = {**TORCH_RUNTIME, "metadata": {"name": "in-a-subfolder"}}
    write(folder / "torchtune" / "llama" / "tune.yaml", [sub, {"apiVersion": "v1", "kind": "ConfigMap",
                                                               "metadata": {"name": "x"}}])
    broken = {**TORCH_RUNTIME, "metadata": {"name": "broken"}, "spec": {"mlPolicy": {"torch": {"bogus": 1}}}}
    write(folder / "broken.yaml", [broken])
    (folder / "not-yaml.yaml").write_text("a: [unclosed\n")
    # the broken runtime and the unreadable file stop nothing that does not use them
    names = [r.name for r in load_runtimes([folder], name="in-a-subfolder")]
    assert names == ["in-a-subfolder"]
    assert [r.name for r in load_runtimes([folder], name="torch-like")] == ["torch-like"]
    with pytest.raises(InvalidSpec) as excinfo:
        load_runtimes([folder], name="broken")
    assert "broken.yaml" in str(excinfo.value) and "bogus" in str(excinfo.value)
    # a runtime nobody has: the known names, and the file that could not be read
    found = load_runtimes([folder], name="nope")
    with pytest.raises(InvalidSpec) as excinfo:
        find_runtime(trainjob(spec={"runtimeRef": {"name": "nope"}}), found)
    message = str(excinfo.value)
    assert "in-a-subfolder" in message and "torch-like" in message and "not-yaml.yaml" in message


def test_skipped_documents_are_said_at_debug_level(tmp_path: Path) -> None:
    folder = tmp_path / "runtimes"
    write(folder / "kustomization.yaml", [{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}])
    write(folder / "torch.yaml", [TORCH_RUNTIME])
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(builders.trainjob_doc("j", runtime="torch-like", trainer={"command": ["x"]})))
    argv = [sys.executable, "-m", "bridge", "render", str(job), "--to", "kubernetes", "--runtimes", str(folder)]
    quiet = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={"HPCBRIDGE_DEBUG": "1",
                                                                              "PATH": "/usr/bin:/bin"})
    assert "skipping" in loud.stderr and "Kustomization" in loud.stderr


# --- the JobSet ----------------------------------------------------------------------------------------------


def test_requests_and_limits_are_each_kept() -> None:
    job = trainjob(trainer={"command": ["x"], "resourcesPerNode": {
        "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}})
    container = render_jobset(job)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}


def test_runtime_patch_metadata_lands_on_the_jobset() -> None:
    job = trainjob(trainer={"command": ["x"]}, spec={"runtimePatches": [
        {"manager": "example.io/platform", "trainingRuntimeSpec": {"template": {"metadata": {
            "labels": {"team": "ml"}, "annotations": {"prometheus.io/scrape": "true"}}}}},
        {"manager": "example.io/finance", "trainingRuntimeSpec": {"template": {"metadata": {
            "labels": {"cost-center": "research", "team": "ml-platform"}}}}}]})
    metadata = render_jobset(job)["metadata"]
    assert metadata["labels"]["from-runtime"] == "yes"  # the runtime template's own
    assert metadata["labels"]["team"] == "ml-platform" and metadata["labels"]["cost-center"] == "research"
    assert metadata["annotations"] == {"prometheus.io/scrape": "true"}


def test_no_command_runs_the_image_entrypoint_on_kubernetes_only() -> None:
    job = trainjob(trainer={})
    container = render_jobset(job)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container and "args" not in container
    with pytest.raises(InvalidSpec) as excinfo:
        resolve(job, runtime(), cluster("slurm"))
    assert "image's entrypoint" in excinfo.value.problem and "slurm cluster" in excinfo.value.problem


# --- stale fields --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("doc", "field", "hint"), [
    ({**TORCH_RUNTIME, "spec": {"mlPolicy": {"torch": {"numProcPerNode": "auto"}}}},
     "spec.mlPolicy.torch.numProcPerNode", "spec.trainer.numProcPerNode"),
    ({**TORCH_RUNTIME, "spec": {"mlPolicy": {"torch": {"elasticPolicy": {"maxRestarts": 3}}}}},
     "spec.mlPolicy.torch.elasticPolicy", "removed in Trainer v2.2"),
    (builders.trainjob_doc("j", runtime="x", podTemplateOverrides=[]), "spec.podTemplateOverrides", "runtimePatches"),
    (builders.trainjob_doc("j", runtime="x", labels={"a": "b"}), "spec.labels", "runtimePatches"),
    (builders.trainjob_doc("j", runtime="x", trainer={"numProcPerNode": "auto"}), "spec.trainer.numProcPerNode",
     "an integer since Trainer v2.2"),
])
def test_fields_of_older_releases_point_to_their_replacement(doc: dict, field: str, hint: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        load_documents(yaml.safe_dump(doc))
    assert excinfo.value.field == field and hint in excinfo.value.problem
    assert "\n" not in str(excinfo.value)


# --- Kubernetes-only fields elsewhere ------------------------------------------------------------------------

PATCHED = {"runtimePatches": [{"manager": "example.io/platform", "trainingRuntimeSpec": {"template": {"spec": {
    "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
        "nodeSelector": {"pool": "gpu"}, "serviceAccountName": "trainer",
        "tolerations": [{"key": "gpu", "operator": "Exists"}]}}}}}]}}}}]}


@pytest.mark.parametrize("kind", ["slurm", "flux", "local"])
def test_kubernetes_only_fields_are_one_note_each(kind: str) -> None:
    job = trainjob(spec=PATCHED, trainer={"command": ["x"], "image": "my/image:1"})
    notes = resolve(job, runtime(), cluster(kind)).notes
    assert [note.split(":")[1].strip().split(".")[-1] if "pod spec" in note else note.split(":")[0] for note in notes] \
        == ["nodeSelector", "serviceAccountName", "tolerations", "spec.trainer.image"]
    assert all(f"{kind} cluster" in note or "container runtime" in note for note in notes)
    # what the runtime itself says for Kubernetes (its image) is not repeated: only what the TrainJob sets
    assert not resolve(trainjob(trainer={"command": ["x"]}), runtime(), cluster(kind)).notes
    # on Kubernetes each is honoured, so nothing to say
    assert not resolve(job, runtime(), cluster("kubernetes")).notes


def test_a_cluster_can_require_a_field_honoured() -> None:
    job = trainjob(spec=PATCHED, trainer={"command": ["x"]})
    with pytest.raises(InvalidSpec) as excinfo:
        resolve(job, runtime(), cluster("slurm", mustHonour=["tolerations"]))
    assert "tolerations" in excinfo.value.field and "mustHonour" in excinfo.value.problem
    with pytest.raises(InvalidSpec):
        resolve(job, runtime(), cluster("flux", mustHonour=["*"]))
    assert resolve(job, runtime(), cluster("slurm", mustHonour=["image"])).notes


def _runtime_named(name: str, pod: dict, policy: dict | None = None):
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime", "metadata": {"name": name},
           "spec": {"mlPolicy": {"numNodes": 1, "torch": policy or {}}, "template": {"spec": {"replicatedJobs": [{
               "name": "node", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                            "spec": {"template": {"spec": pod}}}}]}}}}
    return load_documents(yaml.safe_dump(doc))[0]


@pytest.mark.parametrize(("gpus", "nodes", "args", "expected"), [
    ("2", 1, [], ["--rdzv_endpoint=j-node-0-0.j:29500", "full_finetune_distributed", "--config", "llama3_2/1B_full"]),
    ("1", 1, [], ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device"]),
    ("1", 1, ["model.quantize_base=True"], ["lora_finetune_single_device", "--config", "llama3_2/1B_qlora_single_device"]),
    ("2", 1, ["model.lora_attn_modules=[q_proj]"],
     ["--rdzv_endpoint=j-node-0-0.j:29500", "lora_finetune_distributed", "--config", "llama3_2/1B_lora"]),
    ("1", 2, [], ["--rdzv_endpoint=j-node-0-0.j:29500", "full_finetune_distributed", "--config",
                  "llama3_2/1B_full_multinode"]),
])
def test_torchtune_tune_run_gets_kubeflows_recipe_arguments(gpus, nodes, args, expected) -> None:
    from bridge.adapters.kubernetes.render import jobset, launched_command

    rt = _runtime_named("torchtune-llama3.2-1b", {"containers": [{"name": "node", "image": "tune:1", "command": [
        "tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config", "llama3_2/1B_full",
        "dataset.source=parquet", "output_dir=/workspace/output", "tokenizer.path=/workspace/model/t.model"]}]})
    job = builders.trainjob("j", runtime="torchtune-llama3.2-1b", trainer={
        "command": ["tune", "run"], "args": args, "numNodes": nodes,
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}}})
    pod = jobset(resolve(job, rt, cluster("kubernetes")))[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    node = pod["spec"]["containers"][0]
    # the runtime's fixed paths stay; its other items are the TrainJob's to give
    # run as it is on every pod (tune starts torchrun itself), through the launch as every JobSet command
    assert node["command"][:4] == ["hpcbridge", "launch", "--launcher", "plain"]
    assert launched_command(node) == ["tune", "run", *expected, "output_dir=/workspace/output",
                                      "tokenizer.path=/workspace/model/t.model", *args]
    names = {e["name"] for e in node["env"]}
    assert {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"} <= names and "PET_MASTER_ADDR" not in names


def test_env_injection_reaches_the_named_containers() -> None:
    from bridge.adapters.kubernetes.render import jobset

    pod = {"initContainers": [{"name": "preflight", "image": "b"}], "containers": [{"name": "node", "image": "p"}]}
    policy = {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["preflight"]}]}}
    job = builders.trainjob("j", runtime="inj", trainer={"command": ["torchrun"]})
    rendered = jobset(resolve(job, _runtime_named("inj", pod, policy), cluster("kubernetes")))[0]
    init = rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"][0]
    assert {e["name"] for e in init["env"]} == {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK",
                                                "PET_MASTER_ADDR", "PET_MASTER_PORT"}


def test_a_gang_policy_is_honoured_or_refused_and_met_by_an_allocation_elsewhere() -> None:
    from bridge.adapters.flux.render import batch_script
    from bridge.adapters.kubernetes.render import render_objects
    from bridge.adapters.slurm.render import render_script

    doc = dict(TORCH_RUNTIME, spec={**TORCH_RUNTIME["spec"], "podGroupPolicy": {"coscheduling": {}}})
    gang = load_documents(yaml.safe_dump(doc))[0]
    job = trainjob(trainer={"command": ["x"], "numNodes": 3,
                            "resourcesPerNode": {"requests": {"cpu": "2", "memory": "1Gi"}}})
    # a cluster without that gang scheduler: refused, naming the field and the cluster, never dropped
    with pytest.raises(InvalidSpec) as excinfo:
        resolve(job, gang, cluster("kubernetes"))
    assert excinfo.value.field == "runtime torch-like: spec.podGroupPolicy.coscheduling"
    assert "cluster 'kubernetes' has no gang scheduler" in excinfo.value.problem
    volcano_cluster = builders.cluster("kubernetes", "vk", kubernetes={"gangScheduler": "volcano"})
    with pytest.raises(InvalidSpec, match="cluster 'vk' has volcano"):
        resolve(job, gang, volcano_cluster)
    # a cluster that has it: the PodGroup (first) and every pod in it, as Kubeflow's plugin makes them
    cosched = builders.cluster("kubernetes", "ck", kubernetes={"gangScheduler": "coscheduling"})
    group, rendered = render_objects(resolve(job, gang, cosched))
    assert group == {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                     "metadata": {"name": "j", "namespace": "default", "labels": group["metadata"]["labels"]},
                     "spec": {"minMember": 3, "minResources": {"cpu": "6", "memory": "3Gi"},
                              "scheduleTimeoutSeconds": 60}}
    pod = rendered["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "j"
    assert "schedulerName" not in pod["spec"]  # as Kubeflow: the cluster's scheduler profile runs the plugin
    # Slurm and Flux: one allocation is a gang already; the artifact says so
    for backend, render in (("slurm", render_script), ("flux", batch_script)):
        plan = resolve(job, gang, cluster(backend))
        assert not plan.notes
        assert ("# gang: runtime torch-like's podGroupPolicy.coscheduling is met by the allocation itself: all 3 "
                "nodes start together or not at all") in render(plan), backend
