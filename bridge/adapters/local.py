"""The built-in ``local`` cluster: runs a plan on this machine, no scheduler needed.

Each "node" of the plan is a process group running the same ``hpcbridge launch`` bootstrap that compute
nodes run. MPI and Flux-style launchers need one group (mpirun starts every rank on localhost); torchrun
and plain commands get one group per node, like one container per pod.

The process that submits owns the job: it streams the output, stops the other groups when one fails,
enforces the time limit, and writes the result. Everything another process needs — ``status``,
``cancel``, ``logs -f``, ``list`` from another terminal — is in the job's state directory
(``$XDG_STATE_HOME/hpcbridge/local/<uid>``): ``job.json`` (process groups), ``node-N.log``, and, at
the end, ``result.json``. A cancel from elsewhere leaves a ``cancelled`` mark, then signals the groups.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bridge.adapters.base import (
    SIGNALS,
    Adapter,
    Artifact,
    ArtifactFile,
    Capabilities,
    Capacity,
    Identity,
    JobRef,
    JobState,
    JobStatus,
    NodeNeed,
)
from bridge.api.cluster import BridgeCluster
from bridge.api.loader import dump_yaml
from bridge.errors import BackendRejected, InvalidSpec
from bridge.mpi.bootstrap import LaunchSpec, launch_framework
from bridge.mpi.exits import shell_code
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
from bridge.records import state_root
from bridge.staging.phase import phase_status, read_phase

#: seconds a node group gets between the signal and SIGKILL when the job is stopped
GRACE_SECONDS = 10.0
#: variables of an enclosing scheduler or MPI job that would mislead the local job's launchers
# (an MPI rank's identity, a Slurm step's, Flux's task): tuning variables such as OMPI_MCA_btl_* stay
_LEAKED_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE",
                    "OMPI_MCA_ess", "OMPI_MCA_orte_ess", "OMPI_MCA_pmix", "OMPI_FILE_LOCATION", "OMPI_APP_CTX",
                    "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "HYDRA_", "MPIR_", "FLUX_JOB_", "FLUX_TASK_")


def machine_gpus(cluster_gpus: Sequence[str] | None, env: Mapping[str, str],
                 run: Callable[[list[str]], str | None] | None = None,
                 proc_dir: str = "/proc/driver/nvidia/gpus") -> tuple[list[str], str]:
    """The GPUs this machine lends the local cluster's nodes, and where that came from: the cluster entry's
    ``gpus``, else an inherited CUDA_VISIBLE_DEVICES (a job inside an allocation lends only what it was given),
    else ``nvidia-smi -L``, else /proc/driver/nvidia/gpus; none when none of them says any."""
    if cluster_gpus is not None:
        return list(cluster_gpus), "the cluster's gpus"
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()], "CUDA_VISIBLE_DEVICES"
    listing = (run or _nvidia_smi)(["nvidia-smi", "-L"])
    if listing is not None:
        found = [line.split(":", 1)[0].split()[1] for line in listing.splitlines() if line.startswith("GPU ")]
        return found, "nvidia-smi -L"
    try:
        return [str(index) for index in range(len(os.listdir(proc_dir)))], proc_dir
    except OSError:
        return [], "no NVIDIA GPU found (nvidia-smi, /proc/driver/nvidia)"


def _nvidia_smi(argv: list[str]) -> str | None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def gpu_slices(plan: LaunchPlan, gpus: Sequence[str], source: str) -> list[str] | None:
    """Each emulated node's own GPUs, as Slurm's gres gives a node its devices: node i the i-th slice of
    *gpus* (None: the plan asks for none, and when the machine has GPUs its nodes see none). A plan that needs
    more than the machine has is refused before anything starts."""
    per_node = plan.resources.gpus
    if not per_node:
        return None
    needed = plan.nodes * per_node
    if needed > len(gpus):
        raise InvalidSpec("spec.trainer.resourcesPerNode", f"{plan.nodes} nodes x {per_node} GPUs",
                          f"needs {needed} GPUs; this machine has {len(gpus)} ({source})")
    return [",".join(gpus[node * per_node:(node + 1) * per_node]) for node in range(plan.nodes)]


def free_port(preferred: int, taken: Collection[int] = ()) -> int:
    """*preferred* if a listener could bind it on every address now (as the coordinator will, without
    SO_REUSEADDR) and no other local job has claimed it, else a port the kernel picks."""
    for port in (preferred, *([0] * 8)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
            found: int = probe.getsockname()[1]
        if found not in taken:
            return found
    raise BackendRejected("local", "no free TCP port for the job's coordinator")


@contextmanager
def _claiming_ports() -> Iterator[set[int]]:
    """The coordinator ports other running local jobs have claimed, while no other submit may claim one: a
    port is free until its coordinator binds it, seconds after it is chosen, so two jobs starting together
    would otherwise both take it."""
    root = state_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".ports.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            taken = set()
            for path in root.glob("*/job.json"):
                record = _read_json(path)
                if record and record.get("port") and not (path.parent / "result.json").exists() \
                        and _alive(int(record.get("owner", 0)) or -1, group=False):
                    taken.add(int(record["port"]))
            yield taken
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
        env = tuple((entry.name, entry.value or "") for entry in plan.env)
        processes.append(LocalProcess(node, (*plan.launch_command, *spec.to_args()), env))
    return processes


def render_layout(plan: LaunchPlan) -> str:
    document: dict[str, Any] = {
        "cluster": plan.cluster,
        "trainJob": {"namespace": plan.namespace, "name": plan.name, "uid": plan.uid},
        "workdir": plan.workdir or ".",
        "timeLimitSeconds": plan.time_limit_seconds,
        "processGroups": [{"node": p.node, "argv": list(p.argv), "env": dict(p.env)} for p in layout(plan)],
    }
    if gang_note(plan):
        document["gang"] = gang_note(plan)
    if plan.staging:
        # run first, alone: the groups start only when it succeeded
        document["stage"] = {"argv": list(stage_argv(plan)),
                             **({"stdin": stage_input(plan)} if stage_input(plan) is not None else {})}
    return dump_yaml([document])


def state_dir() -> Path:
    return state_root() / "local"


def _job_dir(uid: str) -> Path:
    if not uid or "/" in uid or uid in (".", ".."):
        raise BackendRejected("local", f"not a local job id: {uid!r}")
    return state_dir() / uid


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] | None = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    tmp.replace(path)  # readers see the old file or the new one, never half of one


def _alive(number: int, group: bool = True) -> bool:
    """Whether a process group (or with ``group=False`` a process) still exists: signal 0 probes it."""
    try:
        (os.killpg if group else os.kill)(number, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, and belongs to someone else
    return True


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class _OwnedJob:
    """A job this process started: its Popen objects and output pumps."""

    ref: JobRef
    directory: Path
    processes: list[subprocess.Popen[bytes]]
    deadline: float | None
    pumps: list[threading.Thread] = field(default_factory=list)
    #: exit code of the node that failed first; the others were stopped because of it
    first_failure: int | None = None
    timed_out: bool = False
    #: the coordinator port this job claimed (job.json says so to other submits)
    port: int | None = None
    result: JobStatus | None = None


class LocalAdapter(Adapter):
    backend = "local"
    # names are uids here: a rerun replaces the finished run's state directory
    capabilities = Capabilities(unique_names=True)
    options = ()

    def __init__(self, cluster: BridgeCluster, output: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(cluster)
        self._owned: dict[str, _OwnedJob] = {}
        self._output = output or (lambda line: (sys.stdout.write(line), sys.stdout.flush()))
        self._clock = clock

    def render(self, plan: LaunchPlan) -> Artifact:
        return Artifact("local", "process-layout", plan,
                        (ArtifactFile(f"{plan.name}.local.yaml", render_layout(plan), "application/yaml"),))

    # --- submit --------------------------------------------------------------------------------------

    def submit(self, artifact: Artifact) -> JobRef:
        plan = artifact.plan
        workdir = plan.workdir or os.getcwd()
        if not os.path.isdir(workdir):
            raise BackendRejected("local", f"workdir {workdir!r} does not exist")
        gpus, source = machine_gpus(self.cluster.spec.gpus, os.environ)
        slices = gpu_slices(plan, gpus, source)  # refused here: nothing of an earlier run is touched yet
        ref = JobRef(self.cluster.name, "local", plan.uid, plan.uid, plan.name)
        directory = _job_dir(plan.uid)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, mode=0o700)
        layout(plan)  # refused here, before anything starts, if the plan cannot run locally
        # The children run with this hpc-bridge's Python first on PATH, so `python3`, `torchrun` and
        # `mpirun`-launched ranks find the packages installed next to it. Variables of an enclosing Slurm
        # or MPI job are dropped: the local job is not part of that allocation.
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKED_PREFIXES)}
        base_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base_env.get("PATH", "")
        base_env.setdefault("HOME", os.path.expanduser("~"))
        base_env.setdefault("USER", getpass.getuser())
        deadline = self._clock() + plan.time_limit_seconds if plan.time_limit_seconds else None
        job = _OwnedJob(ref, directory, [], deadline)
        self._owned[ref.job_id] = job
        if plan.staging and not self._stage(plan, job, workdir, base_env):
            return ref  # it failed, timed out or was cancelled: the result is written, no node started
        # every node of every local job shares this machine: the coordinator's port is the plan's when it is
        # free, else one that is (another job holds it, or its last connections still linger in TIME_WAIT);
        # chosen after staging, which may take long while other jobs start, and claimed in job.json
        with _claiming_ports() as taken:
            job.port = free_port(plan.rdzv_port, taken)
            self._record(plan, job, [p.pid for p in job.processes])
        groups = layout(replace(plan, rdzv_port=job.port))
        prefix = len(groups) > 1
        for group in groups:
            env = {**base_env, **dict(group.env), **dict(job_environment(plan)), **script_env(plan),
                   "HPCBRIDGE_NODE_RANK": str(group.node)}
            if slices is not None:
                # one group for the whole job (MPI, a batch script) holds every node's GPUs; a node's own
                # processes pick theirs by local rank, as under Slurm
                mine = slices[group.node] if len(groups) == len(slices) else ",".join(slices)
                env.update({"CUDA_VISIBLE_DEVICES": mine, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
            elif gpus:
                env["CUDA_VISIBLE_DEVICES"] = ""  # asked for none: sees none
            try:
                proc = subprocess.Popen(list(group.argv), cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                self._signal_all(job, signal.SIGKILL)
                raise BackendRejected("local", f"cannot start {group.argv[0]!r}: {exc.strerror}") from None
            job.processes.append(proc)
            pump = threading.Thread(target=self._pump, args=(proc, directory / f"node-{group.node}.log",
                                                             f"[node-{group.node}] " if prefix else ""), daemon=True)
            pump.start()
            job.pumps.append(pump)
        self._record(plan, job, [p.pid for p in job.processes])
        return ref

    def _record(self, plan: LaunchPlan, job: _OwnedJob, groups: list[int]) -> None:
        _write_json(job.directory / "job.json", {
            "jobId": job.ref.job_id, "uid": plan.uid, "name": plan.name, "namespace": plan.namespace,
            "owner": os.getpid(), "groups": groups, "started": time.time(),
            "timeLimitSeconds": plan.time_limit_seconds, "port": job.port,
            **({"stagingDir": plan.staging.dir} if plan.staging else {})})

    def _stage(self, plan: LaunchPlan, job: _OwnedJob, workdir: str, base_env: dict[str, str]) -> bool:
        """The stage step, before any node starts (as on Slurm and Flux, where it runs first in the batch
        script). Its pid is the job's only group meanwhile, so a cancel from elsewhere stops it. False: the
        job ended here, its result written."""
        env = {**base_env, **dict(job_environment(plan))}
        argv = list(stage_argv(plan))
        given = stage_input(plan)  # the initializers' env, on stdin: never on the command line
        try:
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL if given is None else subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise BackendRejected("local", f"cannot start {argv[0]!r}: {exc.strerror}") from None
        if given is not None and proc.stdin is not None:
            try:
                with proc.stdin:
                    proc.stdin.write(given.encode())
            except BrokenPipeError:
                pass  # it ended before reading: its exit code says why
        self._record(plan, job, [proc.pid])
        pump = threading.Thread(target=self._pump, args=(proc, job.directory / "stage.log", ""), daemon=True)
        pump.start()
        job.processes.append(proc)
        try:
            while proc.poll() is None:
                if job.deadline is not None and self._clock() >= job.deadline:
                    job.timed_out = True
                    self._stop(job, signal.SIGTERM, GRACE_SECONDS)
                    break
                time.sleep(0.05)
        finally:
            pump.join(timeout=5)
            job.processes.clear()
        code = proc.wait()
        if code == 0:
            return True
        if (job.directory / "cancelled").exists():
            status = JobStatus(job.ref, JobState.CANCELLED, exit_code=shell_code(code), reason="Cancelled")
        elif job.timed_out:
            status = JobStatus(job.ref, JobState.TIMEOUT, reason="DeadlineExceeded",
                               message="activeDeadlineSeconds passed while the initializers ran")
        else:
            assert plan.staging is not None  # the only plans _stage is called for
            reason, message = phase_status(read_phase(plan.staging.dir, plan.uid, plan.staging.tenant)) or (
                "InitializerFailed", f"the stage step exited with code {shell_code(code)}")
            status = JobStatus(job.ref, JobState.FAILED, exit_code=shell_code(code), reason=reason, message=message)
        self._finish(job, status)
        return False

    def _pump(self, proc: subprocess.Popen[bytes], log_path: Path, prefix: str) -> None:
        assert proc.stdout is not None
        with open(log_path, "wb") as log:
            for raw in iter(proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                self._output(prefix + raw.decode("utf-8", errors="replace"))

    # --- state ---------------------------------------------------------------------------------------

    def _owned_status(self, job: _OwnedJob) -> JobStatus:
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

    def _record_status(self, ref: JobRef) -> JobStatus:
        """A job's state from its directory: for jobs another process started."""
        try:
            directory = _job_dir(ref.job_id)
        except BackendRejected:
            return JobStatus(ref, JobState.UNKNOWN, reason="NoRecord")
        record = _read_json(directory / "job.json")
        if record is None:
            return JobStatus(ref, JobState.UNKNOWN, reason="NoRecord", message="no local job with this id")
        ref = JobRef(ref.cluster, ref.backend, ref.job_id, record.get("uid", ref.uid), record.get("name", ref.name))
        result = _read_json(directory / "result.json")
        if result is not None:
            return JobStatus(ref, JobState(result["state"]), exit_code=result.get("exitCode"),
                             reason=result.get("reason"), message=result.get("message"))
        owner = int(record.get("owner", 0)) or -1
        if any(_alive(pgid) for pgid in record.get("groups", [])) or _alive(owner, group=False):
            staging = phase_status(read_phase(record["stagingDir"], record.get("uid", ref.uid))) \
                if record.get("stagingDir") else None
            return JobStatus(ref, JobState.RUNNING, nodes=(socket.gethostname(),),
                             reason=staging[0] if staging else None, message=staging[1] if staging else None)
        # the owning process died before it could write the result: nobody knows the exit code
        if (directory / "cancelled").exists():
            return JobStatus(ref, JobState.CANCELLED, reason="Cancelled")
        return JobStatus(ref, JobState.FAILED, reason="Lost",
                         message="the submitting process ended before the job did; its exit code is unknown")

    def _status(self, ref: JobRef) -> JobStatus:
        job = self._owned.get(ref.job_id)
        if job is None:
            return self._record_status(ref)
        status = self._owned_status(job)
        if status.state == JobState.FAILED and any(proc.poll() is None for proc in job.processes):
            # one node failed: the others end with it, as in wait(), before the job is called finished
            self._stop(job, signal.SIGTERM, GRACE_SECONDS)
            status = self._owned_status(job)
        if status.state.finished:
            self._finish(job, status)  # other processes read the end from result.json
        return status

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        return {ref: self._status(ref) for ref in refs}

    def find(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        found = {}
        for identity in identities:
            status = self._status(self.ref(identity.uid, identity))
            if status.state != JobState.UNKNOWN:
                found[identity.uid] = status
        return found

    def list_jobs(self) -> list[JobStatus]:
        root = state_dir()
        # the name comes back from each job.json as its status is read: one read per job
        refs = [JobRef(self.cluster.name, "local", path.parent.name, path.parent.name, "")
                for path in sorted(root.glob("*/job.json"))] if root.is_dir() else []
        return list(self.poll(refs).values())

    def ref(self, job_id: str, identity: Identity | None = None) -> JobRef:
        name = identity.name if identity else ""
        if not name:
            record = _read_json(state_dir() / job_id / "job.json") if job_id and "/" not in job_id else None
            name = (record or {}).get("name", "")
        return JobRef(self.cluster.name, "local", job_id, job_id, name)

    def wait(self, ref: JobRef, timeout: float | None = None, poll_interval: float = 0.05) -> JobStatus:
        """Block until the job ends. The owning process also stops the other groups when one fails,
        stops every group at the time limit, and writes the result for other processes."""
        give_up = None if timeout is None else self._clock() + timeout
        while True:
            job = self._owned.get(ref.job_id)
            if job is None:
                status = self._record_status(ref)
                if status.state.finished or (give_up is not None and self._clock() >= give_up):
                    return status
                time.sleep(max(poll_interval, 0.2))
                continue
            if job.deadline is not None and not job.timed_out and self._clock() >= job.deadline:
                job.timed_out = True
                self._stop(job, signal.SIGTERM, GRACE_SECONDS)
            status = self._owned_status(job)
            if status.state == JobState.FAILED and any(p.poll() is None for p in job.processes):
                self._stop(job, signal.SIGTERM, GRACE_SECONDS)
                continue
            if status.state.finished:
                for pump in job.pumps:
                    pump.join(timeout=5)
                self._finish(job, status)
                return status
            if give_up is not None and self._clock() >= give_up:
                return status
            time.sleep(poll_interval)

    def _finish(self, job: _OwnedJob, status: JobStatus) -> None:
        if job.result is None:
            job.result = status
            _write_json(job.directory / "result.json", {"state": status.state.value, "exitCode": status.exit_code,
                                                        "reason": status.reason, "message": status.message})

    # --- stop ----------------------------------------------------------------------------------------

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        """Works from any process: marks the job cancelled, signals its groups, SIGKILLs them after the grace."""
        try:
            directory = _job_dir(ref.job_id)
        except BackendRejected:
            return
        record = _read_json(directory / "job.json")
        if record is None or (directory / "result.json").exists():
            return  # unknown or already finished: nothing to stop
        (directory / "cancelled").touch()
        sig = SIGNALS[signal] if signal else SIGNALS["TERM"]
        grace = GRACE_SECONDS if grace_seconds is None else grace_seconds
        job = self._owned.get(ref.job_id)
        if job is not None:
            self._stop(job, sig, grace)
            return
        groups = [int(pgid) for pgid in record.get("groups", [])]
        for pgid in groups:
            _killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(pgid) for pgid in groups):
            time.sleep(0.05)
        for pgid in groups:
            _killpg(pgid, SIGNALS["KILL"])

    def _stop(self, job: _OwnedJob, sig: int, grace: float) -> None:
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
    def _signal_all(job: _OwnedJob, sig: int) -> None:
        for proc in job.processes:
            _killpg(proc.pid, sig)

    def remove(self, ref: JobRef) -> None:
        try:
            shutil.rmtree(_job_dir(ref.job_id), ignore_errors=True)
        except BackendRejected:
            pass

    # --- output --------------------------------------------------------------------------------------

    def logs(self, ref: JobRef, follow: bool = False, poll_interval: float = 0.2) -> Iterator[str]:
        """Every node's log; with *follow*, new lines as they come until the job ends."""
        directory = _job_dir(ref.job_id)
        if not (directory / "job.json").exists():
            raise BackendRejected("local", f"no local job {ref.job_id!r} (looked in {directory})")
        offsets: dict[Path, int] = {}
        while True:
            finished = self._status(ref).state.finished
            for path in [*directory.glob("stage.log"), *sorted(directory.glob("node-*.log"))]:
                with open(path, "rb") as handle:
                    handle.seek(offsets.get(path, 0))
                    data = handle.read()
                if not finished and not data.endswith(b"\n"):
                    data = data[:data.rfind(b"\n") + 1]  # a line still being written waits for its end
                if data:
                    offsets[path] = offsets.get(path, 0) + len(data)
                    yield data.decode("utf-8", errors="replace")
            if not follow or finished:
                return
            time.sleep(poll_interval)

    def capacity(self, plan: LaunchPlan) -> Capacity:
        """This machine's CPUs in node-sized shares: its emulated nodes share them (GPUs are not counted here
        yet, so a plan that asks for GPUs fits none)."""
        need = NodeNeed.of(plan)
        cpus = os.cpu_count() or 1
        shares = 0 if need.gpus else cpus // need.cpus
        return Capacity(shares, shares, f"this machine: {cpus} CPUs, {shares} node-sized shares for {need.text()}")

    def check(self) -> str:
        return f"this machine ({socket.gethostname()}, {os.cpu_count()} CPUs)"
