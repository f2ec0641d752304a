"""LaunchPlan → Flux jobspec v1 (RFC 14/25), batch style: a subinstance whose initial program is a script.

The script is carried in ``attributes.system.files.script`` and started by ``flux broker`` exactly as
``flux batch`` does; inside it ``hpcbridge launch`` starts the ranks with ``flux run`` (Flux's own PMI).
"""

from __future__ import annotations

import json
from typing import Any

from bridge import __version__
from bridge.mpi.bootstrap import LaunchSpec
from bridge.plan import MPI_LAUNCHERS, Launcher, LaunchPlan, check_shell_env
from bridge.shell import join, quote


def batch_script(plan: LaunchPlan) -> str:
    check_shell_env(plan)
    # Inside a Flux instance MPI ranks are started by flux-shell (PMI), not mpirun over ssh.
    per_node = plan.launcher in (Launcher.TORCHRUN, Launcher.PLAIN)
    script = plan.launcher == Launcher.SCRIPT
    spec = LaunchSpec(
        launcher="flux" if plan.launcher in MPI_LAUNCHERS else "plain" if script else plan.launcher.value,
        discovery="flux",
        procs_per_node=plan.procs_per_node,
        nodes=plan.nodes,
        command=plan.exec_argv,
        rdzv_port=plan.rdzv_port,
        job_id=plan.uid,
    )
    launch = join([*plan.launch_command, *spec.to_args()])
    lines = [
        "#!/bin/bash",
        f"# hpc-bridge {__version__}: TrainJob {plan.namespace}/{plan.name} (runtime {plan.runtime_name}) "
        f"on cluster {plan.cluster}. Generated; re-render instead of editing.",
        "set -eu",
        *(f"export {entry.name}={quote(entry.value or '')}" for entry in plan.env),
        f"exec flux run --nodes={plan.nodes} --tasks-per-node=1 {launch}" if per_node
        else f"exec {join(plan.exec_argv)}" if script else f"exec {launch}",
    ]
    return "\n".join(lines) + "\n"


def jobspec(plan: LaunchPlan) -> dict[str, Any]:
    cores = max(plan.resources.cpu_count or 0, plan.procs_per_node, 1)
    slot_with: list[dict[str, Any]] = [{"type": "core", "count": cores}]
    if plan.resources.gpus:
        slot_with.append({"type": "gpu", "count": plan.resources.gpus})
    system: dict[str, Any] = {
        # RFC 25 requires duration; 0 means unlimited (bounded by the instance)
        "duration": float(plan.time_limit_seconds or 0),
        "environment": {entry.name: entry.value or "" for entry in plan.env},
        "job": {"name": plan.name},
        "shell": {"options": {}},
        "files": {"script": {"mode": 0o700, "data": batch_script(plan), "encoding": "utf-8"}},
    }
    if plan.workdir:
        system["cwd"] = plan.workdir
    if plan.options.partition:
        system["queue"] = plan.options.partition
    if plan.options.account:
        system["bank"] = plan.options.account
    if plan.options.dependency:
        system["dependencies"] = [{"scheme": scheme, "value": value} for scheme, _, value in
                                  (item.partition(":") for item in plan.options.dependency.split(","))]
    return {
        "version": 1,
        "resources": [{"type": "node", "count": plan.nodes, "exclusive": True,
                       "with": [{"type": "slot", "count": 1, "label": "task", "with": slot_with}]}],
        "tasks": [{"command": ["flux", "broker", "{{tmpdir}}/script"], "slot": "task", "count": {"per_slot": 1}}],
        "attributes": {
            "system": system,
            "user": {"hpcbridge": {"uid": plan.uid, "namespace": plan.namespace, "name": plan.name,
                                   "cluster": plan.cluster}},
        },
    }


def render_jobspec(plan: LaunchPlan) -> str:
    return json.dumps(jobspec(plan), indent=2, ensure_ascii=False) + "\n"
