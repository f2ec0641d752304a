"""LaunchPlan → Slurm batch script. Pure: same plan, same bytes (pinned by golden files).

Every ``#SBATCH`` value is validated single-line by the planner and written by ``bridge.sbatch.directives``;
every value in the body goes through ``bridge.shell.quote``. Options Slurm cannot express are errors raised
before anything is written.
"""

from __future__ import annotations

import os
import re

from bridge import __version__
from bridge.annotations import SLURM_GPUS_ANNOTATION, UID_COMMENT_PREFIX
from bridge.errors import InvalidSpec
from bridge.mpi.spec import LaunchSpec, launch_framework
from bridge.plan import (
    ACCOUNT_ENV_LINE,
    MPI_LAUNCHERS,
    ONCE_PER_JOB,
    STAGE_COMMENT,
    Launcher,
    LaunchPlan,
    check_identity,
    check_shell_env,
    gang_note,
    job_environment,
    stage_command,
    stage_input_environment,
)
from bridge.sbatch.directives import directive_line
from bridge.sbatch.options import passthrough_value
from bridge.sbatch.values import GresItem, gpu_counts, gres_items, slurm_time
from bridge.shell import comment, join, quote

DEFAULT_OUTPUT = "hpcbridge-%x-%j.out"
#: a tenant's job gets its whole environment from sbatch's ``--export-file`` on this file descriptor: values
#: never go on a command line, into the batch script or into sbatch's own environment (see ``job_env``)
ENV_FD = 3
#: a tenant job's PATH when its TrainJob sets none (as slurmrestd jobs get it): nothing of the submitting
#: side's environment reaches a tenant's job
TENANT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: names sbatch silently drops from an --export-file (Slurm's env.c): refused rather than lost
_EXPORT_FILE_DROPS = ("DISPLAY", "ENVIRONMENT", "HOSTNAME")


def tasks_per_node(plan: LaunchPlan) -> int:
    # MPI ranks are Slurm tasks (mpirun places them with the allocation); torchrun and plain commands run
    # once per node and start their own workers.
    return plan.procs_per_node if plan.launcher in ONCE_PER_JOB else 1


def identity_comment(uid: str, user: str | None) -> str:
    """The user's comment, if any, with hpc-bridge's identity appended (never replacing it)."""
    return f"{user} {UID_COMMENT_PREFIX}{uid}" if user else f"{UID_COMMENT_PREFIX}{uid}"


def job_comment(plan: LaunchPlan) -> str:
    """Any comment the user passed through (``hpcbridge.io/sbatch.comment``), then the uid."""
    return identity_comment(plan.uid, dict(plan.options.sbatch_extra).get("comment"))


_COMMENT_UID = re.compile(rf"(?:^|\s){re.escape(UID_COMMENT_PREFIX)}(\S+)\s*$")


def comment_uid(comment: str) -> str | None:
    """The uid hpc-bridge appended to a job's comment (the last word); for jobs submitted before the uid was
    appended, the first word; else None."""
    match = _COMMENT_UID.search(comment)
    if match:
        return match.group(1)
    head = comment.split(" ", 1)[0]
    return head[len(UID_COMMENT_PREFIX):] or None if head.startswith(UID_COMMENT_PREFIX) else None


def job_env(plan: LaunchPlan, slurm_conf: str | None = None) -> dict[str, str] | None:
    """A tenant plan's whole job environment, which sbatch reads on fd ``ENV_FD`` (``--export-file``): a PATH,
    the cluster's SLURM_CONF (srun in the job needs it), then the TrainJob's env, which wins. sbatch unsets its
    own environment when it reads an export file, so nothing of the submitting side (the operator's variables,
    sudo's, an SSH login's) flows into the job, and the values are in no command line, script or process
    environment on the submitting host. None for a CLI plan: sbatch exports the user's own environment, as
    HPC users expect, and the script exports the TrainJob's env."""
    if plan.tenant is None:
        return None
    check_shell_env(plan)
    # SLURM_JOB_NAME as sbatch puts it in the environment it exports: from a file it does not, and the job (and
    # slurmd's %x) would have none
    env = {"PATH": TENANT_PATH, **({"SLURM_CONF": slurm_conf} if slurm_conf else {}),
           "SLURM_JOB_NAME": plan.options.slurm_job_name or plan.name}
    for entry in plan.env:
        value = entry.value or ""
        where = f"spec.trainer.env[{entry.name}]"
        # errors name the variable, never its value: it may be a secret, and errors become Events
        if entry.name in _EXPORT_FILE_DROPS:
            raise InvalidSpec(where, entry.name, "Slurm drops DISPLAY, ENVIRONMENT and HOSTNAME from the "
                                                 "environment it is handed; set it in the command instead")
        if len(entry.name) > 255 or len(value.encode()) >= 256 * 1024:
            raise InvalidSpec(where, f"{len(value.encode())} bytes", "Slurm takes names of at most 255 "
                                                                      "characters and values under 256 KiB")
        env[entry.name] = value
    # the initializers' env: read by the stage step, unset before the trainer
    return {**env, **stage_input_environment(plan)}


def job_env_names(env: dict[str, str]) -> str:
    """What a tenant artifact shows of the environment it sends: the names, never the values."""
    return (f"# the job's whole environment: sbatch reads it on file descriptor {ENV_FD} (--export-file={ENV_FD}) "
            "as NAME=value entries, taken from the TrainJob when it is submitted; values are never written "
            "here, in the script or on a command line\n" + "".join(f"{name}\n" for name in env))


def sbatch_command(plan: LaunchPlan, file_argument: bool) -> tuple[str, ...]:
    """The sbatch call that sends a batch script as it is: the user's flags, then hpc-bridge's identity.

    With *file_argument* sbatch reads the script file itself, exactly as ``sbatch FLAGS FILE`` would (job
    name and Command from the file); otherwise the script goes on stdin and its default job name, the file's
    name, is given explicitly, the one difference being Slurm's Command field.
    """
    script = plan.batch_script
    assert script is not None
    argv = ["sbatch", "--parsable", *tenant_flags(plan), *script.flags,
            f"--comment={identity_comment(plan.uid, script.comment)}"]
    if file_argument and script.path:
        return (*argv, script.path)
    if script.job_name is None and script.path:
        argv.append(f"--job-name={os.path.basename(script.path)}")
    return tuple(argv)


def tenant_flags(plan: LaunchPlan) -> tuple[str, ...]:
    """sbatch's flags for how a tenant job gets its environment (``job_env``); none for the CLI."""
    # --export=ALL too: Slurm 26.05's sbatch exports nothing of the file without it (22.05 and 24.11 read the
    # file alike either way; none of them adds sbatch's own environment to it)
    return () if plan.tenant is None else ("--export=ALL", f"--export-file={ENV_FD}")


def gpu_directive(plan: LaunchPlan) -> tuple[str, str] | None:
    """The GPU request as Slurm gets it: the converted script's own spelling when it kept one (Slurm's job
    environment differs by spelling), else ``--gpus-per-node``; None when another option already asks."""
    knobs = plan.options
    gpus = plan.resources.gpus
    spelled_as = plan.on_slurm().gpus
    if spelled_as:
        option, _, value = spelled_as.partition("=")
        spelled = _spelled_gpus_per_node(option, value, plan.nodes)
        if gpus and spelled is not None and spelled != gpus:
            raise InvalidSpec(f"metadata.annotations[{SLURM_GPUS_ANNOTATION}]", spelled_as,
                              f"asks Slurm for {spelled} GPUs per node but resourcesPerNode says {gpus}; "
                              "change or remove the annotation")
        return option, value
    extra = dict(knobs.sbatch_extra)
    if "gpus" in extra or any(item.name == "gpu" for item in _gres(extra.get("gres"))):
        return None  # the verbatim option asks for the GPUs in the user's words
    return ("gpus-per-node", str(gpus)) if gpus else None


def _gres(value: str | None) -> list[GresItem]:
    return gres_items(value) if value else []


def _spelled_gpus_per_node(option: str, value: str, nodes: int) -> int | None:
    if option == "gres":
        counts = [int(item.count) for item in _gres(value) if item.name == "gpu" and item.count.isdigit()]
        return sum(counts) if counts else None
    total = sum(count for _, count in gpu_counts(value))
    if option == "gpus":
        return total // nodes if total % nodes == 0 else None
    return total


def layout(plan: LaunchPlan) -> list[tuple[str, str]]:
    """The job's node and task options as hpc-bridge states them (``--ntasks`` and a node range come verbatim,
    from ``sbatch_extra``). A converted script's own layout (``plan.slurm.layout``) asks for what the script
    asked, no more: where it left the node count to Slurm, no ``--nodes`` is written (Slurm would record a fixed
    count, ``NumNodes=1-1``), and no ``--ntasks-per-node`` it did not give (Slurm would set SLURM_NTASKS*)."""
    extra = dict(plan.options.sbatch_extra)
    own_layout = plan.on_slurm().layout
    if own_layout is not None:
        given = []
        if "nodes" in own_layout and "nodes" not in extra:
            given.append(("nodes", str(plan.nodes)))
        if "ntasks-per-node" in own_layout:
            given.append(("ntasks-per-node", str(plan.procs_per_node)))
        return given
    options = [("nodes", str(plan.nodes))]
    total = extra.get("ntasks")
    if not (plan.launcher == Launcher.SCRIPT and total and total.isdigit()
            and -(-int(total) // plan.nodes) == plan.procs_per_node):
        # a batch script's TrainJob with no layout annotation that gives --ntasks alone keeps it alone (its
        # per-node count was derived from it): with --ntasks-per-node too, Slurm would want all of them on each node
        options.append(("ntasks-per-node", str(tasks_per_node(plan))))
    return options


def directives(plan: LaunchPlan) -> list[tuple[str, str | None]]:
    options: list[tuple[str, str | None]] = [
        ("job-name", plan.options.slurm_job_name or plan.name),
        ("comment", job_comment(plan)),
        *layout(plan),
    ]
    resources = plan.resources
    if resources.cpu_count is not None:
        per_task = -(-resources.cpu_count // tasks_per_node(plan))
        options.append(("cpus-per-task", str(per_task)))
    if resources.memory_mib is not None:
        options.append(("mem", f"{resources.memory_mib}M"))
    gpu = gpu_directive(plan)
    if gpu is not None:
        options.append(gpu)
    if plan.time_limit_seconds:
        options.append(("time", slurm_time(plan.time_limit_seconds)))
    knobs = plan.options
    for name in ("partition", "account", "qos", "constraint", "array", "dependency"):
        value = getattr(knobs, name)
        if value:
            options.append((name, value))
    if knobs.exclusive:
        options.append(("exclusive", None))
    if knobs.output or plan.launcher != Launcher.SCRIPT:
        # a converted batch script keeps Slurm's own default (slurm-%j.out), as sbatch gives it
        options.append(("output", _named(plan, knobs.output or DEFAULT_OUTPUT)))
    if knobs.error:
        options.append(("error", _named(plan, knobs.error)))
    if plan.workdir:
        options.append(("chdir", plan.workdir))
    if plan.suspend:
        options.append(("hold", None))
    if knobs.sbatch_extra:
        # a flag passed through as "true" is written bare (--requeue), as sbatch takes it
        options.extend((name, passthrough_value(name, value)) for name, value in knobs.sbatch_extra
                       if name != "comment")
    return options


def _named(plan: LaunchPlan, pattern: str) -> str:
    """An output file pattern as slurmd will open it. A job started from an export file (a tenant's) gets no
    SLURM_JOB_NAME from sbatch, so slurmd would open ``%x`` as "(null)" while ``scontrol show job`` names the
    file after the job: the name is written in instead (``%%`` stays a literal percent)."""
    if plan.tenant is None:
        return pattern
    name = plan.options.slurm_job_name or plan.name
    return re.sub(r"%(%|x)", lambda match: "%%" if match.group(1) == "%" else name, pattern)


def launch_spec(plan: LaunchPlan) -> LaunchSpec:
    return LaunchSpec(
        launcher=plan.launcher.value,
        discovery="slurm",
        procs_per_node=plan.procs_per_node,
        nodes=plan.nodes,
        command=plan.exec_argv,
        forward_env=tuple(entry.name for entry in plan.env) if plan.launcher in MPI_LAUNCHERS else (),
        rdzv_port=plan.rdzv_port,
        job_id=plan.uid,
        framework=launch_framework(plan.framework),
    )


def render_script(plan: LaunchPlan) -> str:
    check_identity(plan)
    check_shell_env(plan)
    lines = ["#!/bin/bash"]
    # the planner already refuses quotes, backslashes and control characters in these values; the writer is the
    # second line of defence: it refuses what would end or split the line and quotes what sbatch reads specially
    lines.extend(directive_line(name, value) for name, value in directives(plan))
    lines.append("")
    lines.append(comment(f"# hpc-bridge {__version__}: TrainJob {plan.namespace}/{plan.name} (runtime "
                         f"{plan.runtime_name}) on cluster {plan.cluster}. Generated; re-render instead of editing."))
    if gang_note(plan):
        lines.append(comment(f"# gang: {gang_note(plan)}"))
    lines.append("set -eu")
    lines.append(ACCOUNT_ENV_LINE)
    if plan.tenant is None:
        for entry in plan.env:
            lines.append(f"export {entry.name}={quote(entry.value or '')}")
    elif plan.env:
        # the job was started with these already (job_env): a script is kept by slurmctld and shown to
        # `scontrol show job -dd`, so it never carries their values
        lines.append(comment(f"# the TrainJob's env ({', '.join(entry.name for entry in plan.env)}) comes with "
                             "the job's environment, not this script"))
    for name, value in job_environment(plan):
        lines.append(f"export {name}={quote(value)}")
    if plan.staging:
        lines.append(STAGE_COMMENT)
        lines.append(stage_command(plan, input_in_environment=plan.tenant is not None))
    if plan.launcher == Launcher.SCRIPT:
        # a converted batch script: its body is the job, exactly as sbatch would run it
        lines.append(f"exec {join(plan.exec_argv)}")
        return "\n".join(lines) + "\n"
    launch = [*plan.launch_command, *launch_spec(plan).to_args()]
    if plan.launcher in ONCE_PER_JOB:
        # the batch host starts mpirun, which places ranks on the allocation through Slurm itself
        lines.append(f"exec {join(launch)}")
    else:
        lines.append(f"exec srun --nodes={plan.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {join(launch)}")
    return "\n".join(lines) + "\n"
