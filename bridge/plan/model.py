"""The plan's objects: LaunchPlan, the backend-neutral description every adapter renders, and its parts."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from bridge.api.storage import StageSource
from bridge.plan.extensions import KubernetesPlan, SlurmPlan

TRAINER_CONTAINER = "node"
TORCH_MASTER_PORT = 29500
#: namespace for uids derived from a TrainJob's identity when it has none (file input)
UID_NAMESPACE = uuid.UUID("6f1c3b4e-2a7d-5e8f-9b0a-1c2d3e4f5a6b")


class Launcher(StrEnum):
    """How the processes of one job are started inside its allocation."""

    OPENMPI = "openmpi"
    MPICH = "mpich"
    INTEL = "intel"
    TORCHRUN = "torchrun"
    #: every node runs the command once (jax, xgboost, no policy)
    PLAIN = "plain"
    #: Flux's own PMI starts the ranks (flux policy)
    FLUX = "flux"
    #: a batch script: runs once on the first node and starts its own steps (srun, mpirun) itself
    SCRIPT = "script"


MPI_LAUNCHERS = frozenset({Launcher.OPENMPI, Launcher.MPICH, Launcher.INTEL})
#: launchers started once for the whole job (on the first node), not once per node
ONCE_PER_JOB = frozenset({*MPI_LAUNCHERS, Launcher.FLUX, Launcher.SCRIPT})


@dataclass(frozen=True)
class NodeResources:
    """What one node asks for. ``None`` means unspecified (the scheduler's default)."""

    cpu: Fraction | None = None
    memory_bytes: int | None = None
    gpus: int = 0
    #: the extended resource the GPUs come from, e.g. ``nvidia.com/gpu``
    gpu_resource: str | None = None
    #: other extended resources, verbatim (name, quantity text)
    extra: tuple[tuple[str, str], ...] = ()
    #: every merged request as written (name, quantity text), for backends that speak Kubernetes quantities
    quantities: tuple[tuple[str, str], ...] = ()
    #: requests and limits as given, each merged per key (TrainJob over runtime), as Kubeflow puts them on the
    #: trainer container; the scheduler-facing numbers above fold them into one
    given_requests: tuple[tuple[str, str], ...] = ()
    given_limits: tuple[tuple[str, str], ...] = ()

    @property
    def cpu_count(self) -> int | None:
        return None if self.cpu is None else max(1, math.ceil(self.cpu))

    @property
    def memory_mib(self) -> int | None:
        # integer division: a float cannot hold every byte count a quantity can say
        return None if self.memory_bytes is None else max(1, -(-self.memory_bytes // 2**20))


@dataclass(frozen=True)
class EnvEntry:
    name: str
    value: str | None = None
    #: Kubernetes valueFrom, only meaningful on the kubernetes backend
    value_from: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class BackendOptions:
    """Scheduler knobs the Kubeflow API has no field for; from ``hpcbridge.io/*`` annotations and cluster defaults."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    array: str | None = None
    dependency: str | None = None
    output: str | None = None
    error: str | None = None
    #: extra sbatch options carried verbatim (``hpcbridge.io/sbatch.<option>``), sorted by option
    sbatch_extra: tuple[tuple[str, str], ...] = ()
    #: the job name as a converted batch script had it (``hpcbridge.io/slurm-job-name``): Slurm's job name, and
    #: SLURM_JOB_NAME where a batch script runs elsewhere; other backends name the job after the TrainJob
    slurm_job_name: str | None = None
    #: off Slurm, the ``hpcbridge.io/sbatch.<option>`` values left out, each said in a plan note:
    #: (option, value, why it changes nothing here) — see ``SBATCH_DROPPED_OFF_SLURM``
    dropped: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class BatchScript:
    """A batch script as the user gave it, for a backend that runs batch scripts as they are (Slurm).

    Such a backend sends ``text`` unchanged with the user's sbatch ``flags`` and adds only hpc-bridge's
    identity; every other backend runs what the script means (the TrainJob converted from it), or refuses
    it when ``only_verbatim`` says why it has no TrainJob form (a heterogeneous job).
    """

    text: str
    #: the file it was read from (None for stdin): sbatch names a job after it and records it as Command
    path: str | None
    #: the sbatch flags given after the file, verbatim, in order
    flags: tuple[str, ...] = ()
    #: the job name ``-J`` gives it; None: sbatch names it after its file (``sbatch`` from stdin)
    job_name: str | None = None
    #: the user's ``--comment`` (script or flags), which hpc-bridge's identity is appended to
    comment: str | None = None
    #: why the script runs only as itself, e.g. "a heterogeneous job (#SBATCH hetjob, line 3)"
    only_verbatim: str | None = None
    #: what sbatch itself would warn about (deprecated spellings); conversion notes do not apply to it
    notes: tuple[str, ...] = ()
    #: (annotation, directive, conversion note) for each ``hpcbridge.io/*`` annotation a directive became, e.g.
    #: ("hpcbridge.io/sbatch.mail-type", "#SBATCH line 6: --mail-type", "--mail-type=END: … passed through …"):
    #: where the script runs by its meaning, errors and notes about the annotation name the line instead
    origins: tuple[tuple[str, str, str | None], ...] = ()


@dataclass(frozen=True)
class PodGroupPlan:
    """A runtime's gang policy: ``coscheduling`` (scheduler-plugins) or ``volcano``, as Kubeflow reads it."""

    kind: str
    #: coscheduling's scheduleTimeoutSeconds (Kubeflow's default 60)
    schedule_timeout_seconds: int | None = None
    #: volcano's networkTopology, as the runtime gives it
    network_topology: Mapping[str, Any] | None = None
    #: the pods' schedulerName (the cluster's, or "volcano"); None leaves the pods' own
    scheduler_name: str | None = None


@dataclass(frozen=True)
class StagingPlan:
    """Data and models fetched before the trainer starts: on Kubernetes by the runtime's initializer jobs, on
    the HPC backends by one ``hpcbridge stage`` step into the cluster's shared ``stagingDir``."""

    sources: tuple[StageSource, ...]
    #: the cluster's stagingDir (empty on Kubernetes, where the initializer volume holds the data)
    dir: str = ""
    secrets_dir: str | None = None
    #: the plan's tenant: its cache and job folders are its own, under ``<dir>/tenants/<tenant>``
    tenant: str | None = None

    @property
    def root(self) -> str:
        """The folder of this plan's cache and job folders (the whole stagingDir for the CLI)."""
        from bridge.staging.phase import job_root

        return job_root(self.dir, self.tenant)

    def path(self, uid: str, role: str) -> str:
        """Where the trainer finds *role*'s data: Kubeflow's /workspace/<role> in a pod, else the job's link
        into the shared cache."""
        return f"{KUBEFLOW_WORKSPACE}/{role}" if not self.dir else f"{self.root}/jobs/{uid}/{role}"


#: where Kubeflow's initializers leave the data and its trainer reads it (the ``initializer`` volume)
KUBEFLOW_WORKSPACE = "/workspace"
#: the variables that tell the trainer where the staged data is, on every backend
STAGED_DIR_ENV = {"dataset": "HPCBRIDGE_DATASET_DIR", "model": "HPCBRIDGE_MODEL_DIR"}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything an adapter needs, decided. Rendering a plan is pure: same plan, same bytes."""

    name: str
    namespace: str
    uid: str
    cluster: str
    backend: str
    framework: str
    launcher: Launcher
    nodes: int
    procs_per_node: int
    resources: NodeResources
    command: tuple[str, ...]
    env: tuple[EnvEntry, ...]
    image: str | None = None
    container_runtime: str = "none"
    workdir: str | None = None
    time_limit_seconds: int | None = None
    suspend: bool = False
    options: BackendOptions = field(default_factory=BackendOptions)
    launch_command: tuple[str, ...] = ("hpcbridge", "launch")
    rdzv_port: int = TORCH_MASTER_PORT
    runtime_name: str = ""
    #: the batch script this plan was converted from, when the input was one
    batch_script: BatchScript | None = None
    #: what the plan cannot honour on its cluster (Kubernetes-only fields), one line each for the user
    notes: tuple[str, ...] = ()
    #: the runtime's podGroupPolicy: on Kubernetes a PodGroup of the cluster's gang scheduler; on Slurm and Flux
    #: the allocation itself (every node starts together), which the artifact says
    pod_group: PodGroupPlan | None = None
    #: the TrainJob's initializers: what is staged before the trainer starts
    staging: StagingPlan | None = None
    #: the tenant this plan runs for (a BridgeCluster ``spec.tenants`` entry's name) when it came from a
    #: Kubernetes namespace through the operator; None for the CLI, which runs as the Unix user who types it
    tenant: str | None = None
    #: what only the Kubernetes backend reads: set for a Kubernetes cluster's plan, None for any other
    kubernetes: KubernetesPlan | None = None
    #: what only the Slurm backend reads: set for a Slurm cluster's plan, None for any other
    slurm: SlurmPlan | None = None

    def on_kubernetes(self) -> KubernetesPlan:
        """The Kubernetes part, which only a plan resolved for a Kubernetes cluster has."""
        if self.kubernetes is None:
            raise ValueError(f"plan {self.name!r} was made for a {self.backend} cluster, not a Kubernetes one")
        return self.kubernetes

    def on_slurm(self) -> SlurmPlan:
        """The Slurm part, which only a plan resolved for a Slurm cluster has."""
        if self.slurm is None:
            raise ValueError(f"plan {self.name!r} was made for a {self.backend} cluster, not a Slurm one")
        return self.slurm

    @property
    def total_procs(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def job_name(self) -> str:
        return self.name

    @property
    def exec_argv(self) -> tuple[str, ...]:
        """The training command, wrapped in the cluster's container runtime when the plan has an image."""
        if not self.image or self.container_runtime == "none":
            return self.command
        # staged data where Kubeflow's trainers look for it: the job's staging directory as /workspace, and the
        # stagingDir (a tenant's: its own folder of it) at its own path (the job's dataset and model link into
        # its cache)
        mounts = () if not self.staging or not self.staging.dir else (
            (self.staging.root, self.staging.root), (f"{self.staging.root}/jobs/{self.uid}", KUBEFLOW_WORKSPACE))
        if self.container_runtime in ("apptainer", "singularity"):
            binds = tuple(arg for host, inside in mounts for arg in ("--bind", f"{host}:{inside}"))
            return (self.container_runtime, "exec", *binds, f"docker://{self.image}", *self.command)
        if self.container_runtime == "podman":
            volumes = tuple(arg for host, inside in mounts for arg in ("-v", f"{host}:{inside}"))
            return ("podman", "run", "--rm", "--network=host", *volumes, self.image, *self.command)
        enroot = tuple(arg for host, inside in mounts for arg in ("--mount", f"{host}:{inside}"))
        return ("enroot", "start", *enroot, self.image, *self.command)
