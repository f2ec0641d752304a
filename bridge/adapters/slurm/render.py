"""LaunchPlan → Slurm batch script. Pure: same plan, same bytes (pinned by golden files).

Every ``#SBATCH`` value is validated single-line in plan.py and quoted here; every value in the body goes
through ``bridge.shell.quote``. Options Slurm cannot express are errors raised before anything is written.
"""

from __future__ import annotations

import re

from bridge import __version__
from bridge.api.names import has_control
from bridge.convert.sbatch import passthrough_value, slurm_time
from bridge.errors import InvalidSpec
from bridge.mpi.bootstrap import LaunchSpec
from bridge.plan import (
    ACCOUNT_ENV_LINE,
    MPI_LAUNCHERS,
    ONCE_PER_JOB,
    Launcher,
    LaunchPlan,
    check_identity,
    check_shell_env,
    job_environment,
)
from bridge.shell import comment, join, quote

DEFAULT_OUTPUT = "hpcbridge-%x-%j.out"
#: prefix of the comment every job carries; the uid after it makes submit idempotent
COMMENT_PREFIX = "hpcbridge.io/uid="


_OPTION_NAME = re.compile(r"[a-z][a-z0-9-]*")


def directive_value(value: str, option: str = "") -> str:
    """*value* as one argument of a ``#SBATCH`` line that sbatch's ``get_argument`` reads back exactly.

    plan.py already refuses quotes, backslashes and control characters in these values; this is the second
    line of defence: a control character (which would end or split the line) is refused here too, and any
    character sbatch's parser treats specially (blank, ``#``, quotes, backslash) is quoted and escaped.
    """
    if has_control(value):
        raise InvalidSpec(f"#SBATCH --{option}" if option else "#SBATCH", value,
                          "a #SBATCH value must be one line without control characters")
    if not re.search(r"[\s#\"'\\]", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def tasks_per_node(plan: LaunchPlan) -> int:
    # MPI ranks are Slurm tasks (mpirun places them with the allocation); torchrun and plain commands run
    # once per node and start their own workers.
    return plan.procs_per_node if plan.launcher in ONCE_PER_JOB else 1


def job_comment(plan: LaunchPlan) -> str:
    """The uid first, then any comment the user passed through (``hpcbridge.io/sbatch.comment``)."""
    user = dict(plan.options.sbatch_extra).get("comment")
    return f"{COMMENT_PREFIX}{plan.uid}" + (f" {user}" if user else "")


def comment_uid(comment: str) -> str | None:
    head = comment.split(" ", 1)[0]
    return head[len(COMMENT_PREFIX):] if head.startswith(COMMENT_PREFIX) else None


def directives(plan: LaunchPlan) -> list[tuple[str, str | None]]:
    options: list[tuple[str, str | None]] = [
        ("job-name", plan.name),
        ("comment", job_comment(plan)),
        ("nodes", str(plan.nodes)),
        ("ntasks-per-node", str(tasks_per_node(plan))),
    ]
    resources = plan.resources
    if resources.cpu_count is not None:
        per_task = -(-resources.cpu_count // tasks_per_node(plan))
        options.append(("cpus-per-task", str(per_task)))
    if resources.memory_mib is not None:
        options.append(("mem", f"{resources.memory_mib}M"))
    if resources.gpus:
        options.append(("gpus-per-node", str(resources.gpus)))
    if plan.time_limit_seconds:
        options.append(("time", slurm_time(plan.time_limit_seconds)))
    knobs = plan.options
    for name in ("partition", "account", "qos", "constraint", "array", "dependency"):
        value = getattr(knobs, name)
        if value:
            options.append((name, value))
    if knobs.exclusive:
        options.append(("exclusive", None))
    options.append(("output", knobs.output or DEFAULT_OUTPUT))
    if knobs.error:
        options.append(("error", knobs.error))
    if plan.workdir:
        options.append(("chdir", plan.workdir))
    if plan.suspend:
        options.append(("hold", None))
    # a flag passed through as "true" is written bare (--requeue), as sbatch takes it
    options.extend((name, passthrough_value(name, value)) for name, value in knobs.sbatch_extra if name != "comment")
    return options


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
    )


def render_script(plan: LaunchPlan) -> str:
    check_identity(plan)
    check_shell_env(plan)
    lines = ["#!/bin/bash"]
    for name, value in directives(plan):
        if not _OPTION_NAME.fullmatch(name):
            raise InvalidSpec("#SBATCH", name, "not an sbatch long option name")
        lines.append(f"#SBATCH --{name}" if value is None else f"#SBATCH --{name}={directive_value(value, name)}")
    lines.append("")
    lines.append(comment(f"# hpc-bridge {__version__}: TrainJob {plan.namespace}/{plan.name} (runtime "
                         f"{plan.runtime_name}) on cluster {plan.cluster}. Generated; re-render instead of editing."))
    lines.append("set -eu")
    lines.append(ACCOUNT_ENV_LINE)
    for entry in plan.env:
        lines.append(f"export {entry.name}={quote(entry.value or '')}")
    for name, value in job_environment(plan):
        lines.append(f"export {name}={quote(value)}")
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
