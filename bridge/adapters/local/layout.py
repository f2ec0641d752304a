"""The local cluster's artifact: the exact processes a job starts on this machine, and their text.

``process_layout`` is the typed request ``render`` produces and ``submit`` starts as it is; ``layout_text`` is
its text (the golden files pin it). What only this machine can say at the start is bound then, and only
that: the variables inherited from this process's environment, the GPUs each node's share names, and the
coordinator port when the plan's is taken (``ProcessLayout.on_port``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bridge.adapters.base import Artifact
from bridge.api.loader import dump_yaml
from bridge.mpi.spec import LaunchSpec, launch_framework
from bridge.plan import (
    MPI_LAUNCHERS,
    ONCE_PER_JOB,
    Launcher,
    LaunchPlan,
    check_shell_env,
    gang_note,
    job_environment,
    script_env,
    stage_argv,
    stage_input,
)

Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LocalProcess:
    """One process group: a node's ``hpcbridge launch`` (MPI launchers and batch scripts: the whole job's)."""

    node: int
    #: the launch command before its arguments (``hpcbridge launch``)
    command: tuple[str, ...]
    launch: LaunchSpec
    #: the TrainJob's own env, as the text shows it
    env: Pairs
    #: what hpc-bridge sets on top of it: the job's variables, a batch script's sbatch ones, the node's rank
    job_env: Pairs
    #: the emulated nodes whose GPUs the group holds (a group for the whole job holds every node's)
    gpu_nodes: tuple[int, ...]

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.command, *self.launch.to_args())

    def environment(self) -> dict[str, str]:
        """The variables the group is started with, over those it inherits."""
        return {**dict(self.env), **dict(self.job_env)}


@dataclass(frozen=True)
class StageStep:
    """The stage step, run first and alone: the groups start only when it succeeded."""

    argv: tuple[str, ...]
    #: the initializers' env, on stdin (never on a command line); None when they have none
    stdin: str | None
    env: Pairs
    staging_dir: str
    tenant: str | None


@dataclass(frozen=True)
class ProcessLayout:
    """Everything a local job starts, and what its record says of it."""

    cluster: str
    namespace: str
    name: str
    uid: str
    #: "." is the directory submit runs in
    workdir: str
    time_limit_seconds: int | None
    #: the coordinator port the processes' arguments name
    port: int
    nodes: int
    gpus_per_node: int
    processes: tuple[LocalProcess, ...]
    stage: StageStep | None = None
    gang: str | None = None

    def on_port(self, port: int) -> ProcessLayout:
        """The same layout with its coordinator on *port* (every local job shares this machine's ports)."""
        return replace(self, port=port, processes=tuple(
            replace(process, launch=process.launch._replace(rdzv_port=port)) for process in self.processes))


@dataclass(frozen=True, kw_only=True)
class LocalArtifact(Artifact):
    """The rendered layout: its text is ``files[0]``, and ``layout`` is what submit starts."""

    layout: ProcessLayout


def process_layout(plan: LaunchPlan) -> ProcessLayout:
    """The plan's processes on this machine: one group per node, like one container per pod, except MPI and
    Flux-style launchers and batch scripts, which start every rank from one group. InvalidSpec where the
    plan cannot run here."""
    check_shell_env(plan)
    groups = 1 if plan.launcher in ONCE_PER_JOB else plan.nodes
    shared = (*job_environment(plan), *script_env(plan).items())
    own = tuple((entry.name, entry.value or "") for entry in plan.env)
    processes = tuple(
        LocalProcess(node, plan.launch_command, _launch_spec(plan, node), own,
                     (*shared, ("HPCBRIDGE_NODE_RANK", str(node))),
                     (node,) if groups == plan.nodes else tuple(range(plan.nodes)))
        for node in range(groups))
    return ProcessLayout(plan.cluster, plan.namespace, plan.name, plan.uid, plan.workdir or ".",
                         plan.time_limit_seconds, plan.rdzv_port, plan.nodes, plan.resources.gpus or 0, processes,
                         _stage_step(plan), gang_note(plan))


def _launch_spec(plan: LaunchPlan, node: int) -> LaunchSpec:
    return LaunchSpec(
        # no scheduler here: a script's steps run through the srun shim, Flux-policy ranks with Open MPI
        launcher={Launcher.FLUX: "openmpi"}.get(plan.launcher, plan.launcher.value),
        discovery="local",
        procs_per_node=plan.procs_per_node,
        nodes=plan.nodes,
        node_rank=node,
        command=plan.exec_argv,
        forward_env=tuple(entry.name for entry in plan.env) if plan.launcher in MPI_LAUNCHERS else (),
        rdzv_port=plan.rdzv_port,
        job_id=plan.uid,
        framework=launch_framework(plan.framework),
    )


def _stage_step(plan: LaunchPlan) -> StageStep | None:
    if not plan.staging:
        return None
    return StageStep(stage_argv(plan), stage_input(plan), job_environment(plan), plan.staging.dir,
                     plan.staging.tenant)


def layout_text(layout: ProcessLayout) -> str:
    """The layout as YAML: each group's argv and the TrainJob's env, the stage step and its stdin."""
    document: dict[str, Any] = {
        "cluster": layout.cluster,
        "trainJob": {"namespace": layout.namespace, "name": layout.name, "uid": layout.uid},
        "workdir": layout.workdir,
        "timeLimitSeconds": layout.time_limit_seconds,
        "processGroups": [{"node": p.node, "argv": list(p.argv), "env": dict(p.env)} for p in layout.processes],
    }
    if layout.gang:
        document["gang"] = layout.gang
    if layout.stage is not None:
        document["stage"] = {"argv": list(layout.stage.argv),
                             **({"stdin": layout.stage.stdin} if layout.stage.stdin is not None else {})}
    return dump_yaml([document])
