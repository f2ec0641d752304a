"""TrainJob + runtime + cluster → LaunchPlan: the one entry that composes the planning steps."""

from __future__ import annotations

from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX, SLURM_LAYOUT_ANNOTATION, WORKDIR_ANNOTATION
from bridge.api.cluster import BridgeCluster, Tenant
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import MANAGED_BY_BRIDGE, TrainJob
from bridge.errors import InvalidSpec
from bridge.plan.fidelity import jobset_metadata, pod_group_plan, queue_name, unhonoured_notes
from bridge.plan.frameworks import (
    RESERVED_ENV,
    TORCHTUNE_ENTRYPOINT,
    check_xgboost_tracker,
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
from bridge.plan.model import FRAMEWORK_LABEL, KUBEFLOW_WORKSPACE, LaunchPlan
from bridge.plan.options import backend_options, checked_slurm_layout, drop_slurm_only, dropped_note
from bridge.plan.select import derive_uid
from bridge.plan.staging import staging_plan, workspace_paths


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
    template = merged_template(trainjob, runtime)
    trainer_job, container = trainer_container(template, runtime.name)
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

    env = merged_env(container.env or [], (spec_trainer.env if spec_trainer else None) or [])
    for index, entry in enumerate((spec_trainer.env if spec_trainer else None) or []):
        if entry.name in RESERVED_ENV.get(framework, set()):
            raise InvalidSpec(f"spec.trainer.env[{index}].name", entry.name,
                              f"reserved by the {framework} policy; hpc-bridge sets it")

    resources = node_resources(container.resources, spec_trainer.resources_per_node if spec_trainer else None)

    nodes = node_count(trainjob, policy)
    procs, launcher = procs_and_launcher(trainjob, policy, framework, resources)
    mpi = policy.mpi if policy else None

    nodes_field = "spec.trainer.numNodes" if spec_trainer and spec_trainer.num_nodes is not None \
        else "runtime spec.mlPolicy.numNodes"
    check_bounds(cluster, nodes, nodes_field, procs, trainjob.spec.active_deadline_seconds)

    annotations = dict(trainjob.metadata.annotations or {})
    options = backend_options(annotations, cluster, namespace, tenant)
    check_privileged(options, cluster)
    options = drop_slurm_only(options, cluster, nodes, procs)
    slurm_layout = checked_slurm_layout(annotations.get(SLURM_LAYOUT_ANNOTATION), options, cluster, launcher, nodes, procs,
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
        check_directive_value(source, workdir)
    check_free_text(argv, env)
    launch_command = tuple(cluster.spec.defaults.launch_command or ("hpcbridge", "launch"))
    pod_group = pod_group_plan(runtime, cluster)
    notes = () if cluster.spec.type == "kubernetes" else \
        unhonoured_notes(trainjob, runtime, template, trainer_job, container, image, cluster)
    queue = queue_name(trainjob, cluster)
    staging = staging_plan(trainjob, runtime, template, cluster, tenant.name if tenant is not None else None)
    uid = derive_uid(trainjob)
    if cluster.spec.type != "kubernetes" and spec_trainer is not None and spec_trainer.command is not None \
            and tuple(command) == TORCHTUNE_ENTRYPOINT:
        # Kubeflow's torchtune rewriting, as its torch plugin does it in the pod: the recipe and config
        nproc = "auto" if resources.gpus and spec_trainer.num_proc_per_node is None else str(procs)
        argv = (*command, *torchtune_arguments(args, container.command or (), runtime.name, nodes,
                                               str(procs) if nproc == "auto" else nproc, resources.gpus, None), *args)
    if staging is not None and staging.dir and not (image and cluster.spec.defaults.container_runtime != "none"):
        argv, moved = workspace_paths(argv, staging.path(uid, ""))
        if moved:
            notes += (f"spec.trainer.command: Kubeflow's {KUBEFLOW_WORKSPACE} is this job's staging directory "
                      f"{staging.path(uid, '').rstrip('/')} on cluster {cluster.name} (no container to mount it in)",)
    notes += gpu_note(framework, procs, resources, trainer_job.name)
    notes += tuple(dropped_note(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}{option}]", option, value, why,
                                cluster.name, cluster.spec.type) for option, value, why in options.dropped)
    check_xgboost_tracker(framework, env)

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
        jobset_metadata=jobset_metadata(trainjob, runtime),
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
