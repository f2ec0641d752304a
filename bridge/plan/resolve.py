"""TrainJob + runtime + cluster → LaunchPlan: the one entry that composes the planning steps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bridge.annotations import (
    SBATCH_PASSTHROUGH_PREFIX,
    SLURM_GPUS_ANNOTATION,
    SLURM_LAYOUT_ANNOTATION,
    WORKDIR_ANNOTATION,
)
from bridge.api.cluster import BridgeCluster, Tenant
from bridge.api.k8s import Container, JobSetSpec, ReplicatedJob
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import MANAGED_BY_BRIDGE, TrainJob
from bridge.errors import InvalidSpec
from bridge.plan.extensions import KubernetesPlan, SlurmPlan
from bridge.plan.fidelity import jobset_metadata, pod_group_plan, queue_name, unhonoured_notes
from bridge.plan.frameworks import (
    TORCHTUNE_ENTRYPOINT,
    check_reserved_env,
    check_xgboost_tracker,
    env_injection,
    framework_of,
    gpu_note,
    node_count,
    procs_and_launcher,
    torchtune_arguments,
)
from bridge.plan.limits import (
    check_bounds,
    check_directive_value,
    check_free_text,
    check_identity,
    check_privileged,
)
from bridge.plan.merge import merged_env, merged_template, node_resources, trainer_container
from bridge.plan.model import (
    KUBEFLOW_WORKSPACE,
    BackendOptions,
    EnvEntry,
    Launcher,
    LaunchPlan,
    NodeResources,
    PodGroupPlan,
    StagingPlan,
)
from bridge.plan.options import backend_options, checked_slurm_layout, drop_slurm_only, dropped_note
from bridge.plan.select import derive_uid
from bridge.plan.staging import staging_plan, workspace_paths
from bridge.plan.traits import traits_of


@dataclass(frozen=True)
class _Trainer:
    """The trainer as the TrainJob and its runtime's merged template give it (Kubeflow's precedence)."""

    template: JobSetSpec
    job: ReplicatedJob
    container: Container
    command: tuple[str, ...]
    args: tuple[str, ...]
    image: str | None
    env: tuple[EnvEntry, ...]
    resources: NodeResources


@dataclass(frozen=True)
class _Decisions:
    """What resolve decided beyond the trainer, for the plan to carry."""

    framework: str
    launcher: Launcher
    nodes: int
    procs: int
    options: BackendOptions
    slurm: SlurmPlan | None
    workdir: str | None
    argv: tuple[str, ...]
    notes: tuple[str, ...]
    pod_group: PodGroupPlan | None
    staging: StagingPlan | None
    uid: str


def resolve(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster,
            tenant: Tenant | None = None) -> LaunchPlan:
    """Decide everything about running *trainjob* on *cluster*; for *tenant* (the operator's), only within
    what its mapping allows."""
    _check_admitted(trainjob, cluster, tenant)
    policy = runtime.spec.ml_policy
    framework = framework_of(runtime)
    trainer = _trainer(trainjob, runtime, cluster, framework)
    nodes = node_count(trainjob, policy)
    procs, launcher = procs_and_launcher(trainjob, policy, framework, trainer.resources)
    spec_trainer = trainjob.spec.trainer
    nodes_field = "spec.trainer.numNodes" if spec_trainer and spec_trainer.num_nodes is not None \
        else "runtime spec.mlPolicy.numNodes"
    check_bounds(cluster, nodes, nodes_field, procs, trainjob.spec.active_deadline_seconds)

    annotations = dict(trainjob.metadata.annotations or {})
    options = backend_options(annotations, cluster, trainjob.namespace, tenant)
    check_privileged(options, cluster)
    options = drop_slurm_only(options, cluster, nodes, procs)
    slurm_layout = checked_slurm_layout(annotations.get(SLURM_LAYOUT_ANNOTATION), options, cluster, launcher, nodes,
                                        procs, nodes_field)
    # the GPU option is checked for every backend (backend_options); only Slurm writes it as it was spelled
    slurm = SlurmPlan(slurm_layout, annotations.get(SLURM_GPUS_ANNOTATION)) \
        if traits_of(cluster).takes_sbatch_options else None
    workdir = _workdir(annotations, trainer.container, runtime, cluster)
    check_free_text(trainer.command + trainer.args, trainer.env)
    pod_group = pod_group_plan(runtime, cluster)
    notes = () if traits_of(cluster).runs_pods else \
        unhonoured_notes(trainjob, runtime, trainer.template, trainer.job, trainer.container, trainer.image, cluster)
    staging = staging_plan(trainjob, runtime, trainer.template, cluster, tenant.name if tenant is not None else None)
    uid = derive_uid(trainjob)
    argv, moved = _run_argv(trainjob, runtime, cluster, trainer, nodes, procs, staging, uid)
    notes += moved + gpu_note(framework, procs, trainer.resources, trainer.job.name)
    notes += tuple(dropped_note(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}{option}]", option, value, why,
                                cluster.name, cluster.spec.type) for option, value, why in options.dropped)
    check_xgboost_tracker(framework, trainer.env)
    decided = _Decisions(framework=framework, launcher=launcher, nodes=nodes, procs=procs, options=options,
                         slurm=slurm, workdir=workdir, argv=argv, notes=notes, pod_group=pod_group,
                         staging=staging, uid=uid)
    plan = _launch_plan(trainjob, runtime, cluster, tenant, trainer, decided)
    check_identity(plan)
    return plan


def _check_admitted(trainjob: TrainJob, cluster: BridgeCluster, tenant: Tenant | None) -> None:
    """Whether this TrainJob is hpc-bridge's to run on *cluster* at all."""
    if trainjob.spec.managed_by not in (None, MANAGED_BY_BRIDGE) and not traits_of(cluster).runs_pods:
        raise InvalidSpec("spec.managedBy", trainjob.spec.managed_by,
                          f"this TrainJob is managed by another controller; set it to {MANAGED_BY_BRIDGE} or omit it")
    namespace = trainjob.namespace
    if tenant is None and not cluster.spec.allows_namespace(namespace):
        raise InvalidSpec("metadata.namespace", namespace, f"cluster {cluster.name!r} does not accept this namespace")


def _trainer(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster,
             framework: str) -> _Trainer:
    """The trainer's command, image, env and resources: the TrainJob's fields over the runtime's container."""
    template = merged_template(trainjob, runtime)
    trainer_job, container = trainer_container(template, runtime.name)
    spec_trainer = trainjob.spec.trainer
    command = tuple((spec_trainer.command if spec_trainer and spec_trainer.command is not None else container.command) or ())
    args = tuple((spec_trainer.args if spec_trainer and spec_trainer.args is not None else container.args) or ())
    traits = traits_of(cluster)
    if not command + args and not traits.runs_pods:
        # on Kubernetes the image's entrypoint runs, as with Kubeflow; elsewhere nothing would
        raise InvalidSpec("spec.trainer.command", None,
                          f"no command to run: neither the TrainJob nor runtime {runtime.name!r} gives one (on "
                          f"Kubernetes the image's entrypoint would run; a {cluster.spec.type} cluster runs no "
                          "image entrypoint)")
    image = (spec_trainer.image if spec_trainer and spec_trainer.image else None) or container.image
    if not image and traits.runs_pods:
        image = cluster.spec.defaults.image
    env = merged_env(container.env or [], (spec_trainer.env if spec_trainer else None) or [])
    check_reserved_env(trainjob, framework)
    resources = node_resources(container.resources, spec_trainer.resources_per_node if spec_trainer else None)
    return _Trainer(template, trainer_job, container, command, args, image, env, resources)


def _workdir(annotations: Mapping[str, str], container: Container, runtime: TrainingRuntime | ClusterTrainingRuntime,
             cluster: BridgeCluster) -> str | None:
    """The job's working directory: the annotation, else the runtime container's, else the cluster's default."""
    workdir = annotations.get(WORKDIR_ANNOTATION) or container.working_dir or cluster.spec.defaults.workdir
    if workdir is not None and not workdir:
        raise InvalidSpec(f"metadata.annotations[{WORKDIR_ANNOTATION}]", workdir, "must not be empty")
    if workdir is not None and not traits_of(cluster).runs_pods:
        # the working directory becomes '#SBATCH --chdir', a jobspec cwd or a local path
        source = f"metadata.annotations[{WORKDIR_ANNOTATION}]" \
            if annotations.get(WORKDIR_ANNOTATION) else \
            f"runtime {runtime.name}: container node workingDir" if container.working_dir else \
            f"cluster {cluster.name}: spec.defaults.workdir"
        check_directive_value(source, workdir)
    return workdir


def _run_argv(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster,
              trainer: _Trainer, nodes: int, procs: int, staging: StagingPlan | None,
              uid: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The command the nodes run, and a note when Kubeflow's paths in it moved: off Kubernetes, what Kubeflow's
    torch plugin and its initializer volume would have done in the pod is done here."""
    spec_trainer = trainjob.spec.trainer
    command, args, resources = trainer.command, trainer.args, trainer.resources
    argv = command + args
    if not traits_of(cluster).runs_pods and spec_trainer is not None and spec_trainer.command is not None \
            and tuple(command) == TORCHTUNE_ENTRYPOINT:
        # Kubeflow's torchtune rewriting, as its torch plugin does it in the pod: the recipe and config
        nproc = "auto" if resources.gpus and spec_trainer.num_proc_per_node is None else str(procs)
        argv = (*command, *torchtune_arguments(args, trainer.container.command or (), runtime.name, nodes,
                                               str(procs) if nproc == "auto" else nproc, resources.gpus, None), *args)
    if staging is not None and staging.dir and not (trainer.image and cluster.spec.defaults.container_runtime != "none"):
        argv, moved = workspace_paths(argv, staging.path(uid, ""))
        if moved:
            return argv, (f"spec.trainer.command: Kubeflow's {KUBEFLOW_WORKSPACE} is this job's staging directory "
                          f"{staging.path(uid, '').rstrip('/')} on cluster {cluster.name} (no container to mount it "
                          "in)",)
    return argv, ()


def _launch_plan(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster,
                 tenant: Tenant | None, trainer: _Trainer, decided: _Decisions) -> LaunchPlan:
    """The plan, from what resolve decided."""
    # the JobSet metadata is checked whatever the backend, though only Kubernetes writes it
    metadata = jobset_metadata(trainjob, runtime)
    return LaunchPlan(
        name=trainjob.name,
        namespace=trainjob.namespace,
        uid=decided.uid,
        cluster=cluster.name,
        backend=cluster.spec.type,
        framework=decided.framework,
        launcher=decided.launcher,
        nodes=decided.nodes,
        procs_per_node=decided.procs,
        resources=trainer.resources,
        command=decided.argv,
        env=trainer.env,
        image=trainer.image,
        container_runtime=cluster.spec.defaults.container_runtime,
        workdir=decided.workdir,
        time_limit_seconds=trainjob.spec.active_deadline_seconds,
        suspend=bool(trainjob.spec.suspend),
        options=decided.options,
        launch_command=tuple(cluster.spec.defaults.launch_command or ("hpcbridge", "launch")),
        runtime_name=runtime.name,
        notes=decided.notes,
        pod_group=decided.pod_group,
        staging=decided.staging,
        tenant=tenant.name if tenant is not None else None,
        kubernetes=_kubernetes_plan(trainjob, runtime, cluster, trainer, metadata),
        slurm=decided.slurm,
    )


def _kubernetes_plan(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, cluster: BridgeCluster,
                     trainer: _Trainer, metadata: Mapping[str, Mapping[str, str]]) -> KubernetesPlan | None:
    """What only the Kubernetes backend reads, for a cluster that runs pods; None for any other."""
    if not traits_of(cluster).runs_pods:
        return None
    spec_trainer = trainjob.spec.trainer
    policy = runtime.spec.ml_policy
    mpi = policy.mpi if policy else None
    kubernetes = cluster.spec.kubernetes
    return KubernetesPlan(
        jobset_template=trainer.template.model_dump(by_alias=True, exclude_none=True, mode="json"),
        jobset_metadata=metadata,
        container_command=trainer.command,
        container_args=trainer.args,
        trainer_given=spec_trainer is not None,
        procs_per_node_given=spec_trainer is not None and spec_trainer.num_proc_per_node is not None,
        trainer_command_given=spec_trainer is not None and spec_trainer.command is not None,
        env_injection=env_injection(policy),
        image_map=tuple(sorted(kubernetes.images.items())) if kubernetes else (),
        image_pull_policy=kubernetes.image_pull_policy if kubernetes else None,
        ssh_auth_mount_path=(mpi.ssh_auth_mount_path or "/root/.ssh") if mpi else None,
        run_launcher_as_node=bool(mpi and mpi.run_launcher_as_node),
        queue=queue_name(trainjob, cluster),
    )
