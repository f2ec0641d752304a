"""The TrainJob's initializers as a StagingPlan, the stage step an HPC backend runs before the trainer, and the
environment every job finds."""

from __future__ import annotations

import re

from bridge.api.cluster import BridgeCluster
from bridge.api.k8s import JobSetSpec
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.storage import StageSource
from bridge.api.trainjob import DatasetInitializer, TrainJob
from bridge.errors import InvalidSpec
from bridge.plan.limits import check_directive_value
from bridge.plan.model import KUBEFLOW_WORKSPACE, STAGED_DIR_ENV, Launcher, LaunchPlan, StagingPlan
from bridge.plan.traits import backend_traits, traits_of
from bridge.shell import SHELL_ENV_NAME


def staging_plan(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime, template: JobSetSpec, cluster: BridgeCluster,
             tenant: str | None = None) -> StagingPlan | None:
    """The TrainJob's initializers, checked where the backend will read them: each URI's scheme, and on
    Kubernetes the runtime's initializer job (as Kubeflow's webhook checks it); elsewhere the cluster's shared
    storage. Nothing to stage: None."""
    from bridge.api.storage import ROLES, parse_storage_uri, secret_name_problem

    initializer = trainjob.spec.initializer
    # Kubernetes: the runtime's initializer jobs fetch the data; elsewhere the cluster's shared storage holds it
    kubernetes = traits_of(cluster).runs_pods
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
    if staging_dir is None and traits_of(cluster).stages_on_this_machine:
        from bridge.records import state_root

        staging_dir = str(state_root() / "staging")
    if staging_dir is None:
        raise InvalidSpec("spec.initializer", ", ".join(s.uri for s in sources),
                          f"cluster {cluster.name!r} has no shared storage to stage into: set its spec.stagingDir "
                          "(a directory every node mounts)")
    check_directive_value(f"cluster {cluster.name}: spec.stagingDir", staging_dir)
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


def workspace_paths(argv: tuple[str, ...], job_dir: str) -> tuple[tuple[str, ...], bool]:
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
    if plan.launcher != Launcher.SCRIPT or backend_traits(plan.backend).takes_sbatch_options:
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
