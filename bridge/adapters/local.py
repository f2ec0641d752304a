"""The built-in ``local`` cluster: runs a plan on this machine, no scheduler needed.

Each "node" of the plan is a process group running the same ``hpcbridge launch`` bootstrap that compute
nodes run. MPI and Flux-style launchers need one group (mpirun starts every rank on localhost); torchrun
and plain commands get one group per node, like one container per pod.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge.adapters.base import Adapter, Artifact, ArtifactFile, JobRef, JobState, JobStatus
from bridge.api.loader import dump_yaml
from bridge.errors import BackendRejected
from bridge.mpi.bootstrap import LaunchSpec
from bridge.plan import MPI_LAUNCHERS, ONCE_PER_JOB, Launcher, LaunchPlan, check_shell_env

#: seconds a node group gets between SIGTERM and SIGKILL when the job is stopped
GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class LocalProcess:
    node: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def layout(plan: LaunchPlan) -> list[LocalProcess]:
    check_shell_env(plan)
    groups = 1 if plan.launcher in ONCE_PER_JOB else plan.nodes
    processes = []
    for node in range(groups):
        spec = LaunchSpec(
            # no scheduler here: a script runs as a plain command, and Flux-policy ranks start with Open MPI
            launcher={Launcher.SCRIPT: "plain", Launcher.FLUX: "openmpi"}.get(plan.launcher, plan.launcher.value),
            discovery="local",
            procs_per_node=plan.procs_per_node,
            nodes=plan.nodes,
            node_rank=node,
            command=plan.exec_argv,
            forward_env=tuple(entry.name for entry in plan.env) if plan.launcher in MPI_LAUNCHERS else (),
            rdzv_port=plan.rdzv_port,
            job_id=plan.uid,
        )
        env = tuple((entry.name, entry.value or "") for entry in plan.env)
        processes.append(LocalProcess(node, (*plan.launch_command, *spec.to_args()), env))
    return processes


def render_layout(plan: LaunchPlan) -> str:
    document = {
        "cluster": plan.cluster,
        "trainJob": {"namespace": plan.namespace, "name": plan.name, "uid": plan.uid},
        "workdir": plan.workdir or ".",
        "processGroups": [{"node": p.node, "argv": list(p.argv), "env": dict(p.env)} for p in layout(plan)],
    }
    return dump_yaml([document])


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "hpcbridge" / "local"


@dataclass
class _RunningJob:
    ref: JobRef
    processes: list[subprocess.Popen]
    log_dir: Path
    pumps: list[threading.Thread] = field(default_factory=list)
    cancelled: bool = False
    #: exit code of the node that failed first; the others were stopped because of it
    first_failure: int | None = None


class LocalAdapter(Adapter):
    backend = "local"

    def __init__(self, cluster, output: Callable[[str], None] | None = None) -> None:
        super().__init__(cluster)
        self._jobs: dict[str, _RunningJob] = {}
        self._output = output or (lambda line: (sys.stdout.write(line), sys.stdout.flush()))

    def render(self, plan: LaunchPlan) -> Artifact:
        return Artifact("local", "process-layout", plan,
                        (ArtifactFile(f"{plan.name}.local.yaml", render_layout(plan), "application/yaml"),))

    def submit(self, artifact: Artifact) -> JobRef:
        plan = artifact.plan
        workdir = plan.workdir or os.getcwd()
        if not os.path.isdir(workdir):
            raise BackendRejected("local", f"workdir {workdir!r} does not exist")
        ref = JobRef(self.cluster.name, "local", plan.uid, plan.uid, plan.name)
        if ref.job_id in self._jobs and self._jobs[ref.job_id].processes[0].poll() is None:
            return ref  # already running in this process: submit is idempotent
        log_dir = state_dir() / plan.uid
        log_dir.mkdir(parents=True, exist_ok=True)
        groups = layout(plan)
        # The children run with this hpc-bridge's Python first on PATH, so `python3`, `torchrun` and
        # `mpirun`-launched ranks find the packages installed next to it.
        base_env = dict(os.environ)
        bindir = os.path.dirname(sys.executable)
        base_env["PATH"] = bindir + os.pathsep + base_env.get("PATH", "")
        job = _RunningJob(ref, [], log_dir)
        prefix = len(groups) > 1
        for group in groups:
            env = {**base_env, **dict(group.env), "HPCBRIDGE_NODE_RANK": str(group.node)}
            try:
                proc = subprocess.Popen(list(group.argv), cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                self._stop(job, signal.SIGKILL)
                raise BackendRejected("local", f"cannot start {group.argv[0]!r}: {exc.strerror}") from None
            job.processes.append(proc)
            pump = threading.Thread(target=self._pump, args=(proc, log_dir / f"node-{group.node}.log",
                                                             f"[node-{group.node}] " if prefix else ""), daemon=True)
            pump.start()
            job.pumps.append(pump)
        self._jobs[ref.job_id] = job
        return ref

    def _pump(self, proc: subprocess.Popen, log_path: Path, prefix: str) -> None:
        assert proc.stdout is not None
        with open(log_path, "wb") as log:
            for raw in iter(proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                self._output(prefix + raw.decode("utf-8", errors="replace"))

    def _status(self, job: _RunningJob) -> JobStatus:
        codes = [proc.poll() for proc in job.processes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed and job.first_failure is None and not job.cancelled:
            job.first_failure = failed[0]
        if job.first_failure is not None:
            failed = [job.first_failure]
        if job.cancelled and all(code is not None for code in codes):
            return JobStatus(job.ref, JobState.CANCELLED, exit_code=_shell_code(failed[0]) if failed else 0)
        if failed:
            return JobStatus(job.ref, JobState.FAILED, exit_code=_shell_code(failed[0]),
                             reason="NonZeroExit", message=f"a node exited with code {_shell_code(failed[0])}")
        if all(code == 0 for code in codes):
            return JobStatus(job.ref, JobState.SUCCEEDED, exit_code=0)
        return JobStatus(job.ref, JobState.RUNNING)

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        result = {}
        for ref in refs:
            job = self._jobs.get(ref.job_id)
            result[ref] = self._status(job) if job else JobStatus(ref, JobState.UNKNOWN, reason="NotInThisProcess")
        return result

    def wait(self, ref: JobRef, poll_interval: float = 0.05) -> JobStatus:
        """Block until every node group ends; a failing group stops the others (as one job fails whole)."""
        job = self._jobs[ref.job_id]
        while True:
            status = self._status(job)
            if status.state == JobState.FAILED and any(p.poll() is None for p in job.processes):
                self._stop(job, signal.SIGTERM)
                continue
            if status.state.finished:
                for pump in job.pumps:
                    pump.join(timeout=5)
                return status
            time.sleep(poll_interval)

    def cancel(self, ref: JobRef, signal_name: str | None = None, grace_seconds: float | None = None) -> None:
        job = self._jobs.get(ref.job_id)
        if job is None:
            return
        job.cancelled = True
        sig = getattr(signal, f"SIG{signal_name.upper().removeprefix('SIG')}") if signal_name else signal.SIGTERM
        self._stop(job, sig, GRACE_SECONDS if grace_seconds is None else grace_seconds)

    def _stop(self, job: _RunningJob, sig: int, grace: float = GRACE_SECONDS) -> None:
        for proc in job.processes:
            if proc.poll() is None:
                _killpg(proc.pid, sig)
        deadline = time.monotonic() + grace
        for proc in job.processes:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        directory = state_dir() / ref.uid
        for path in sorted(directory.glob("node-*.log")):
            yield from path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _shell_code(code: int) -> int:
    return 128 - code if code < 0 else code
