"""TrainJob + runtime + cluster → LaunchPlan, the backend-neutral description every adapter renders.

All defaulting and merging happens here, once, so no two adapters can disagree about it: Kubeflow's precedence rules for the trainer
fields, the runtime patches, the ``hpcbridge.io/*`` annotations and the cluster's defaults. Adapters only
translate a finished plan.
"""

from __future__ import annotations

import copy
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from fractions import Fraction
from typing import Any

from pydantic import ValidationError

from bridge import tenancy
from bridge.annotations import (
    ARRAY_ANNOTATION,
    CLUSTER_ANNOTATION,
    KNOBS,
    PREFIX,
    SBATCH_PASSTHROUGH_PREFIX,
    SLURM_LAYOUT_ANNOTATION,
    WORKDIR_ANNOTATION,
)
from bridge.api.cluster import (
    CONSTRAINT,
    DIRECTIVE_SAFE,
    PRIVILEGED_OPTIONS,
    SLURM_NAME,
    BridgeCluster,
    Tenant,
)
from bridge.api.k8s import Container, EnvVar, JobSetSpec, ReplicatedJob, ResourceRequirements
from bridge.api.loader import invalid_from_validation
from bridge.api.names import (
    check_dns1035_label,
    check_dns1123_label,
    check_dns1123_subdomain,
    check_uid,
)
from bridge.api.quantity import parse_quantity
from bridge.api.runtime import ClusterTrainingRuntime, MLPolicy, TrainingRuntime
from bridge.api.storage import StageSource
from bridge.api.trainjob import MANAGED_BY_BRIDGE, DatasetInitializer, TrainJob
from bridge.convert.sbatch.values import array_problem
from bridge.envnames import XGBOOST_TRACKER_ENV, XGBOOST_TRACKERS
from bridge.errors import InvalidSpec
from bridge.shell import SHELL_ENV_NAME

FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_CONTAINER = "node"
TORCH_MASTER_PORT = 29500
#: namespace for uids derived from a TrainJob's identity when it has none (file input)
_UID_NAMESPACE = uuid.UUID("6f1c3b4e-2a7d-5e8f-9b0a-1c2d3e4f5a6b")

#: env names Kubeflow's webhook reserves for each ML policy: the policy sets them, a TrainJob may not
RESERVED_ENV = {
    "torch": {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"},
    "mpi": {"OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_keep_fqdn_hostnames",
            "OMPI_MCA_orte_set_default_slots"},
    "xgboost": {"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"},
}
_SAFE_DIRECTIVE = DIRECTIVE_SAFE
_DEPENDENCY = re.compile(r"^(singleton|[a-z_]+(:[0-9_+]+)+)([,?](singleton|[a-z_]+(:[0-9_+]+)+))*$")
#: dependencies off Slurm, on that backend's own job ids (a local uid, namespace/jobset, a Flux ƒ… id): Flux
#: keeps them (RFC 26), hpc-bridge keeps them for the local cluster and Kubernetes; all items must hold (",")
_KEPT_DEPENDENCY_ITEM = r"(singleton|(afterok|afterany|afternotok)(:[A-Za-z0-9ƒ][A-Za-z0-9ƒ._/-]{0,252})+)"
_KEPT_DEPENDENCY = re.compile(rf"^{_KEPT_DEPENDENCY_ITEM}(,{_KEPT_DEPENDENCY_ITEM})*$")
_CONSTRAINT = CONSTRAINT

# What a plan may ask for, checked before any renderer runs (README "Security"): no renderer allocates in
# proportion to a number nobody checked. Nodes: Kubernetes supports clusters of at most 5,000 nodes (and a
# larger MPI hostfile no longer fits a ConfigMap); the local cluster emulates nodes as process groups on this
# machine; Slurm and Flux count nodes in 32-bit fields, and no machine they run has 100,000.
MAX_NODES = {"kubernetes": 5_000, "local": 64}
MAX_NODES_DEFAULT = 100_000
#: ranks (MPI slots, torchrun workers) per node
MAX_PROCS_PER_NODE = 1_024
#: a time limit an HPC scheduler can hold (Slurm keeps minutes in 32 bits; ~68 years)
MAX_TIME_LIMIT_SECONDS = 2**31 - 1


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


_MPI_LAUNCHERS = {"OpenMPI": Launcher.OPENMPI, "": Launcher.OPENMPI, "MPICH": Launcher.MPICH, "Intel": Launcher.INTEL}
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
    #: spellings a converted batch script keeps on Slurm; other backends have the meaning in fields already:
    #: the job name as sbatch had it (``hpcbridge.io/slurm-job-name``), and the GPU option
    #: (``hpcbridge.io/slurm-gpus``, e.g. ``gres=gpu:a100:2``)
    slurm_job_name: str | None = None
    slurm_gpus: str | None = None
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

    def where(self, field: str) -> str | None:
        """The directive an annotation field (``metadata.annotations[KEY]``) came from; None if none did."""
        return next((where for key, where, _ in self.origins if field == f"metadata.annotations[{key}]"), None)


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


#: the label Kueue reads a job's LocalQueue from
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


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
    ssh_auth_mount_path: str | None = None
    run_launcher_as_node: bool = False
    rdzv_port: int = TORCH_MASTER_PORT
    #: the runtime's JobSet template with runtime patches and trainer overrides merged (kubernetes backend)
    jobset_template: Mapping[str, Any] = field(default_factory=dict)
    runtime_name: str = ""
    runtime_kind: str = "ClusterTrainingRuntime"
    labels: Mapping[str, str] = field(default_factory=dict)
    #: the JobSet's labels and annotations from the runtime template and runtime patches (kubernetes backend)
    jobset_metadata: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the batch script this plan was converted from, when the input was one
    batch_script: BatchScript | None = None
    #: what the plan cannot honour on its cluster (Kubernetes-only fields), one line each for the user
    notes: tuple[str, ...] = ()
    #: ``command`` as the trainer container's command and args, kept apart as Kubeflow keeps them (kubernetes)
    container_command: tuple[str, ...] = ()
    container_args: tuple[str, ...] = ()
    #: whether the TrainJob has a ``trainer`` section: Kubeflow's framework plugins inject their environment
    #: (PET_*, JAX_*, DMLC_*) only then
    trainer_given: bool = True
    #: whether numProcPerNode was given (Kubeflow's torch plugin says "auto" otherwise, when there are GPUs)
    procs_per_node_given: bool = False
    #: whether the TrainJob gave the command itself (Kubeflow's torchtune rewriting keys on it)
    trainer_command_given: bool = False
    #: the torch policy's ``envInjection`` targets: (replicated job, container names) that get PET_* too
    env_injection: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the cluster's own copies of images (kubernetes): (image named, image run), and the pull policy to write
    image_map: tuple[tuple[str, str], ...] = ()
    image_pull_policy: str | None = None
    #: the runtime's podGroupPolicy: on Kubernetes a PodGroup of the cluster's gang scheduler; on Slurm and Flux
    #: the allocation itself (every node starts together), which the artifact says
    pod_group: PodGroupPlan | None = None
    #: the Kueue LocalQueue the JobSet is queued in (kubernetes): submit --queue, else the TrainJob's
    #: kueue.x-k8s.io/queue-name label, else the cluster's spec.kubernetes.queue
    queue: str | None = None
    #: the TrainJob's initializers: what is staged before the trainer starts
    staging: StagingPlan | None = None
    #: the tenant this plan runs for (a BridgeCluster ``spec.tenants`` entry's name) when it came from a
    #: Kubernetes namespace through the operator; None for the CLI, which runs as the Unix user who types it
    tenant: str | None = None
    #: on Slurm, a converted batch script's own node and task options (``hpcbridge.io/slurm-layout``): which of
    #: ``nodes`` and ``ntasks-per-node`` the job asks for (``nodes`` from ``nodes``, ``ntasks-per-node`` from
    #: ``procs_per_node``; ``--ntasks`` and a node range are passed through), so a node count the script left to
    #: Slurm stays Slurm's. None: hpc-bridge's own layout, ``--nodes`` and ``--ntasks-per-node`` both stated
    slurm_layout: tuple[str, ...] | None = None

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


def derive_uid(trainjob: TrainJob) -> str:
    """The TrainJob's uid, or for a file without one a uid derived from namespace/name.

    Deriving it (instead of a random one) is what makes ``submit`` of the same file idempotent and lets
    ``render`` print byte-for-byte what ``submit`` sends.
    """
    if trainjob.metadata.uid:
        return trainjob.metadata.uid
    return str(uuid.uuid5(_UID_NAMESPACE, f"{trainjob.namespace}/{trainjob.name}"))


def find_runtime(trainjob: TrainJob, runtimes: Iterable[TrainingRuntime | ClusterTrainingRuntime],
                 ) -> TrainingRuntime | ClusterTrainingRuntime:
    """The runtime ``spec.runtimeRef`` names (namespaced TrainingRuntimes must share the TrainJob's namespace)."""
    ref = trainjob.spec.runtime_ref
    kind = ref.resolved_kind
    candidates = []
    for runtime in runtimes:
        if runtime.kind != kind or runtime.name != ref.name:
            continue
        if kind == "TrainingRuntime" and (runtime.metadata.namespace or "default") != trainjob.namespace:
            continue
        candidates.append(runtime)
    if not candidates:
        from bridge.api.catalog import builtin_runtime_names

        available = sorted({r.name for r in runtimes if r.kind == kind}
                           | {n for k, n in getattr(runtimes, "seen", ()) if k == kind}
                           | (set(builtin_runtime_names()) if kind == "ClusterTrainingRuntime" else set()))
        hint = f"; known: {', '.join(available)}" if available else ""
        unreadable = getattr(runtimes, "unreadable", ())
        if unreadable:
            hint += f"; {len(unreadable)} runtime file(s) could not be read, the first: {unreadable[0]}"
        raise InvalidSpec("spec.runtimeRef.name", ref.name, f"no {kind} with this name{hint}")
    return candidates[-1]


def requested_cluster(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime | None, override: str | None, default: str) -> str:
    """The cluster name asked for: the explicit choice, else the TrainJob's annotation, else the runtime's,
    else *default*; ``auto`` asks the orchestration layer to place the job (bridge.placement)."""
    name = override
    if name is None:
        name = (trainjob.metadata.annotations or {}).get(CLUSTER_ANNOTATION)
    if name is None and runtime is not None:
        meta = runtime.metadata
        name = (meta.annotations or {}).get(CLUSTER_ANNOTATION) or (meta.labels or {}).get(CLUSTER_ANNOTATION)
    return name or default


def select_cluster(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime | None,
                   clusters: Mapping[str, BridgeCluster], override: str | None = None,
                   default: str = "local") -> BridgeCluster:
    """The target cluster: the explicit choice, else the TrainJob's annotation, else the runtime's, else
    *default* (``local`` for the CLI; the operator's own)."""
    name = requested_cluster(trainjob, runtime, override, default)
    if not name:
        raise InvalidSpec(f"metadata.annotations[{CLUSTER_ANNOTATION}]", None,
                          f"name the cluster to run on, on the TrainJob or its runtime; configured: "
                          f"{', '.join(sorted(clusters)) or 'none'}")
    if name not in clusters:
        raise InvalidSpec(f"metadata.annotations[{CLUSTER_ANNOTATION}]", name,
                          f"no such cluster; configured: {', '.join(sorted(clusters))}")
    return clusters[name]


def resolve(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster,
            tenant: Tenant | None = None) -> LaunchPlan:
    """Decide everything about running *trainjob* on *cluster*; for *tenant* (the operator's), only within
    what its mapping allows."""
    if trainjob.spec.managed_by not in (None, MANAGED_BY_BRIDGE) and cluster.spec.type != "kubernetes":
        raise InvalidSpec("spec.managedBy", trainjob.spec.managed_by,
                          f"this TrainJob is managed by another controller; set it to {MANAGED_BY_BRIDGE} or omit it")
    namespace = trainjob.namespace
    if tenant is None and not cluster.spec.allows_namespace(namespace):
        raise InvalidSpec("metadata.namespace", namespace, f"cluster {cluster.name!r} does not accept this namespace")

    policy = runtime.spec.ml_policy
    framework = policy.framework if policy else "plain"
    if framework == "plain" and (runtime.metadata.labels or {}).get(FRAMEWORK_LABEL) == "sbatch":
        framework = "script"
    template = _merged_template(trainjob, runtime)
    trainer_job, container = _trainer_container(template, runtime.name)
    spec_trainer = trainjob.spec.trainer

    command = tuple((spec_trainer.command if spec_trainer and spec_trainer.command is not None else container.command) or ())
    args = tuple((spec_trainer.args if spec_trainer and spec_trainer.args is not None else container.args) or ())
    argv = command + args
    if not argv and cluster.spec.type != "kubernetes":
        # on Kubernetes the image's entrypoint runs, as with Kubeflow; elsewhere nothing would
        raise InvalidSpec("spec.trainer.command", None,
                          f"no command to run: neither the TrainJob nor runtime {runtime.name!r} gives one (on "
                          f"Kubernetes the image's entrypoint would run; a {cluster.spec.type} cluster runs no "
                          "image entrypoint)")
    image = (spec_trainer.image if spec_trainer and spec_trainer.image else None) or container.image
    if not image and cluster.spec.type == "kubernetes":
        image = cluster.spec.defaults.image

    env = _merged_env(container.env or [], (spec_trainer.env if spec_trainer else None) or [])
    for index, entry in enumerate((spec_trainer.env if spec_trainer else None) or []):
        if entry.name in RESERVED_ENV.get(framework, set()):
            raise InvalidSpec(f"spec.trainer.env[{index}].name", entry.name,
                              f"reserved by the {framework} policy; hpc-bridge sets it")

    resources = _node_resources(container.resources, spec_trainer.resources_per_node if spec_trainer else None)

    nodes = _node_count(trainjob, policy)
    procs, launcher = _procs_and_launcher(trainjob, policy, framework, resources)
    mpi = policy.mpi if policy else None

    nodes_field = "spec.trainer.numNodes" if spec_trainer and spec_trainer.num_nodes is not None \
        else "runtime spec.mlPolicy.numNodes"
    _check_bounds(cluster, nodes, nodes_field, procs, trainjob.spec.active_deadline_seconds)

    annotations = dict(trainjob.metadata.annotations or {})
    options = backend_options(annotations, cluster, namespace, tenant)
    _check_privileged(options, cluster)
    options = _drop_slurm_only(options, cluster, nodes, procs)
    slurm_layout = _slurm_layout(annotations.get(SLURM_LAYOUT_ANNOTATION), options, cluster, launcher, nodes, procs,
                                 nodes_field)
    workdir = annotations.get(WORKDIR_ANNOTATION) or container.working_dir or cluster.spec.defaults.workdir
    if workdir is not None and not workdir:
        raise InvalidSpec(f"metadata.annotations[{WORKDIR_ANNOTATION}]", workdir, "must not be empty")
    if workdir is not None and cluster.spec.type != "kubernetes":
        # the working directory becomes '#SBATCH --chdir', a jobspec cwd or a local path
        source = f"metadata.annotations[{WORKDIR_ANNOTATION}]" \
            if annotations.get(WORKDIR_ANNOTATION) else \
            f"runtime {runtime.name}: container node workingDir" if container.working_dir else \
            f"cluster {cluster.name}: spec.defaults.workdir"
        _check_directive_value(source, workdir)
    _check_free_text(argv, env)
    launch_command = tuple(cluster.spec.defaults.launch_command or ("hpcbridge", "launch"))
    pod_group = _pod_group(runtime, cluster)
    notes = () if cluster.spec.type == "kubernetes" else \
        _unhonoured(trainjob, runtime, template, trainer_job, container, image, cluster)
    queue = _queue(trainjob, cluster)
    staging = _staging(trainjob, runtime, template, cluster, tenant.name if tenant is not None else None)
    uid = derive_uid(trainjob)
    if cluster.spec.type != "kubernetes" and spec_trainer is not None and spec_trainer.command is not None \
            and tuple(command) == TORCHTUNE_ENTRYPOINT:
        # Kubeflow's torchtune rewriting, as its torch plugin does it in the pod: the recipe and config
        nproc = "auto" if resources.gpus and spec_trainer.num_proc_per_node is None else str(procs)
        argv = (*command, *torchtune_arguments(args, container.command or (), runtime.name, nodes,
                                               str(procs) if nproc == "auto" else nproc, resources.gpus, None), *args)
    if staging is not None and staging.dir and not (image and cluster.spec.defaults.container_runtime != "none"):
        argv, moved = _workspace_paths(argv, staging.path(uid, ""))
        if moved:
            notes += (f"spec.trainer.command: Kubeflow's {KUBEFLOW_WORKSPACE} is this job's staging directory "
                      f"{staging.path(uid, '').rstrip('/')} on cluster {cluster.name} (no container to mount it in)",)
    notes += _gpu_note(framework, procs, resources, trainer_job.name)
    notes += tuple(dropped_note(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}{option}]", option, value, why,
                                cluster.name, cluster.spec.type) for option, value, why in options.dropped)
    _check_xgboost_tracker(framework, env)

    plan = LaunchPlan(
        name=trainjob.name,
        namespace=namespace,
        uid=uid,
        cluster=cluster.name,
        backend=cluster.spec.type,
        framework=framework,
        launcher=launcher,
        nodes=nodes,
        procs_per_node=procs,
        resources=resources,
        command=argv,
        container_command=command,
        container_args=args,
        trainer_given=trainjob.spec.trainer is not None,
        procs_per_node_given=spec_trainer is not None and spec_trainer.num_proc_per_node is not None,
        trainer_command_given=spec_trainer is not None and spec_trainer.command is not None,
        env_injection=tuple((t.job_name, tuple(t.container_names))
                            for t in ((policy.torch.env_injection.targets or []) if policy and policy.torch
                                      and policy.torch.env_injection else [])),
        env=env,
        image=image,
        container_runtime=cluster.spec.defaults.container_runtime,
        workdir=workdir,
        time_limit_seconds=trainjob.spec.active_deadline_seconds,
        suspend=bool(trainjob.spec.suspend),
        options=options,
        launch_command=launch_command,
        ssh_auth_mount_path=(mpi.ssh_auth_mount_path or "/root/.ssh") if mpi else None,
        run_launcher_as_node=bool(mpi and mpi.run_launcher_as_node),
        jobset_template=template.model_dump(by_alias=True, exclude_none=True, mode="json"),
        runtime_name=runtime.name,
        runtime_kind=runtime.kind,
        labels=dict(trainjob.metadata.labels or {}),
        jobset_metadata=_jobset_metadata(trainjob, runtime),
        notes=notes,
        image_map=tuple(sorted(cluster.spec.kubernetes.images.items())) if cluster.spec.kubernetes else (),
        image_pull_policy=cluster.spec.kubernetes.image_pull_policy if cluster.spec.kubernetes else None,
        pod_group=pod_group,
        queue=queue,
        staging=staging,
        tenant=tenant.name if tenant is not None else None,
        slurm_layout=slurm_layout,
    )
    check_identity(plan)
    return plan


def _staging(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, template: JobSetSpec, cluster: BridgeCluster,
             tenant: str | None = None) -> StagingPlan | None:
    """The TrainJob's initializers, checked where the backend will read them: each URI's scheme, and on
    Kubernetes the runtime's initializer job (as Kubeflow's webhook checks it); elsewhere the cluster's shared
    storage. Nothing to stage: None."""
    from bridge.api.storage import ROLES, parse_storage_uri, secret_name_problem

    initializer = trainjob.spec.initializer
    kubernetes = cluster.spec.type == "kubernetes"
    sources = []
    for role in ROLES:
        part = getattr(initializer, role) if initializer is not None else None
        where = f"spec.initializer.{role}"
        if (part is None or not part.storage_uri) and not kubernetes:
            # what the runtime's initializer job fetches on Kubernetes without one: its own STORAGE_URI
            part, where = _runtime_initializer(template, role), f"runtime {runtime.name}: {role}-initializer env"
        if part is None or not part.storage_uri:
            continue
        try:
            location = parse_storage_uri(part.storage_uri, role)
        except ValueError as exc:
            raise InvalidSpec(f"{where}.storageUri", part.storage_uri, str(exc)) from None
        if location.scheme == "pvc" and not kubernetes:
            raise InvalidSpec(f"{where}.storageUri", part.storage_uri,
                              f"pvc:// names a PersistentVolumeClaim: only a Kubernetes cluster has one (cluster "
                              f"{cluster.name!r} is {cluster.spec.type}); use file:// for shared storage")
        env = []
        for index, entry in enumerate(part.env or []):
            if not kubernetes and (entry.value_from is not None or not SHELL_ENV_NAME.fullmatch(entry.name)):
                raise InvalidSpec(f"{where}.env[{index}]", entry.name,
                                  "off Kubernetes an initializer's env is a shell name with a literal value (put "
                                  "credentials in secretRef)")
            env.append((entry.name, entry.value or ""))
        if kubernetes:
            _check_initializer_job(template, runtime.name, role, where)
        secret = part.secret_ref.name if part.secret_ref is not None else None
        if secret is not None and not kubernetes and secret_name_problem(secret):
            raise InvalidSpec(f"{where}.secretRef.name", secret, secret_name_problem(secret) or "")
        sources.append(StageSource(role, part.storage_uri, tuple(env), secret))
    if not sources:
        return None
    if kubernetes:
        return StagingPlan(tuple(sources))
    staging_dir = cluster.spec.staging_dir
    if staging_dir is None and cluster.spec.type == "local":
        from bridge.records import state_root

        staging_dir = str(state_root() / "staging")
    if staging_dir is None:
        raise InvalidSpec("spec.initializer", ", ".join(s.uri for s in sources),
                          f"cluster {cluster.name!r} has no shared storage to stage into: set its spec.stagingDir "
                          "(a directory every node mounts)")
    _check_directive_value(f"cluster {cluster.name}: spec.stagingDir", staging_dir)
    return StagingPlan(tuple(sources), staging_dir, cluster.spec.secrets_dir, tenant)


def _runtime_initializer(template: JobSetSpec, role: str) -> DatasetInitializer | None:
    """A runtime's own ``<role>-initializer`` job as an initializer: its container's STORAGE_URI and the rest
    of its literal env (Kubeflow's torchtune runtimes fetch their default dataset and model so)."""
    name = f"{role}-initializer"
    for job in template.replicated_jobs or []:
        pod = job.template.spec.template.spec if job.name == name else None
        for container in (pod.containers if pod else None) or []:
            env = [e for e in container.env or [] if e.value_from is None]
            uri = next((e.value for e in env if e.name == "STORAGE_URI"), None)
            if container.name == name and uri:
                return DatasetInitializer.model_validate(
                    {"storageUri": uri, "env": [{"name": e.name, "value": e.value or ""} for e in env
                                                if e.name != "STORAGE_URI"]})
    return None


def _workspace_paths(argv: tuple[str, ...], job_dir: str) -> tuple[tuple[str, ...], bool]:
    """Kubeflow's paths in a trainer command (``/workspace/model``, ``tokenizer.path=/workspace/model/…``),
    where there is no container, as the job's staging directory: its dataset and model links are there."""
    pattern = re.compile(rf"(^|=){re.escape(KUBEFLOW_WORKSPACE)}(?=/|$)")
    moved = tuple(pattern.sub(lambda m: m.group(1) + job_dir.rstrip("/"), arg) for arg in argv)
    return moved, moved != argv


def _check_initializer_job(template: JobSetSpec, runtime_name: str, role: str, where: str) -> None:
    """Kubeflow's JobSet plugin: the runtime needs a ``<role>-initializer`` job whose container of that name
    mounts the ``initializer`` volume, or the data has nowhere to go."""
    name = f"{role}-initializer"
    for job in template.replicated_jobs or []:
        pod = job.template.spec.template.spec if job.name == name else None
        for container in (pod.containers if pod else None) or []:
            if container.name == name and any(m.get("name") == "initializer" for m in container.volume_mounts or []):
                return
    raise InvalidSpec(where, name, f"runtime {runtime_name!r} has no replicated job {name!r} with a container "
                      f"{name!r} mounting the 'initializer' volume, so nothing would fetch it (Kubeflow's webhook "
                      "refuses this TrainJob too)")


def _gpu_note(framework: str, procs: int, resources: NodeResources, job: str) -> tuple[str, ...]:
    """A GPU job with more processes per node than GPUs per node: some processes share a GPU, which NCCL
    refuses ("Duplicate GPU detected") and memory rarely allows. Said once, not refused: a process may use no
    GPU at all (a data loader, a parameter server)."""
    if not resources.gpus or procs <= resources.gpus or framework in ("jax", "script"):
        return ()
    return (f"spec.trainer.numProcPerNode: {procs} processes per node share {resources.gpus} "
            f"{resources.gpu_resource} per node in replicated job {job!r}: some processes share a GPU "
            "(NCCL refuses two ranks on one GPU)",)


def _check_xgboost_tracker(framework: str, env: Iterable[EnvEntry]) -> None:
    for entry in env:
        if entry.name == XGBOOST_TRACKER_ENV and (framework != "xgboost" or entry.value not in XGBOOST_TRACKERS):
            raise InvalidSpec(f"spec.trainer.env[{XGBOOST_TRACKER_ENV}]", entry.value,
                              f"use one of {', '.join(XGBOOST_TRACKERS)}" if framework == "xgboost" else
                              f"only an xgboost runtime has a tracker; this one's policy is {framework}")


def _pod_group(runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster) -> PodGroupPlan | None:
    """A runtime's podGroupPolicy, honoured or refused, never dropped. On Kubernetes the cluster must run that
    gang scheduler (spec.kubernetes.gangScheduler), or the pods would be scheduled one by one and a job could
    hold half its nodes forever; on Slurm and Flux one allocation starts every node together, which is what the
    policy asks for."""
    policy = runtime.spec.pod_group_policy
    if policy is None:
        return None
    kind = "coscheduling" if policy.coscheduling is not None else "volcano"
    if cluster.spec.type == "kubernetes":
        has = cluster.spec.kubernetes.gang_scheduler if cluster.spec.kubernetes else None
        if has != kind:
            raise InvalidSpec(f"runtime {runtime.name}: spec.podGroupPolicy.{kind}", kind,
                              f"cluster {cluster.name!r} has {'no gang scheduler' if has is None else has} "
                              f"(spec.kubernetes.gangScheduler): its pods would be scheduled one by one")
    conn = cluster.spec.kubernetes
    if policy.coscheduling is not None:  # kind == "coscheduling"
        timeout = policy.coscheduling.schedule_timeout_seconds
        return PodGroupPlan(kind, 60 if timeout is None else timeout,
                            scheduler_name=conn.scheduler_name if conn else None)
    assert policy.volcano is not None  # PodGroupPolicy holds exactly one of the two
    return PodGroupPlan(kind, network_topology=policy.volcano.network_topology,
                        scheduler_name=(conn.scheduler_name if conn else None) or "volcano")


def gang_note(plan: LaunchPlan) -> str | None:
    """What an HPC artifact says of the runtime's gang policy: one allocation is already a gang."""
    if plan.pod_group is None:
        return None
    return (f"runtime {plan.runtime_name}'s podGroupPolicy.{plan.pod_group.kind} is met by the allocation "
            f"itself: all {plan.nodes} nodes start together or not at all")


def _queue(trainjob: TrainJob, cluster: BridgeCluster) -> str | None:
    labelled = (trainjob.metadata.labels or {}).get(QUEUE_LABEL)
    if labelled:
        return labelled
    return cluster.spec.kubernetes.queue if cluster.spec.type == "kubernetes" and cluster.spec.kubernetes else None


#: what a non-Kubernetes backend reads of the trainer's container; every other container field is Kubernetes'
_CONTAINER_READ = {"name", "image", "command", "args", "env", "resources", "workingDir", "ports"}
#: pod spec fields that only say how Kubernetes runs the pod, with nothing to honour elsewhere
_POD_NEUTRAL = {"containers", "restartPolicy"}


def _unhonoured(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, template: JobSetSpec,
                trainer_job: ReplicatedJob, container: Container, image: str | None,
                cluster: BridgeCluster) -> tuple[str, ...]:
    """One note per Kubernetes-only field the TrainJob sets (its runtime patches, image, initializer) that
    *cluster* cannot honour; refused instead when the cluster lists the field in ``spec.defaults.mustHonour``
    (or ``"*"``). What the runtime itself says for Kubernetes is the runtime author's, and not repeated."""
    found: list[tuple[str, str, Any]] = []
    job_name = trainer_job.name
    merged_jobs = template.model_dump(by_alias=True, exclude_none=True, mode="json").get("replicatedJobs", [])
    base_jobs = runtime.spec.template.spec.model_dump(by_alias=True, exclude_none=True, mode="json").get(
        "replicatedJobs", [])

    def pod_of(jobs: list[dict[str, Any]], name: str) -> dict[str, Any]:
        job = next((j for j in jobs if j.get("name") == name), {})
        return (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}

    pod_doc, base_pod = pod_of(merged_jobs, job_name), pod_of(base_jobs, job_name)
    where = f"spec.runtimePatches: replicatedJobs[{job_name}] pod spec"
    for key, value in pod_doc.items():
        if key not in _POD_NEUTRAL and value != base_pod.get(key):
            found.append((key, f"{where}.{key}", value))
    base_containers = {c.get("name"): c for c in base_pod.get("containers", [])}
    for other in pod_doc.get("containers", []):
        name = other.get("name")
        if name != container.name and other != base_containers.get(name):
            found.append(("containers", f"{where}.containers[{name}]", "a container beside 'node'"))
    base_node = base_containers.get(container.name) or {}
    container_doc = container.model_dump(by_alias=True, exclude_none=True, mode="json")
    for key, value in container_doc.items():
        if key not in _CONTAINER_READ and value != base_node.get(key):
            found.append((key, f"{where}.containers[node].{key}", value))
    if image and cluster.spec.defaults.container_runtime == "none" and trainjob.spec.trainer is not None \
            and trainjob.spec.trainer.image:
        found.append(("image", "spec.trainer.image", image))
    required = set(cluster.spec.defaults.must_honour)
    notes = []
    for key, where, value in found:
        if key in required or "*" in required:
            raise InvalidSpec(where, value, f"a Kubernetes field a {cluster.spec.type} cluster cannot honour, and "
                              f"cluster {cluster.name!r} requires it honoured (spec.defaults.mustHonour)")
        what = ("runs on the host: the cluster has no container runtime (spec.defaults.containerRuntime)"
                if key == "image" else f"not honoured on a {cluster.spec.type} cluster")
        notes.append(f"{where}: {what}")
    return tuple(notes)


def _jobset_metadata(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime) -> Mapping[str, Mapping[str, str]]:
    """The JobSet's own labels and annotations, as Kubeflow propagates them: the runtime template's metadata,
    then each runtime patch's ``template.metadata`` in order."""
    merged: dict[str, dict[str, str]] = {"labels": {}, "annotations": {}}
    meta = runtime.spec.template.metadata
    if meta is not None:
        merged["labels"].update(meta.labels or {})
        merged["annotations"].update(meta.annotations or {})
    for index, patch in enumerate(trainjob.spec.runtime_patches or []):
        where = f"spec.runtimePatches[{index}].trainingRuntimeSpec.template.metadata"
        spec = patch.training_runtime_spec if isinstance(patch.training_runtime_spec, dict) else {}
        given = spec.get("template")
        template: dict[str, Any] = given if isinstance(given, dict) else {}
        patch_meta = template.get("metadata")
        if patch_meta is None:
            continue
        if not isinstance(patch_meta, dict):
            raise InvalidSpec(where, patch_meta, "must be a mapping with labels and annotations")
        for key in ("labels", "annotations"):
            values = patch_meta.get(key) or {}
            if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
                raise InvalidSpec(f"{where}.{key}", values, "must map names to strings")
            merged[key].update(values)
    from bridge.api.names import check_annotations

    try:
        check_annotations(merged["annotations"])
    except ValueError as exc:
        raise InvalidSpec("spec.runtimePatches (JobSet metadata.annotations)", None, str(exc)) from None
    return merged


def check_identity(plan: LaunchPlan) -> None:
    """The values every artifact writes into comments, directives, attributes and labels, checked once more
    on the finished plan, whatever path built the objects (bridge.api.names): Kubernetes' grammars."""
    for where, value, check in (("metadata.name", plan.name, check_dns1035_label),
                                ("metadata.namespace", plan.namespace, check_dns1123_label),
                                ("metadata.uid", plan.uid, check_uid),
                                ("cluster", plan.cluster, check_dns1123_subdomain),
                                ("spec.runtimeRef.name", plan.runtime_name, check_dns1123_subdomain)):
        try:
            check(value)
        except (ValueError, TypeError) as exc:
            raise InvalidSpec(where, value, str(exc)) from None


def _check_free_text(argv: tuple[str, ...], env: tuple[EnvEntry, ...]) -> None:
    """Command, arguments and env values are carried byte for byte (quoted, never interpreted), except NUL,
    which no exec argument or environment value can hold: refused rather than cut short."""
    for index, arg in enumerate(argv):
        if "\x00" in arg:
            raise InvalidSpec(f"spec.trainer.command/args[{index}]", arg, "contains a NUL character, which no "
                              "backend can carry")
    for entry in env:
        if entry.value is not None and "\x00" in entry.value:
            raise InvalidSpec(f"env {entry.name!r}.value", entry.value, "contains a NUL character, which no backend "
                              "can carry")


def _check_bounds(cluster: BridgeCluster, nodes: int, nodes_field: str, procs: int, time_limit: int | None) -> None:
    backend = cluster.spec.type
    most = MAX_NODES.get(backend, MAX_NODES_DEFAULT)
    if nodes > most:
        raise InvalidSpec(nodes_field, nodes, f"at most {most} nodes on a {backend} cluster")
    if procs > MAX_PROCS_PER_NODE:
        raise InvalidSpec("spec.trainer.numProcPerNode", procs,
                          f"at most {MAX_PROCS_PER_NODE} processes per node (derived from the runtime, the GPU or "
                          "CPU count when not given)")
    if time_limit is not None and backend != "kubernetes" and time_limit > MAX_TIME_LIMIT_SECONDS:
        raise InvalidSpec("spec.activeDeadlineSeconds", time_limit,
                          f"at most {MAX_TIME_LIMIT_SECONDS} seconds on a {backend} cluster")


def _check_privileged(options: BackendOptions, cluster: BridgeCluster) -> None:
    """Batch-script options that change who the job runs as are refused unless the cluster entry allows them."""
    allowed = set(cluster.spec.defaults.allow_privileged_options)
    for option, value in options.sbatch_extra:
        if option in PRIVILEGED_OPTIONS and option not in allowed:
            raise InvalidSpec(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}{option}]", value,
                              f"--{option} changes the identity or privileges the job runs with; cluster "
                              f"{cluster.name!r} does not allow it (spec.defaults.allowPrivilegedOptions)")


# --- merging -------------------------------------------------------------------------------------------


def _merged_template(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime) -> JobSetSpec:
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
        raise invalid_from_validation(exc, prefix="spec.runtimePatches (merged template)") from None


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


def _trainer_container(template: JobSetSpec, runtime_name: str) -> tuple[ReplicatedJob, Container]:
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


def _merged_env(runtime_env: list[EnvVar], trainjob_env: list[EnvVar]) -> tuple[EnvEntry, ...]:
    """Runtime env with the TrainJob's entries upserted by name (Kubeflow's merge), order kept."""
    merged: dict[str, EnvEntry] = {}
    for entry in [*runtime_env, *trainjob_env]:
        merged[entry.name] = EnvEntry(entry.name, entry.value, entry.value_from)
    return tuple(merged.values())


def _node_resources(runtime: ResourceRequirements | None, trainjob: ResourceRequirements | None) -> NodeResources:
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


def _node_count(trainjob: TrainJob, policy: MLPolicy | None) -> int:
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


def _procs_and_launcher(trainjob: TrainJob, policy: MLPolicy | None, framework: str, resources: NodeResources) -> tuple[int, Launcher]:
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


# --- a converted batch script's node and task options on Slurm -----------------------------------------

#: the options hpc-bridge states from TrainJob fields that a converted script may have left to Slurm
SLURM_LAYOUT_OPTIONS = ("nodes", "ntasks-per-node")
#: the layout annotation's word for "neither": one task, on a node Slurm picks
SLURM_LAYOUT_NONE = "none"


def parse_slurm_layout(value: str, where: str) -> tuple[str, ...]:
    """``nodes,ntasks-per-node`` (any of them, in that order) or ``none`` → the option names."""
    if value == SLURM_LAYOUT_NONE:
        return ()
    names = tuple(value.split(","))
    if not names or any(name not in SLURM_LAYOUT_OPTIONS for name in names) or len(set(names)) != len(names):
        raise InvalidSpec(where, value, f"must be {SLURM_LAYOUT_NONE!r} or a comma-separated list of "
                                        f"{', '.join(SLURM_LAYOUT_OPTIONS)}")
    return tuple(name for name in SLURM_LAYOUT_OPTIONS if name in names)


def slurm_layout_text(names: Iterable[str]) -> str:
    given = [name for name in SLURM_LAYOUT_OPTIONS if name in set(names)]
    return ",".join(given) or SLURM_LAYOUT_NONE


def slurm_layout_counts(min_nodes: int | None, ntasks: int | None, per_node: int | None) -> tuple[int, int]:
    """(nodes, tasks per node) a TrainJob records for sbatch's ``--nodes`` minimum, ``--ntasks`` and
    ``--ntasks-per-node`` (None: not given). Without ``--nodes`` Slurm picks the count: at least
    ntasks / ntasks-per-node nodes when both are given (``-n 16 --ntasks-per-node=4`` is 4 nodes), else one as
    far as the TrainJob can say; without ``--ntasks-per-node`` the tasks are spread over that minimum."""
    nodes = min_nodes if min_nodes is not None else -(-ntasks // per_node) if ntasks and per_node else 1
    procs = per_node if per_node is not None else -(-ntasks // nodes) if ntasks else 1
    return nodes, procs


def _slurm_layout(value: str | None, options: BackendOptions, cluster: BridgeCluster, launcher: Launcher,
                  nodes: int, procs: int, nodes_field: str) -> tuple[str, ...] | None:
    """A converted script's own layout (``hpcbridge.io/slurm-layout``) on Slurm, checked against the fields: a
    numNodes or numProcPerNode the layout would not ask Slurm for is refused, never dropped. Elsewhere the
    fields alone say what runs."""
    if value is None or cluster.spec.type != "slurm":
        return None
    where = f"metadata.annotations[{SLURM_LAYOUT_ANNOTATION}]"
    names = parse_slurm_layout(value, where)
    if launcher != Launcher.SCRIPT:
        raise InvalidSpec(where, value, "only a batch script (runtime sbatch-script) has a Slurm layout of its own; "
                                        "remove the annotation")
    extra = dict(options.sbatch_extra)
    ntasks = int(extra["ntasks"]) if extra.get("ntasks", "").isdigit() else None
    given_range = extra.get("nodes")
    if given_range is not None:
        from bridge.convert.sbatch.values import BadValue, node_range

        try:
            min_nodes: int | None = node_range(given_range)[0]
        except BadValue:
            min_nodes = None  # check_passthrough refused it already
    else:
        min_nodes = nodes if "nodes" in names else None
    want_nodes, want_procs = slurm_layout_counts(min_nodes, ntasks, procs if "ntasks-per-node" in names else None)
    said = " ".join(f"--{name}" for name in names) or "no --nodes or --ntasks-per-node"
    if given_range is not None and min_nodes is not None and nodes != min_nodes:
        raise InvalidSpec(nodes_field, nodes, f"the job asks Slurm for --nodes={given_range} "
                          f"({SBATCH_PASSTHROUGH_PREFIX}nodes), at least {min_nodes}; make them agree")
    if nodes != want_nodes:
        raise InvalidSpec(nodes_field, nodes, f"{where} says the script gave {said}, so Slurm picks the node count "
                          f"(at least {want_nodes}); remove the annotation to ask Slurm for exactly {nodes} nodes")
    if procs != want_procs:
        total = f"--ntasks={ntasks} over {nodes} node(s)" if ntasks else "one task"
        raise InvalidSpec("spec.trainer.numProcPerNode", procs, f"{where} says the script gave {said}, so Slurm "
                          f"places {total} ({want_procs} per node); remove the annotation to ask Slurm for "
                          f"--ntasks-per-node={procs}")
    return names


# --- annotations → backend options ---------------------------------------------------------------------

#: how a converted batch script spelled its GPU request (``gres=gpu:2``): Slurm re-emits it, since
#: Slurm's job environment differs by spelling (SLURM_GPUS_PER_NODE); other backends read the count
SLURM_GPU_OPTIONS = ("gres", "gpus", "gpus-per-node")


#: sbatch options that change nothing about what a job computes, the resources it gets, when or where it runs,
#: or where its output goes: off Slurm (local, Flux, Kubernetes) each is left out with one note saying why,
#: instead of refusing a script for its mail line. Every other sbatch option off Slurm is mapped to a TrainJob
#: field or scheduler knob the backend declares, or refused naming it. The same list is documented in README.md
#: ("Moving from Slurm") and docs/sbatch-anywhere.md.
SBATCH_DROPPED_OFF_SLURM: Mapping[str, str] = {
    "comment": "a note Slurm keeps with the job record; the job never reads it",
    "mail-type": "when Slurm mails about the job's state; nothing is mailed here and the job runs the same",
    "mail-user": "whom Slurm mails about the job's state; nothing is mailed here and the job runs the same",
    "nice": "the job's place in Slurm's queue; the job runs the same whenever it starts",
    "requeue": "whether Slurm may rerun the job after a node failure or preemption; here a job is never rerun",
    "no-requeue": "that Slurm must not rerun the job after a node failure or preemption; here a job is never rerun",
    "kill-on-invalid-dep": "what Slurm does with a job whose dependency can no longer hold (cancel it or leave it "
                           "pending); either way it never runs, and here it is never sent",
    "acctg-freq": "how often Slurm samples the job's usage for accounting; the job runs the same",
    "profile": "which usage profiles Slurm's profiling plugin records; the job runs the same",
    "wckey": "the workload characterization key Slurm accounts the job under; the job runs the same",
    "verbose": "how much sbatch itself prints; the job runs the same",
    "quiet": "how much sbatch itself prints; the job runs the same",
    "ignore-pbs": "tells sbatch to skip #PBS lines, which hpc-bridge never reads",
}
#: values that say only what a job gets off Slurm anyway, so they are left out with a note like the options above
_DROPPED_VALUES: Mapping[str, tuple[frozenset[str], str]] = {
    "export": (frozenset({"all"}), "sbatch's default said outright: the job gets the environment it gets "
                                   "without this line"),
    "time": (frozenset({"unlimited", "infinite", "-1"}), "no time limit, and the TrainJob sets none "
                                                         "(no activeDeadlineSeconds)"),
}


def dropped_note(where: str, option: str, value: str, why: str, cluster: str, backend: str) -> str:
    """The one note a dropped sbatch option gets, naming it by *where* (its annotation, or its #SBATCH line)."""
    from bridge.convert.sbatch.parse import passthrough_value

    written = passthrough_value(option, value)
    shown = f"--{option}" if written is None else f"--{option}={written}"
    return f"{where}: {shown} dropped on cluster {cluster!r} ({backend}): {why}"


def _drop_slurm_only(options: BackendOptions, cluster: BridgeCluster, nodes: int, procs: int) -> BackendOptions:
    """Off Slurm: the sbatch options that change nothing about the job left out (``dropped``, one note each),
    and a converted script's Slurm spellings of what numNodes and numProcPerNode already say (``--ntasks``, a
    ``--nodes`` range) too; a total the fields cannot say is refused. Everything else stays, for the adapter to
    map or refuse by name. Tenancy's allowlist was applied before: a tenant may not pass what it may not drop."""
    if cluster.spec.type == "slurm" or not options.sbatch_extra:
        return options
    kept: list[tuple[str, str]] = []
    dropped: list[tuple[str, str, str]] = []
    for option, value in options.sbatch_extra:
        why = SBATCH_DROPPED_OFF_SLURM.get(option)
        if why is None and option in _DROPPED_VALUES and value.lower() in _DROPPED_VALUES[option][0]:
            why = _DROPPED_VALUES[option][1]
        if why is None and option == "open-mode" and options.output is None and options.error is None:
            why = ("whether Slurm appends to or truncates output files; here the job's output is a log of its own, "
                   "new for each job, so both write the same")
        if why is None and option == "ntasks":
            why = _ntasks_here(value, nodes, procs, cluster)
        if why is None and option == "nodes":
            why = _node_range_here(value, nodes)
        if why is None:
            kept.append((option, value))
        else:
            dropped.append((option, value, why))
    return replace(options, sbatch_extra=tuple(kept), dropped=tuple(dropped))


def _ntasks_here(value: str, nodes: int, procs: int, cluster: BridgeCluster) -> str | None:
    """A script's total task count off Slurm: what numNodes x numProcPerNode already says, or refused."""
    if not value.isdigit():
        return None
    if int(value) != nodes * procs:
        raise InvalidSpec(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}ntasks]", value,
                          f"cluster {cluster.name!r} ({cluster.spec.type}) runs the same number of tasks on every "
                          f"node: {nodes} node(s) x {procs} is {nodes * procs}, not {value}; give a task count "
                          "the node count divides, or pick a Slurm cluster")
    return f"the total numNodes x numProcPerNode gives ({nodes} x {procs}); the job runs {value} tasks here too"


def _node_range_here(value: str, nodes: int) -> str | None:
    """A script's node range off Slurm: the job runs on numNodes, the range's minimum, which the range allows."""
    from bridge.convert.sbatch.values import BadValue, node_range

    try:
        low, high = node_range(value)
    except BadValue:
        return None
    if not low <= nodes <= high:
        return None
    return (f"a node count Slurm picks within the range; here the job runs on numNodes ({nodes}), which the "
            "range allows")


def backend_options(annotations: Mapping[str, str], cluster: BridgeCluster, namespace: str,
                    tenant: Tenant | None = None) -> BackendOptions:
    values: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for key, value in sorted(annotations.items()):
        if not key.startswith(PREFIX):
            continue
        where = f"metadata.annotations[{key}]"
        knob = key[len(PREFIX):]
        if key.startswith(SBATCH_PASSTHROUGH_PREFIX):
            # the parser builds sbatch's option table on import: only when an option is passed through
            from bridge.convert.sbatch.parse import check_passthrough

            option = key[len(SBATCH_PASSTHROUGH_PREFIX):]
            if not re.fullmatch(r"[a-z][a-z0-9-]*", option):
                raise InvalidSpec(where, option, "not an sbatch long option name")
            _check_directive_value(where, value)
            check_passthrough(option, value, where)
            if tenant is not None:
                tenancy.check_passthrough(option, value, tenant)
            extra.append((option, value))
            continue
        if knob not in KNOBS:
            raise InvalidSpec(where, value, f"unknown hpc-bridge annotation; known: {', '.join(KNOBS)}")
        if knob in ("partition", "account", "qos"):
            if not SLURM_NAME.fullmatch(value):
                raise InvalidSpec(where, value, "must be a Slurm name: letters, digits and _ . + @ -")
        elif knob == "constraint":
            if not _CONSTRAINT.fullmatch(value):
                raise InvalidSpec(where, value, "not a Slurm constraint expression")
        elif knob == "exclusive":
            if value not in ("true", "false"):
                raise InvalidSpec(where, value, "must be \"true\" or \"false\"")
        elif knob == "array":
            problem = array_problem(value)
            if problem:
                raise InvalidSpec(where, value, problem)
        elif knob == "dependency":
            if cluster.spec.type in ("local", "kubernetes", "flux"):
                if not _KEPT_DEPENDENCY.fullmatch(value):
                    raise InvalidSpec(where, value, "not a dependency like afterok:JOB[:JOB] (afterok, afterany, "
                                                    "afternotok; items joined by ,) or singleton")
                if cluster.spec.type == "flux" and "singleton" in value.split(","):
                    raise InvalidSpec(where, value, "Flux has no singleton dependency (RFC 26: after, afterany, "
                                                    "afterok, afternotok)")
            elif not _DEPENDENCY.fullmatch(value):
                raise InvalidSpec(where, value, "not a dependency like afterok:123 or singleton")
        elif knob in ("output", "error", "workdir", "slurm-job-name"):
            _check_directive_value(where, value)
        elif knob == "checkpoint-dir":
            # where a moved job resumes (hpcbridge migrate): shared storage both clusters see, by one path
            if not value.startswith("/") or "\n" in value or "\x00" in value:
                raise InvalidSpec(where, value, "must be an absolute path on storage the clusters share")
        elif knob == "slurm-gpus":
            from bridge.convert.sbatch.parse import check_passthrough

            option, eq, spelled = value.partition("=")
            if option not in SLURM_GPU_OPTIONS or not eq or not spelled:
                raise InvalidSpec(where, value, "must be gres=…, gpus=… or gpus-per-node=…, as sbatch takes it")
            _check_directive_value(where, spelled)
            check_passthrough(option, spelled, where)
        values[knob.replace("-", "_")] = value
    defaults = cluster.spec.defaults
    account = values.get("account") or (cluster.spec.account_mapping or {}).get(namespace) or defaults.account
    partition, qos = values.get("partition") or defaults.partition, values.get("qos") or defaults.qos
    if tenant is not None:
        # a tenant's annotations are requests: within its mapping, never over the cluster's accountMapping
        account = tenancy.choose("account", values.get("account"), tenant.accounts,
                                 (cluster.spec.account_mapping or {}).get(namespace) or defaults.account, tenant,
                                 cluster)
        partition = tenancy.choose("partition", values.get("partition"), tenant.partitions, defaults.partition,
                                   tenant, cluster)
        qos = tenancy.choose("qos", values.get("qos"), tenant.qos, defaults.qos, tenant, cluster)
    return BackendOptions(
        partition=partition,
        account=account,
        qos=qos,
        constraint=values.get("constraint") or defaults.constraint,
        exclusive=values.get("exclusive") == "true",
        array=values.get("array"),
        dependency=values.get("dependency"),
        output=values.get("output"),
        error=values.get("error"),
        sbatch_extra=tuple(extra),
        slurm_job_name=values.get("slurm_job_name"),
        slurm_gpus=values.get("slurm_gpus"),
    )


#: the most elements an array may have where hpc-bridge runs them one by one (Slurm's default MaxArraySize)
MAX_EXPANDED_ARRAY = 1001


def expand_array(value: str) -> tuple[list[int], int | None, int]:
    """A valid array spec (array_problem) as its indices in order, the ``%`` limit (None: none) and the step
    Slurm reports as SLURM_ARRAY_TASK_STEP (a single stepped range's step, else 1)."""
    body, _, limit = value.partition("%")
    indices: list[int] = []
    steps = []
    for item in body.split(","):
        span, _, step = item.partition(":")
        low, _, high = span.partition("-")
        steps.append(int(step or 1))
        indices.extend(range(int(low), int(high or low) + 1, int(step or 1)))
        if len(indices) > MAX_EXPANDED_ARRAY:
            raise InvalidSpec(f"metadata.annotations[{ARRAY_ANNOTATION}]", value,
                              f"more than {MAX_EXPANDED_ARRAY - 1} elements; off Slurm each is a job of its own")
    ordered = list(dict.fromkeys(indices))
    return ordered, int(limit) if limit else None, steps[0] if len(steps) == 1 else 1


def array_elements(plan: LaunchPlan) -> list[LaunchPlan]:
    """A job array as the jobs it is made of, for backends without arrays: element *i* is the plan named
    ``<name>-<i>`` (uid derived from the array's), without the array option, with the SLURM_ARRAY_* variables
    Slurm gives an element (SLURM_ARRAY_JOB_ID: the array's uid, as no element's id is known before submit)."""
    indices, _, step = expand_array(plan.options.array or "")
    # the elements share the array's job name, as under Slurm (SLURM_JOB_NAME)
    options = replace(plan.options, array=None, slurm_job_name=plan.options.slurm_job_name or plan.name)
    common = (("SLURM_ARRAY_JOB_ID", plan.uid), ("SLURM_ARRAY_TASK_COUNT", str(len(indices))),
              ("SLURM_ARRAY_TASK_MIN", str(min(indices))), ("SLURM_ARRAY_TASK_MAX", str(max(indices))),
              ("SLURM_ARRAY_TASK_STEP", str(step)))
    elements = []
    for index in indices:
        env = [entry for entry in plan.env if not entry.name.startswith("SLURM_ARRAY_")]
        env += [EnvEntry(name, value) for name, value in (*common, ("SLURM_ARRAY_TASK_ID", str(index)))]
        elements.append(replace(plan, name=f"{plan.name}-{index}", uid=str(uuid.uuid5(uuid.UUID(plan.uid)
                                                                                     if _is_uuid(plan.uid)
                                                                                     else _UID_NAMESPACE,
                                                                                     f"{plan.uid}/{index}")),
                                options=options, env=tuple(env)))
    return elements


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _check_directive_value(where: str, value: str) -> None:
    # These values land in '#SBATCH' lines: one line, and no quote characters sbatch's parser would eat.
    if not value or not _SAFE_DIRECTIVE.fullmatch(value):
        raise InvalidSpec(where, value, "must be one line (at most 4096 characters) without quotes, backslashes or "
                                        "control characters")


def job_environment(plan: LaunchPlan) -> tuple[tuple[str, str], ...]:
    """What every process of every job finds, on every backend, after the TrainJob's own env (README:
    "The job's environment"); HOME and USER are the account's own where a backend starts without them."""
    staged = tuple((STAGED_DIR_ENV[source.role], plan.staging.path(plan.uid, source.role))
                   for source in plan.staging.sources) if plan.staging else ()
    return (("HPCBRIDGE_JOB_UID", plan.uid), ("HPCBRIDGE_JOB_NAME", plan.name),
            ("HPCBRIDGE_JOB_NAMESPACE", plan.namespace), ("HPCBRIDGE_CLUSTER", plan.cluster), *staged)


#: the line before the stage step in a batch script
STAGE_COMMENT = ("# initializers: the dataset and model are staged once, on this node, into the cluster's shared "
                 "stagingDir; a failure ends the job here")


def stage_argv(plan: LaunchPlan) -> tuple[str, ...]:
    """The stage step an HPC backend runs once, on the job's first node, before ``hpcbridge launch``: the
    initializers' URIs and secret names as arguments (secret values are read on the node, never here). Their
    env values are not on it (a command line is anyone's to read in ps): the step reads
    :func:`stage_input` on stdin."""
    staging = plan.staging
    assert staging is not None and staging.dir
    launch = plan.launch_command
    argv = [*(launch[:-1] if launch[-1] == "launch" else ("hpcbridge",)), "stage", "--job-id", plan.uid,
            "--staging-dir", staging.dir]
    if staging.tenant is not None:
        argv += ["--tenant", staging.tenant, "--namespace", plan.namespace]
    if staging.secrets_dir:
        argv += ["--secrets-dir", staging.secrets_dir]
    if stage_input(plan) is not None:
        argv += ["--env-stdin"]
    for source in staging.sources:
        argv += [f"--{source.role}", source.uri]
        if source.secret:
            argv += [f"--{source.role}-secret", source.secret]
    return tuple(argv)


def stage_input(plan: LaunchPlan) -> str | None:
    """What the stage step reads on stdin: the initializers' env, one line of JSON (ASCII, so no line break
    or quote of a value can end it); None when they have none."""
    import json

    assert plan.staging is not None
    env = {source.role: [list(pair) for pair in source.env] for source in plan.staging.sources if source.env}
    return json.dumps(env, ensure_ascii=True, separators=(",", ":")) if env else None


#: the here-document that gives a batch script's stage step its stdin
STAGE_INPUT_END = "HPCBRIDGE_STAGE_ENV"


#: where a job that was started with its whole environment (a tenant's Slurm job: sbatch --export-file) finds
#: its stage step's input, so that not even its batch script holds the initializers' env values
STAGE_INPUT_ENV = "HPCBRIDGE_STAGE_INPUT"


def stage_input_environment(plan: LaunchPlan) -> dict[str, str]:
    """A tenant job's stage input as its environment (``STAGE_INPUT_ENV``), which the job is started with (sbatch
    --export-file, slurmrestd's ``environment``) instead of the script holding it; empty for the CLI and for a
    job whose initializers set no env."""
    staged = stage_input(plan) if plan.tenant is not None and plan.staging is not None else None
    return {STAGE_INPUT_ENV: staged} if staged is not None else {}


def stage_command(plan: LaunchPlan, input_in_environment: bool = False) -> str:
    """The stage step as a batch script's line(s): its arguments, and its env as a quoted here-document (data
    the shell passes on the step's stdin, on no command line); with *input_in_environment*, piped from
    ``$HPCBRIDGE_STAGE_INPUT`` by the shell's builtin printf (no process shows it) and then unset, so the
    trainer never sees the initializers' env."""
    from bridge.shell import join

    text = stage_input(plan)
    line = join(stage_argv(plan))
    if text is None:
        return line
    if input_in_environment:
        return f'printf \'%s\\n\' "${STAGE_INPUT_ENV}" | {line}\nunset {STAGE_INPUT_ENV}'
    return f"{line} <<'{STAGE_INPUT_END}'\n{text}\n{STAGE_INPUT_END}"


#: a batch script's line that gives the job the account's HOME and USER when the backend started it without
ACCOUNT_ENV_LINE = ': "${USER:=$(id -un)}" "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"; export USER HOME'


def script_env(plan: LaunchPlan) -> dict[str, str]:
    """For a batch script on a backend that is not Slurm: the job variables sbatch sets that the plan decides
    (``hpcbridge launch --launcher script`` adds the allocation's, as it finds it, and the srun shim)."""
    if plan.launcher != Launcher.SCRIPT or plan.backend == "slurm":
        return {}
    extra = dict(plan.options.sbatch_extra)
    env = {"SLURM_JOB_NAME": plan.options.slurm_job_name or plan.name, "SLURM_CLUSTER_NAME": plan.cluster}
    if "ntasks" in extra and extra["ntasks"].isdigit():
        env["SLURM_NTASKS"] = extra["ntasks"]  # sbatch sets SLURM_NTASKS_PER_NODE only when it was given
    else:
        env["SLURM_NTASKS"] = str(plan.nodes * plan.procs_per_node)
        env["SLURM_NTASKS_PER_NODE"] = str(plan.procs_per_node)
    cpus = plan.resources.cpu_count
    if cpus and plan.resources.cpu == cpus and cpus % plan.procs_per_node == 0:
        env["SLURM_CPUS_PER_TASK"] = str(cpus // plan.procs_per_node)
    if plan.resources.gpus:
        env["SLURM_GPUS_ON_NODE"] = str(plan.resources.gpus)
    if plan.options.partition:
        env["SLURM_JOB_PARTITION"] = plan.options.partition
    if plan.options.account:
        env["SLURM_JOB_ACCOUNT"] = plan.options.account
    return env


def check_shell_env(plan: LaunchPlan) -> None:
    """HPC backends export env through a shell: names must be identifiers, values literal strings."""
    for entry in plan.env:
        if not SHELL_ENV_NAME.fullmatch(entry.name):
            raise InvalidSpec(f"env {entry.name!r}", entry.name,
                              f"{plan.backend} needs shell variable names (letters, digits, _)")
        if entry.value_from is not None:
            raise InvalidSpec(f"env {entry.name!r}.valueFrom", dict(entry.value_from),
                              f"valueFrom is only available on Kubernetes clusters, not {plan.backend}")
        if entry.value is not None and "\x00" in entry.value:
            # the value itself stays out of the message: it may be a secret, and refusals become Events
            raise InvalidSpec(f"env {entry.name!r}.value", None, "contains a NUL byte (value not shown)")


#: Kubeflow's torchtune entrypoint: a TrainJob whose command is exactly this gets its recipe arguments added
TORCHTUNE_ENTRYPOINT = ("tune", "run")
#: runtime command items a torchtune TrainJob keeps (where the runtime put the model, tokenizer and output)
_TORCHTUNE_KEPT = {"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file"}


def torch_nproc(plan: LaunchPlan) -> str:
    """PET_NPROC_PER_NODE as Kubeflow sets it: the TrainJob's numProcPerNode, else "auto" (one per GPU) when
    GPUs are asked for, else the CPU count."""
    return "auto" if plan.resources.gpus and not plan.procs_per_node_given else str(plan.procs_per_node)


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
