"""The supervisor of the local jobs this process started: their process groups, output and end.

The process that submits owns the job: it starts exactly the rendered layout, streams the groups' output
to this terminal (stdout to stdout, stderr to stderr, each line whole) and to the job's logs, stops the other
groups when one fails, enforces the time limit, and writes the result into the job's record (``records``) for
every other process.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bridge.adapters.base import JobRef, JobState, JobStatus, poll_until_finished
from bridge.adapters.local.layout import LocalProcess, ProcessLayout, StageStep
from bridge.adapters.local.machine import free_port
from bridge.adapters.local.records import claiming_ports, job_dir, killpg, write_json
from bridge.envnames import TAG_OUTPUT_ENV
from bridge.errors import BackendRejected
from bridge.mpi.exits import shell_code
from bridge.staging.phase import phase_status, read_phase

#: seconds a node group gets between the signal and SIGKILL when the job is stopped
GRACE_SECONDS = 10.0
#: variables of an enclosing scheduler or MPI job that would mislead the local job's launchers
# (an MPI rank's identity, a Slurm step's, Flux's task): tuning variables such as OMPI_MCA_btl_* stay
_LEAKED_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE",
                    "OMPI_MCA_ess", "OMPI_MCA_orte_ess", "OMPI_MCA_pmix", "OMPI_FILE_LOCATION", "OMPI_APP_CTX",
                    "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "HYDRA_", "MPIR_", "FLUX_JOB_", "FLUX_TASK_")


def inherited_environment() -> dict[str, str]:
    """What a local job's processes inherit from this one. They run with this hpc-bridge's Python first on
    PATH, so `python3`, `torchrun` and `mpirun`-launched ranks find the packages installed next to it.
    Variables of an enclosing Slurm or MPI job are dropped: the local job is not part of that allocation."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKED_PREFIXES)}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("HOME", os.path.expanduser("~"))
    env.setdefault("USER", getpass.getuser())
    return env


def gpu_environment(process: LocalProcess, slices: list[str] | None, machine_has_gpus: bool) -> dict[str, str]:
    """The GPUs a group sees: its nodes' slices (a group for the whole job holds every node's, and a node's
    processes pick theirs by local rank, as under Slurm); none when the job asked for none."""
    if slices is not None:
        mine = ",".join(slices[node] for node in process.gpu_nodes)
        return {"CUDA_VISIBLE_DEVICES": mine, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return {"CUDA_VISIBLE_DEVICES": ""} if machine_has_gpus else {}


def _to_stderr(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()


class OutputPump:
    """Copies a process's stdout to *output* and its stderr to *errors*, in a thread each, every line whole
    and into the log at *log_path* too; a last line without its newline gets one, so it is never glued to
    the next line written."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, output: Callable[[str], None],
                 errors: Callable[[str], None]) -> None:
        self._log = open(log_path, "wb")  # the last of the two threads closes it
        self._lock = threading.Lock()
        self._open = 2
        assert proc.stdout is not None and proc.stderr is not None  # started with both piped
        self.threads = [threading.Thread(target=self._copy, args=(stream, write), daemon=True)
                        for stream, write in ((proc.stdout, output), (proc.stderr, errors))]
        for thread in self.threads:
            thread.start()

    def _copy(self, stream: IO[bytes], write: Callable[[str], None]) -> None:
        try:
            for raw in iter(stream.readline, b""):
                line = raw if raw.endswith(b"\n") else raw + b"\n"
                with self._lock:
                    self._log.write(line)
                    self._log.flush()
                write(line.decode("utf-8", errors="replace"))
        finally:
            with self._lock:
                self._open -= 1
                if not self._open:
                    self._log.close()

    def join(self, timeout: float | None = None) -> None:
        for thread in self.threads:
            thread.join(timeout)


@dataclass
class OwnedJob:
    """A job this process started: its Popen objects and output pumps."""

    ref: JobRef
    layout: ProcessLayout
    directory: Path
    deadline: float | None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pumps: list[OutputPump] = field(default_factory=list)
    #: exit code of the node that failed first; the others were stopped because of it
    first_failure: int | None = None
    timed_out: bool = False
    #: the coordinator port this job claimed (job.json says so to other submits)
    port: int | None = None
    result: JobStatus | None = None


class Supervisor:
    """The jobs this process owns, by job id. Their stdout lines go to *output*, their stderr lines to
    *errors* (default this process's stderr), one whole line a call, never two calls at once."""

    def __init__(self, output: Callable[[str], None], clock: Callable[[], float],
                 errors: Callable[[str], None] | None = None) -> None:
        self.jobs: dict[str, OwnedJob] = {}
        self.clock = clock
        self._lock = threading.Lock()
        self._output = output
        self._errors = errors or _to_stderr

    def output(self, line: str) -> None:
        with self._lock:
            self._output(line)

    def errors(self, line: str) -> None:
        with self._lock:
            self._errors(line)

    # --- start ---------------------------------------------------------------------------------------

    def start(self, ref: JobRef, layout: ProcessLayout, slices: list[str] | None, machine_has_gpus: bool) -> None:
        """Start *layout*: its stage step first, alone, then every group, on a coordinator port no other
        local job holds (the plan's when it is free; chosen after staging, which may take long while other
        jobs start, and claimed in job.json)."""
        directory = job_dir(ref.job_id)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, mode=0o700)
        inherited = inherited_environment()
        deadline = self.clock() + layout.time_limit_seconds if layout.time_limit_seconds else None
        job = OwnedJob(ref, layout, directory, deadline)
        self.jobs[ref.job_id] = job
        if layout.stage is not None and not self._stage(job, layout.stage, inherited):
            return  # it failed, timed out or was cancelled: the result is written, no node started
        with claiming_ports() as taken:
            job.port = free_port(layout.port, taken)
            self._record(job, [])
        bound = layout.on_port(job.port)
        # each node's launch tags its lines with the node and rank that wrote them (for jobs with several)
        inherited[TAG_OUTPUT_ENV] = "1"
        for process in bound.processes:
            env = {**inherited, **process.environment(), **gpu_environment(process, slices, machine_has_gpus)}
            self._start_group(job, process, env)
        self._record(job, [p.pid for p in job.processes])

    def _start_group(self, job: OwnedJob, process: LocalProcess, env: dict[str, str]) -> None:
        try:
            proc = subprocess.Popen(list(process.argv), cwd=job.layout.workdir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self._signal_all(job, signal.SIGKILL)
            raise BackendRejected("local", f"cannot start {process.argv[0]!r}: {exc.strerror}") from None
        job.processes.append(proc)
        log = job.directory / f"node-{process.node}.log"
        job.pumps.append(OutputPump(proc, log, self.output, self.errors))

    def _record(self, job: OwnedJob, groups: list[int]) -> None:
        layout = job.layout
        write_json(job.directory / "job.json", {
            "jobId": job.ref.job_id, "uid": layout.uid, "name": layout.name, "namespace": layout.namespace,
            "owner": os.getpid(), "groups": groups, "started": time.time(),
            "timeLimitSeconds": layout.time_limit_seconds, "port": job.port,
            **({"stagingDir": layout.stage.staging_dir} if layout.stage is not None else {})})

    def _stage(self, job: OwnedJob, stage: StageStep, inherited: dict[str, str]) -> bool:
        """The stage step, before any node starts (as on Slurm and Flux, where it runs first in the batch
        script). Its pid is the job's only group meanwhile, so a cancel from elsewhere stops it. False: the
        job ended here, its result written."""
        proc = self._start_stage(job, stage, inherited)
        self._record(job, [proc.pid])
        pump = OutputPump(proc, job.directory / "stage.log", self.output, self.errors)
        job.processes.append(proc)
        try:
            while proc.poll() is None:
                if job.deadline is not None and self.clock() >= job.deadline:
                    job.timed_out = True
                    self.stop(job, signal.SIGTERM, GRACE_SECONDS)
                    break
                time.sleep(0.05)
        finally:
            pump.join(timeout=5)
            job.processes.clear()
        code = proc.wait()
        if code == 0:
            return True
        self.finish(job, self._stage_verdict(job, stage, code))
        return False

    @staticmethod
    def _start_stage(job: OwnedJob, stage: StageStep, inherited: dict[str, str]) -> subprocess.Popen[bytes]:
        try:
            proc = subprocess.Popen(list(stage.argv), cwd=job.layout.workdir, env={**inherited, **dict(stage.env)},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL if stage.stdin is None else subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise BackendRejected("local", f"cannot start {stage.argv[0]!r}: {exc.strerror}") from None
        if stage.stdin is not None and proc.stdin is not None:
            try:
                with proc.stdin:
                    proc.stdin.write(stage.stdin.encode())
            except BrokenPipeError:
                pass  # it ended before reading: its exit code says why
        return proc

    @staticmethod
    def _stage_verdict(job: OwnedJob, stage: StageStep, code: int) -> JobStatus:
        if (job.directory / "cancelled").exists():
            return JobStatus(job.ref, JobState.CANCELLED, exit_code=shell_code(code), reason="Cancelled")
        if job.timed_out:
            return JobStatus(job.ref, JobState.TIMEOUT, reason="DeadlineExceeded",
                             message="activeDeadlineSeconds passed while the initializers ran")
        reason, message = phase_status(read_phase(stage.staging_dir, job.layout.uid, stage.tenant)) or (
            "InitializerFailed", f"the stage step exited with code {shell_code(code)}")
        return JobStatus(job.ref, JobState.FAILED, exit_code=shell_code(code), reason=reason, message=message)

    # --- state ---------------------------------------------------------------------------------------

    def _groups_status(self, job: OwnedJob) -> JobStatus:
        if job.result is not None:
            return job.result
        codes = [proc.poll() for proc in job.processes]
        failed = [code for code in codes if code not in (None, 0)]
        cancelled = (job.directory / "cancelled").exists()
        if failed and job.first_failure is None and not cancelled and not job.timed_out:
            job.first_failure = failed[0]
        if all(code is not None for code in codes):
            if cancelled:
                code = shell_code(failed[0]) if failed else 0
                return JobStatus(job.ref, JobState.CANCELLED, exit_code=code, reason="Cancelled")
            if job.timed_out:
                return JobStatus(job.ref, JobState.TIMEOUT, exit_code=shell_code(failed[0]) if failed else None,
                                 reason="DeadlineExceeded", message="activeDeadlineSeconds passed")
        if job.first_failure is not None:
            code = shell_code(job.first_failure)
            return JobStatus(job.ref, JobState.FAILED, exit_code=code, reason="NonZeroExit",
                             message=f"a node exited with code {code}")
        if all(code == 0 for code in codes):
            return JobStatus(job.ref, JobState.SUCCEEDED, exit_code=0)
        return JobStatus(job.ref, JobState.RUNNING, nodes=(socket.gethostname(),))

    def _settled(self, job: OwnedJob) -> JobStatus:
        """The job's state; when one node failed, the others end with it before the job is called failed."""
        status = self._groups_status(job)
        if status.state == JobState.FAILED and any(proc.poll() is None for proc in job.processes):
            self.stop(job, signal.SIGTERM, GRACE_SECONDS)
            status = self._groups_status(job)
        return status

    def status(self, job: OwnedJob) -> JobStatus:
        status = self._settled(job)
        if status.state.finished:
            self.finish(job, status)  # other processes read the end from result.json
        return status

    def supervise(self, job: OwnedJob) -> JobStatus:
        """One look at the job as its owner: the time limit enforced, a failed node's peers stopped, and at
        the end its output copied and the result written."""
        if job.deadline is not None and not job.timed_out and self.clock() >= job.deadline:
            job.timed_out = True
            self.stop(job, signal.SIGTERM, GRACE_SECONDS)
        status = self._settled(job)
        if status.state.finished:
            for pump in job.pumps:
                pump.join(timeout=5)
            self.finish(job, status)
        return status

    def wait(self, job: OwnedJob, timeout: float | None = None, poll_interval: float = 0.05) -> JobStatus:
        """Block until the job ends (or *timeout* passes), supervising it meanwhile."""
        return poll_until_finished(lambda: self.supervise(job), interval=poll_interval, timeout=timeout,
                                   clock=self.clock)

    def finish(self, job: OwnedJob, status: JobStatus) -> None:
        if job.result is None:
            job.result = status
            write_json(job.directory / "result.json", {"state": status.state.value, "exitCode": status.exit_code,
                                                       "reason": status.reason, "message": status.message})

    # --- stop ----------------------------------------------------------------------------------------

    def stop(self, job: OwnedJob, sig: int, grace: float) -> None:
        self._signal_all(job, sig)
        deadline = time.monotonic() + grace
        for proc in job.processes:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # whatever is left of each group (children that ignored the signal) goes now
        self._signal_all(job, signal.SIGKILL)
        for proc in job.processes:
            proc.wait()

    @staticmethod
    def _signal_all(job: OwnedJob, sig: int) -> None:
        for proc in job.processes:
            killpg(proc.pid, sig)
