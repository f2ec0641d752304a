"""In-memory stand-ins for what a unit test must not reach: a scheduler behind the adapter contract and a
transport that never runs a command. Integration tests drive real daemons (tests/harness) and use none of these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from bridge.adapters.base import (
    Adapter,
    Artifact,
    ArtifactFile,
    Capabilities,
    Capacity,
    Identity,
    JobRef,
    JobState,
    JobStatus,
)
from bridge.adapters.transport import CommandResult, Transport
from bridge.errors import BackendUnavailable


class FakeBackend(Adapter):
    """A scheduler in memory: jobs, a queue that forgets finished jobs, and scripted failures."""

    backend = "fake"
    capabilities = Capabilities()

    def __init__(self, cluster) -> None:
        super().__init__(cluster)
        self.jobs: dict[str, dict] = {}
        self.queue: set[str] = set()  # what find() still lists (Slurm's squeue before MinJobAge)
        self.sent = 0
        self.fail_next: list[Exception] = []
        self.lose_answer = False
        self.free_nodes = 8  # what capacity() reports free (of 8)

    def render(self, plan) -> Artifact:
        return Artifact("fake", "text", plan, (ArtifactFile("job", plan.name),))

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    def submit(self, artifact: Artifact) -> JobRef:
        self._maybe_fail()
        self.sent += 1
        job_id = str(100 + self.sent)
        self.jobs[job_id] = {"uid": artifact.plan.uid, "name": artifact.plan.name, "state": JobState.RUNNING}
        self.queue.add(job_id)
        if self.lose_answer:
            self.lose_answer = False
            raise BackendUnavailable("fake", "connection reset after the job was accepted")
        return JobRef(self.cluster.name, "fake", job_id, artifact.plan.uid, artifact.plan.name)

    def _status(self, job_id: str, ref: JobRef) -> JobStatus:
        job = self.jobs.get(job_id)
        if job is None:
            return JobStatus(ref, JobState.UNKNOWN, reason="NoRecord")
        return JobStatus(ref, job["state"], exit_code=0 if job["state"] == JobState.SUCCEEDED else None)

    def find(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        self._maybe_fail()
        wanted = {i.uid for i in identities}
        found = {}
        for job_id in sorted(self.queue, key=int):
            job = self.jobs[job_id]
            if job["uid"] in wanted:
                found[job["uid"]] = self._status(job_id, JobRef(self.cluster.name, "fake", job_id, job["uid"],
                                                                job["name"]))
        return found

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        self._maybe_fail()
        return {ref: self._status(ref.job_id, ref) for ref in refs}

    def wait(self, ref: JobRef, timeout: float | None = None) -> JobStatus:
        return self.poll([ref])[ref]

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        self.jobs[ref.job_id]["state"] = JobState.CANCELLED

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        yield ""

    def list_jobs(self) -> list[JobStatus]:
        return []

    def capacity(self, plan) -> Capacity:
        return Capacity(self.free_nodes, 8, f"fake: {self.free_nodes} of 8 nodes free")

    def check(self) -> str:
        return "fake"

    def finish(self, job_id: str, forget: bool = False) -> None:
        self.jobs[job_id]["state"] = JobState.SUCCEEDED
        if forget:
            self.queue.discard(job_id)


@dataclass(frozen=True)
class Call:
    """One command a FakeTransport was asked to run."""

    argv: tuple[str, ...]
    stdin: str | None
    job_env: Mapping[str, str] | None


Answer = Callable[[tuple[str, ...]], CommandResult]


def replying(returncode: int = 0, stdout: str = "", stderr: str = "") -> Answer:
    """A FakeTransport answer: every command exits *returncode* with this output."""
    return lambda argv: CommandResult(argv, returncode, stdout, stderr)


class FakeTransport(Transport):
    """A transport that runs nothing: it keeps every call and answers it with ``answer(argv)`` (by default,
    success with no output)."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer = answer or replying()
        self.calls: list[Call] = []

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0,
            resend: bool = True, job_env: Mapping[str, str] | None = None) -> CommandResult:
        self.calls.append(Call(tuple(argv), stdin, job_env))
        return self.answer(tuple(argv))

    def stream(self, argv: Sequence[str], timeout: float = 24 * 3600.0, check: bool = True) -> Iterator[str]:
        yield from ()
