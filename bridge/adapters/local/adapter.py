"""The built-in ``local`` cluster's adapter: runs a plan on this machine, no scheduler needed.

``render`` gives the process layout (``layout``): each "node" of the plan is a process group running the
same ``hpcbridge launch`` bootstrap that compute nodes run. ``submit`` starts exactly that layout through
the supervisor (``supervisor``), which this process stays to run: the job is in the foreground
(``Capabilities.foreground``). Every other call works from any process through the job's record
(``records``): ``status``, ``cancel``, ``logs -f`` and ``list`` from another terminal.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bridge.adapters.base import (
    SIGNALS,
    Adapter,
    Amounts,
    Artifact,
    ArtifactFile,
    Capabilities,
    Capacity,
    ClusterSize,
    Identity,
    JobRef,
    JobState,
    JobStatus,
    NodeNeed,
    poll_until_finished,
)
from bridge.adapters.local.layout import LocalArtifact, layout_text, process_layout
from bridge.adapters.local.machine import gpu_slices, machine_gpus
from bridge.adapters.local.records import alive, job_dir, killpg, read_json, recorded_status, state_dir
from bridge.adapters.local.supervisor import GRACE_SECONDS, Supervisor
from bridge.annotations import WORKDIR_ANNOTATION
from bridge.api.cluster import BridgeCluster
from bridge.errors import BackendRejected, InvalidSpec
from bridge.plan import LaunchPlan


def _to_stdout(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


class LocalAdapter(Adapter):
    backend = "local"
    # names are uids here: a rerun replaces the finished run's state directory; the job runs in the process
    # that submits it, which waits for it
    capabilities = Capabilities(unique_names=True, named_by_uid=True, foreground=True)
    options = ()

    def __init__(self, cluster: BridgeCluster, output: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(cluster)
        self._supervisor = Supervisor(output or _to_stdout, clock)
        self._machine_gpus: tuple[list[str], str] | None = None

    def render(self, plan: LaunchPlan) -> LocalArtifact:
        layout = process_layout(plan)
        return LocalArtifact("local", "process-layout", plan,
                             (ArtifactFile(f"{plan.name}.local.yaml", layout_text(layout), "application/yaml"),),
                             layout=layout)

    def submit(self, artifact: Artifact) -> JobRef:
        """Start the rendered layout, on this machine's GPUs (a share each node's) and a free port."""
        if not isinstance(artifact, LocalArtifact):
            raise BackendRejected("local", f"not a local process layout: {artifact.kind}")
        layout = artifact.layout
        # the checks admit ran while preparing, again for a caller that did not prepare (the conformance
        # suite): refused here, nothing of an earlier run is touched yet
        slices = self._machine_share(layout.workdir, layout.nodes, layout.gpus_per_node)
        ref = JobRef(self.cluster.name, "local", layout.uid, layout.uid, layout.name)
        self._supervisor.start(ref, layout, slices, bool(self._gpus()[0]))
        return ref

    def admit(self, plan: LaunchPlan) -> None:
        """What this machine refuses before anything starts: a working directory it does not have, more GPUs
        than it lends (CPUs are shared: the emulated nodes take turns on them, as many as the plan asks)."""
        self._machine_share(plan.workdir or ".", plan.nodes, plan.resources.gpus or 0)

    def _machine_share(self, workdir: str, nodes: int, gpus_per_node: int) -> list[str] | None:
        """Each node's GPUs (``gpu_slices``) where this machine can start the job at all, else InvalidSpec."""
        if not os.path.isdir(workdir):
            raise InvalidSpec(f"metadata.annotations[{WORKDIR_ANNOTATION}]", workdir,
                              "no such directory on this machine, where the local cluster runs the job")
        gpus, source = self._gpus()
        return gpu_slices(nodes, gpus_per_node, gpus, source)

    def _gpus(self) -> tuple[list[str], str]:
        """This machine's GPUs, looked for once per adapter: preparing and submitting see the same ones."""
        if self._machine_gpus is None:
            self._machine_gpus = machine_gpus(self.cluster.spec.gpus, os.environ)
        return self._machine_gpus

    # --- state ---------------------------------------------------------------------------------------

    def _status(self, ref: JobRef) -> JobStatus:
        job = self._supervisor.jobs.get(ref.job_id)
        return recorded_status(ref) if job is None else self._supervisor.status(job)

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
            record = read_json(state_dir() / job_id / "job.json") if job_id and "/" not in job_id else None
            name = (record or {}).get("name", "")
        return JobRef(self.cluster.name, "local", job_id, job_id, name)

    def wait(self, ref: JobRef, timeout: float | None = None, poll_interval: float = 0.05) -> JobStatus:
        """Block until the job ends. The owning process supervises it meanwhile (``Supervisor.wait``);
        another reads its record."""
        job = self._supervisor.jobs.get(ref.job_id)
        if job is not None:
            return self._supervisor.wait(job, timeout, poll_interval)
        return poll_until_finished(lambda: recorded_status(ref), interval=max(poll_interval, 0.2), timeout=timeout,
                                   clock=self._supervisor.clock)

    # --- stop ----------------------------------------------------------------------------------------

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        """Works from any process: marks the job cancelled, signals its groups, SIGKILLs them after the grace."""
        try:
            directory = job_dir(ref.job_id)
        except BackendRejected:
            return
        record = read_json(directory / "job.json")
        if record is None or (directory / "result.json").exists():
            return  # unknown or already finished: nothing to stop
        (directory / "cancelled").touch()
        sig = SIGNALS[signal] if signal else SIGNALS["TERM"]
        grace = GRACE_SECONDS if grace_seconds is None else grace_seconds
        job = self._supervisor.jobs.get(ref.job_id)
        if job is not None:
            self._supervisor.stop(job, sig, grace)
            return
        groups = [int(pgid) for pgid in record.get("groups", [])]
        for pgid in groups:
            killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(pgid) for pgid in groups):
            time.sleep(0.05)
        for pgid in groups:
            killpg(pgid, SIGNALS["KILL"])

    def remove(self, ref: JobRef) -> None:
        try:
            shutil.rmtree(job_dir(ref.job_id), ignore_errors=True)
        except BackendRejected:
            pass

    # --- output --------------------------------------------------------------------------------------

    def logs(self, ref: JobRef, follow: bool = False, poll_interval: float = 0.2) -> Iterator[str]:
        """Every node's log; with *follow*, new lines as they come until the job ends."""
        directory = job_dir(ref.job_id)
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
        """What submit would start: every emulated node the plan asks for, sharing this machine's CPUs, when
        its GPUs go round (a node-sized share of them each); else, as ``limit``, why they never do."""
        need = NodeNeed.of(plan)
        gpus, source = self._gpus()
        cpus = os.cpu_count() or 1
        detail = f"this machine: {cpus} CPUs, {len(gpus)} GPUs, shared by emulated nodes of {need.text()}"
        try:
            gpu_slices(plan.nodes, need.gpus, gpus, source)
        except InvalidSpec as exc:
            return Capacity(0, 0, detail, limit=exc.problem)
        nodes = len(gpus) // need.gpus if need.gpus else max(plan.nodes, cpus // need.cpus)
        return Capacity(nodes, nodes, detail)

    def size(self) -> ClusterSize:
        """This machine: its CPUs, memory and GPUs, one node (the emulated nodes share it)."""
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        except (ValueError, OSError):
            memory = None
        amounts = Amounts(1, os.cpu_count(), memory, len(self._gpus()[0]))
        return ClusterSize(amounts, amounts, f"this machine ({socket.gethostname()}; GPUs: {self._gpus()[1]})")

    def check(self) -> str:
        return f"this machine ({socket.gethostname()}, {os.cpu_count()} CPUs)"
