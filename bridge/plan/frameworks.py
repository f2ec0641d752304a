"""What each ML policy decides: the node and process counts, the launcher, the env it reserves, and Kubeflow's
torch and torchtune conventions."""

from __future__ import annotations

from collections.abc import Iterable

from bridge.annotations import FRAMEWORK_LABEL
from bridge.api.runtime import ClusterTrainingRuntime, MLPolicy, TrainingRuntime
from bridge.api.trainjob import TrainJob
from bridge.envnames import XGBOOST_TRACKER_ENV, XGBOOST_TRACKERS
from bridge.errors import InvalidSpec
from bridge.plan.model import EnvEntry, Launcher, NodeResources

#: env names Kubeflow's webhook reserves for each ML policy: the policy sets them, a TrainJob may not
RESERVED_ENV = {
    "torch": {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"},
    "mpi": {"OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_keep_fqdn_hostnames",
            "OMPI_MCA_orte_set_default_slots"},
    "xgboost": {"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"},
}
#: Kubeflow's mpiImplementation names (empty: its default, OpenMPI) → launcher
_MPI_LAUNCHERS = {"OpenMPI": Launcher.OPENMPI, "": Launcher.OPENMPI, "MPICH": Launcher.MPICH, "Intel": Launcher.INTEL}


def framework_of(runtime: TrainingRuntime | ClusterTrainingRuntime) -> str:
    """The runtime's ML policy by name; ``script`` for a batch script's runtime, ``plain`` without a policy."""
    policy = runtime.spec.ml_policy
    framework = policy.framework if policy else "plain"
    if framework == "plain" and (runtime.metadata.labels or {}).get(FRAMEWORK_LABEL) == "sbatch":
        framework = "script"
    return framework


def check_reserved_env(trainjob: TrainJob, framework: str) -> None:
    """The TrainJob may not set what the policy sets (Kubeflow's webhook refuses it too)."""
    spec_trainer = trainjob.spec.trainer
    for index, entry in enumerate((spec_trainer.env if spec_trainer else None) or []):
        if entry.name in RESERVED_ENV.get(framework, set()):
            raise InvalidSpec(f"spec.trainer.env[{index}].name", entry.name,
                              f"reserved by the {framework} policy; hpc-bridge sets it")


def env_injection(policy: MLPolicy | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The torch policy's ``envInjection`` targets: (replicated job, container names) that get PET_* too."""
    return tuple((t.job_name, tuple(t.container_names))
                 for t in ((policy.torch.env_injection.targets or []) if policy and policy.torch
                           and policy.torch.env_injection else []))


def node_count(trainjob: TrainJob, policy: MLPolicy | None) -> int:
    """numNodes: the TrainJob's, else the runtime policy's, else 1."""
    trainer = trainjob.spec.trainer
    if trainer and trainer.num_nodes is not None:
        nodes, where = trainer.num_nodes, "spec.trainer.numNodes"
    elif policy and policy.num_nodes is not None:
        nodes, where = policy.num_nodes, "runtime spec.mlPolicy.numNodes"
    else:
        return 1
    if nodes < 1:
        raise InvalidSpec(where, nodes, "must be at least 1 to run anything")
    return nodes


def procs_and_launcher(trainjob: TrainJob, policy: MLPolicy | None, framework: str, resources: NodeResources) -> tuple[int, Launcher]:
    """Processes per node and how they start, by policy: the TrainJob's numProcPerNode, else the policy's
    default as Kubeflow derives it (per GPU, per CPU, or one)."""
    trainer = trainjob.spec.trainer
    explicit = trainer.num_proc_per_node if trainer else None
    if framework == "mpi":
        assert policy is not None and policy.mpi is not None  # what makes the framework "mpi"
        launcher = _MPI_LAUNCHERS[policy.mpi.mpi_implementation or ""]
        runtime_value = policy.mpi.num_proc_per_node or 1
        if explicit is not None:
            return explicit, launcher
        # Kubeflow: a runtime value of 1 with several GPUs becomes one slot per GPU
        if runtime_value == 1 and resources.gpus > 1:
            return resources.gpus, launcher
        return runtime_value, launcher
    if framework == "torch":
        if explicit is not None:
            return explicit, Launcher.TORCHRUN
        if resources.gpus:
            return resources.gpus, Launcher.TORCHRUN
        return resources.cpu_count or 1, Launcher.TORCHRUN
    if framework == "xgboost":
        # one worker per GPU, as Kubeflow counts them (DMLC_NUM_WORKER); hpcbridge launch starts each
        return explicit or resources.gpus or 1, Launcher.PLAIN
    if framework == "flux":
        assert policy is not None and policy.flux is not None  # what makes the framework "flux"
        return explicit or policy.flux.num_proc_per_node or 1, Launcher.FLUX
    if framework == "script":
        return explicit or 1, Launcher.SCRIPT
    return explicit or 1, Launcher.PLAIN




def gpu_note(framework: str, procs: int, resources: NodeResources, job: str) -> tuple[str, ...]:
    """A GPU job with more processes per node than GPUs per node: some processes share a GPU, which NCCL
    refuses ("Duplicate GPU detected") and memory rarely allows. Said once, not refused: a process may use no
    GPU at all (a data loader, a parameter server)."""
    if not resources.gpus or procs <= resources.gpus or framework in ("jax", "script"):
        return ()
    return (f"spec.trainer.numProcPerNode: {procs} processes per node share {resources.gpus} "
            f"{resources.gpu_resource} per node in replicated job {job!r}: some processes share a GPU "
            "(NCCL refuses two ranks on one GPU)",)


def check_xgboost_tracker(framework: str, env: Iterable[EnvEntry]) -> None:
    """The xgboost tracker variable only on an xgboost runtime, and only naming a tracker hpc-bridge starts."""
    for entry in env:
        if entry.name == XGBOOST_TRACKER_ENV and (framework != "xgboost" or entry.value not in XGBOOST_TRACKERS):
            raise InvalidSpec(f"spec.trainer.env[{XGBOOST_TRACKER_ENV}]", entry.value,
                              f"use one of {', '.join(XGBOOST_TRACKERS)}" if framework == "xgboost" else
                              f"only an xgboost runtime has a tracker; this one's policy is {framework}")


TORCHTUNE_ENTRYPOINT = ("tune", "run")
#: runtime command items a torchtune TrainJob keeps (where the runtime put the model, tokenizer and output)
_TORCHTUNE_KEPT = {"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file"}


def torchtune_arguments(args: Iterable[str], runtime_command: Iterable[str], runtime_name: str, nodes: int,
                        nproc: str, gpus: int, rdzv_endpoint: str | None) -> list[str]:
    """What Kubeflow appends to ``tune run``: the rendezvous endpoint when more than one process runs, the
    recipe and config for the node count, GPUs and LoRA/QLoRA arguments (*args*, the TrainJob's), and the
    runtime's fixed paths. Without *rdzv_endpoint* (Slurm, Flux, local) the process counts are given instead,
    and ``hpcbridge launch`` gives torchrun its node rank and master as PET_* variables."""
    args = list(args)

    def enabled(item: str) -> bool:
        return any(key.strip() and item in key and value.strip().lower() == "true"
                   for key, _, value in (arg.partition("=") for arg in args if "=" in arg))

    qlora = enabled("model.quantize_base") and not enabled("model.use_dora")
    lora = any("model.lora_attn_modules" in arg for arg in args)
    one_process = nproc == "1" or gpus == 1
    out: list[str] = []
    if nodes > 1 or (nproc.isdigit() and int(nproc) > 1) or (nproc == "auto" and gpus > 1):
        out += [f"--rdzv_endpoint={rdzv_endpoint}"] if rdzv_endpoint else \
            [f"--nnodes={nodes}", f"--nproc_per_node={nproc}"]
    recipe, suffix = "full_finetune_distributed", "_full"
    if nodes == 1 and one_process:
        recipe, suffix = (("lora_finetune_single_device", "_qlora_single_device") if qlora else
                          ("lora_finetune_single_device", "_lora_single_device") if lora else
                          ("full_finetune_single_device", "_full_single_device"))
    elif nodes == 1 and qlora:
        recipe, suffix = "lora_finetune_distributed", "_qlora"
    elif nodes == 1 and lora:
        recipe, suffix = "lora_finetune_distributed", "_lora"
    elif nodes > 1:
        suffix = "_full_multinode"
    fields = runtime_name.split("-")
    model = f"{fields[1].replace('.', '_')}/{fields[2].upper()}" if len(fields) == 3 else ""
    out += [recipe, "--config", f"{model}{suffix}"]
    out += [item for item in runtime_command if item.split("=")[0] in _TORCHTUNE_KEPT]
    return out
