"""LaunchPlan → Flux jobspec v1 (RFC 14/25), batch style: a subinstance whose initial program is a script.

The script is carried in ``attributes.system.files.script`` and started by ``flux broker`` exactly as
``flux batch`` does; inside it ``hpcbridge launch`` starts the ranks with ``flux run`` (Flux's own PMI).
"""

from __future__ import annotations

import json
from typing import Any

from bridge import __version__
from bridge.adapters.flux.validate import validate_jobspec
from bridge.annotations import CONSTRAINT_ANNOTATION, PREFIX, WORKDIR_ANNOTATION
from bridge.errors import InvalidSpec
from bridge.mpi.spec import LaunchSpec, launch_framework
from bridge.plan import (
    ACCOUNT_ENV_LINE,
    MPI_LAUNCHERS,
    STAGE_COMMENT,
    Launcher,
    LaunchPlan,
    check_identity,
    check_shell_env,
    gang_note,
    job_environment,
    script_env,
    stage_command,
)
from bridge.shell import comment, join, quote


def batch_script(plan: LaunchPlan) -> str:
    check_identity(plan)
    # Inside a Flux instance MPI ranks are started by flux-shell (PMI), not mpirun over ssh.
    per_node = plan.launcher in (Launcher.TORCHRUN, Launcher.PLAIN)
    spec = LaunchSpec(
        launcher="flux" if plan.launcher in MPI_LAUNCHERS else plan.launcher.value,
        discovery="flux",
        procs_per_node=plan.procs_per_node,
        nodes=plan.nodes,
        command=plan.exec_argv,
        rdzv_port=plan.rdzv_port,
        job_id=plan.uid,
        framework=launch_framework(plan.framework),
        gpus_per_node=plan.resources.gpus if plan.launcher in MPI_LAUNCHERS else 0,
    )
    launch = join([*plan.launch_command, *spec.to_args()])
    # one launch per node holding all of the node's cores and GPUs: flux run's default is one core and, on
    # an instance with GPUs, none (Flux then sets CUDA_VISIBLE_DEVICES=-1)
    node_task = [f"--nodes={plan.nodes}", f"--ntasks={plan.nodes}", f"--cores-per-task={_node_cores(plan)}",
                 *([f"--gpus-per-task={plan.resources.gpus}"] if plan.resources.gpus else [])]
    lines = [
        "#!/bin/bash",
        comment(f"# hpc-bridge {__version__}: TrainJob {plan.namespace}/{plan.name} (runtime {plan.runtime_name}) "
                f"on cluster {plan.cluster}. Generated; re-render instead of editing."),
        *([comment(f"# gang: {gang_note(plan)}")] if gang_note(plan) else []),
        "set -eu",
        ACCOUNT_ENV_LINE,
        *(f"export {entry.name}={quote(entry.value or '')}" for entry in plan.env),
        # here, not in the jobspec's environment: the subinstance's broker drops SLURM_* from what it inherits
        *(f"export {name}={quote(value)}" for name, value in script_env(plan).items()),
        *((STAGE_COMMENT, stage_command(plan)) if plan.staging else ()),
        f"exec flux run {' '.join(node_task)} {launch}" if per_node else f"exec {launch}",
    ]
    return "\n".join(lines) + "\n"


#: a jobspec's environment is the job's whole environment (the flux CLI copies the submitter's; we don't)
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def _system(plan: LaunchPlan, base_env: dict[str, str] | None) -> dict[str, Any]:
    check_identity(plan)
    check_shell_env(plan)
    system: dict[str, Any] = {
        # RFC 25 requires duration; 0 means unlimited (bounded by the instance)
        "duration": float(plan.time_limit_seconds or 0),
        "environment": {"PATH": BASE_PATH, **(base_env or {}), **{entry.name: entry.value or "" for entry in plan.env},
                        **dict(job_environment(plan))},
        "job": {"name": plan.name},
        "shell": {"options": {}},
    }
    if plan.workdir:
        if not plan.workdir.startswith("/"):
            raise InvalidSpec(f"metadata.annotations[{WORKDIR_ANNOTATION}]", plan.workdir,
                              "Flux needs an absolute working directory")
        system["cwd"] = plan.workdir
    if plan.options.partition:
        system["queue"] = plan.options.partition
    if plan.options.account:
        system["bank"] = plan.options.account
    if plan.options.dependency:
        # RFC 26: one entry per job (Slurm's afterok:1:2 is two), the job id as Flux writes it (ƒ… or decimal)
        system["dependencies"] = [{"scheme": scheme, "value": job} for scheme, *jobs in
                                  (item.split(":") for item in plan.options.dependency.split(",")) for job in jobs]
    if plan.options.constraint:
        system["constraints"] = {"properties": _properties(plan.options.constraint)}
    output = {stream: {"type": "file", "path": _flux_path(f"metadata.annotations[{PREFIX}{option}]", path)}
              for stream, option, path in (("stdout", "output", plan.options.output),
                                           ("stderr", "error", plan.options.error)) if path}
    if output:
        system["shell"]["options"]["output"] = output
    return system


def _properties(constraint: str) -> list[str]:
    """A Slurm constraint of features joined by ``&`` → Flux node properties (RFC 31); nothing else maps."""
    features = constraint.split("&")
    if not all(feature and feature.replace("-", "").replace("_", "").replace(".", "").isalnum()
               for feature in features):
        raise InvalidSpec(f"metadata.annotations[{CONSTRAINT_ANNOTATION}]", constraint,
                          "Flux takes node properties joined by & (no |, brackets or counts)")
    return features


#: Slurm filename patterns with a Flux equivalent (mustache templates of the job shell)
_PATTERNS = {"%j": "{{id}}", "%x": "{{name}}", "%%": "%"}


def _flux_path(where: str, path: str) -> str:
    out, index = [], 0
    while index < len(path):
        if path[index] == "%":
            pattern = path[index:index + 2]
            if pattern not in _PATTERNS:
                raise InvalidSpec(where, path, f"Flux has no equivalent of the filename pattern {pattern!r} "
                                               "(only %j, %x and %%)")
            out.append(_PATTERNS[pattern])
            index += 2
        else:
            out.append(path[index])
            index += 1
    return "".join(out)


def _user(plan: LaunchPlan) -> dict[str, Any]:
    user: dict[str, str | None] = {"uid": plan.uid, "namespace": plan.namespace, "name": plan.name,
                                   "cluster": plan.cluster}
    if gang_note(plan):
        user["gang"] = gang_note(plan)  # a jobspec has no comments: said where flux job info shows it
    return {"hpcbridge": user}


def _node_cores(plan: LaunchPlan) -> int:
    """Cores per node of a batch job: what it asks for, and at least one per process."""
    return max(plan.resources.cpu_count or 0, plan.procs_per_node, 1)


def batch_jobspec(plan: LaunchPlan, base_env: dict[str, str] | None = None) -> dict[str, Any]:
    """``flux batch`` style: one broker per node runs a subinstance whose initial program is the script."""
    slot_with: list[dict[str, Any]] = [{"type": "core", "count": _node_cores(plan)}]
    if plan.resources.gpus:
        slot_with.append({"type": "gpu", "count": plan.resources.gpus})
    system = _system(plan, base_env)
    # RFC 37 modes are full st_mode values: a regular file (S_IFREG) the owner may read and execute
    system["files"] = {"script": {"mode": 0o100700, "data": batch_script(plan), "encoding": "utf-8"}}
    # as `flux batch` sets them: brokers one per node, no MPI personality, no early exit of the subinstance
    system["shell"]["options"].update({"per-resource": {"type": "node"}, "mpi": "none", "exit-timeout": "none"})
    return {
        "version": 1,
        "resources": [{"type": "node", "count": plan.nodes, "exclusive": True,
                       "with": [{"type": "slot", "count": 1, "label": "task", "with": slot_with}]}],
        "tasks": [{"command": ["flux", "broker", "{{tmpdir}}/script"], "slot": "task", "count": {"per_slot": 1}}],
        "attributes": {"system": system, "user": _user(plan)},
    }


def direct_jobspec(plan: LaunchPlan, base_env: dict[str, str] | None = None) -> dict[str, Any]:
    """``flux run -N nodes -n nodes*procs -c cores -g gpus`` style: Flux's shell starts every rank (PMI)."""
    procs, gpus = plan.procs_per_node, plan.resources.gpus
    per_task_cores = max(1, (plan.resources.cpu_count or procs) // procs)
    if gpus and gpus % procs:
        # GPUs that don't split evenly over the ranks (2 GPUs, 4 ranks): one slot per node holds them all, and
        # its ranks share them; a slot per rank could ask for no GPU at all
        slot = {"type": "slot", "count": 1, "label": "task",
                "with": [{"type": "core", "count": per_task_cores * procs}, {"type": "gpu", "count": gpus}]}
        per_slot = procs
    else:
        slot_with: list[dict[str, Any]] = [{"type": "core", "count": per_task_cores}]
        if gpus:
            slot_with.append({"type": "gpu", "count": gpus // procs})
        slot = {"type": "slot", "count": procs, "label": "task", "with": slot_with}
        per_slot = 1
    return {
        "version": 1,
        "resources": [{"type": "node", "count": plan.nodes,
                       **({"exclusive": True} if plan.options.exclusive else {}), "with": [slot]}],
        "tasks": [{"command": list(plan.exec_argv), "slot": "task", "count": {"per_slot": per_slot}}],
        "attributes": {"system": _system(plan, base_env), "user": _user(plan)},
    }


def jobspec(plan: LaunchPlan, base_env: dict[str, str] | None = None) -> dict[str, Any]:
    """*base_env* is the cluster's environment for jobs (at least a PATH that finds flux and hpcbridge)."""
    # runtimes whose launcher is Flux's own PMI go direct; everything else runs hpcbridge launch in a batch
    # (a job with initializers too: its stage step runs first, in the batch script)
    direct = plan.launcher == Launcher.FLUX and not plan.staging
    spec = direct_jobspec(plan, base_env) if direct else batch_jobspec(plan, base_env)
    validate_jobspec(spec)
    return spec


def render_jobspec(plan: LaunchPlan, base_env: dict[str, str] | None = None) -> str:
    return json.dumps(jobspec(plan, base_env), indent=2, ensure_ascii=False) + "\n"
