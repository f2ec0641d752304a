"""TrainJob + runtime + cluster → LaunchPlan, the backend-neutral description every adapter renders.

All defaulting and merging happens here, once, so no two adapters can disagree about it: Kubeflow's precedence
rules for the trainer fields, the runtime patches, the ``hpcbridge.io/*`` annotations and the cluster's defaults.
Adapters only translate a finished plan. One module per concept; ``resolve`` composes them.
"""

from bridge.plan.arrays import MAX_EXPANDED_ARRAY, array_elements, expand_array
from bridge.plan.extensions import KubernetesPlan, SlurmPlan
from bridge.plan.fidelity import gang_note
from bridge.plan.frameworks import (
    RESERVED_ENV,
    TORCHTUNE_ENTRYPOINT,
    torchtune_arguments,
)
from bridge.plan.limits import MAX_PROCS_PER_NODE, check_identity
from bridge.plan.merge import strategic_merge
from bridge.plan.model import (
    KUBEFLOW_WORKSPACE,
    MPI_LAUNCHERS,
    ONCE_PER_JOB,
    STAGED_DIR_ENV,
    TORCH_MASTER_PORT,
    TRAINER_CONTAINER,
    BackendOptions,
    BatchScript,
    EnvEntry,
    Launcher,
    LaunchPlan,
    NodeResources,
    PodGroupPlan,
    StagingPlan,
)
from bridge.plan.options import (
    SBATCH_DROPPED_OFF_SLURM,
    SLURM_GPU_OPTIONS,
    SLURM_LAYOUT_NONE,
    SLURM_LAYOUT_OPTIONS,
    backend_options,
    dropped_note,
    parse_slurm_layout,
    slurm_layout_counts,
    slurm_layout_text,
)
from bridge.plan.resolve import resolve
from bridge.plan.select import derive_uid, find_runtime, requested_cluster, select_cluster
from bridge.plan.staging import (
    ACCOUNT_ENV_LINE,
    STAGE_COMMENT,
    STAGE_INPUT_END,
    STAGE_INPUT_ENV,
    check_shell_env,
    job_environment,
    script_env,
    stage_argv,
    stage_command,
    stage_input,
    stage_input_environment,
)
from bridge.plan.traits import (
    BACKEND_TRAITS,
    MAX_NODES_DEFAULT,
    MAX_TIME_LIMIT_SECONDS,
    BackendTraits,
    backend_traits,
    traits_of,
)

__all__ = [
    "ACCOUNT_ENV_LINE", "BACKEND_TRAITS", "BackendTraits", "backend_traits", "traits_of", "KUBEFLOW_WORKSPACE", "MAX_EXPANDED_ARRAY", "MAX_NODES_DEFAULT", "MAX_PROCS_PER_NODE", "MAX_TIME_LIMIT_SECONDS", "MPI_LAUNCHERS", "ONCE_PER_JOB",
    "RESERVED_ENV", "SBATCH_DROPPED_OFF_SLURM", "SLURM_GPU_OPTIONS", "SLURM_LAYOUT_NONE",
    "SLURM_LAYOUT_OPTIONS", "STAGED_DIR_ENV", "STAGE_COMMENT", "STAGE_INPUT_END", "STAGE_INPUT_ENV",
    "TORCHTUNE_ENTRYPOINT", "TORCH_MASTER_PORT", "TRAINER_CONTAINER", "BackendOptions", "BatchScript", "EnvEntry",
    "KubernetesPlan", "LaunchPlan", "Launcher", "NodeResources", "PodGroupPlan", "SlurmPlan", "StagingPlan", "array_elements", "backend_options",
    "check_identity", "check_shell_env", "derive_uid", "dropped_note", "expand_array", "find_runtime", "gang_note",
    "job_environment", "parse_slurm_layout", "requested_cluster", "resolve", "script_env", "select_cluster",
    "slurm_layout_counts", "slurm_layout_text", "stage_argv", "stage_command", "stage_input",
    "stage_input_environment", "strategic_merge", "torchtune_arguments",
]
