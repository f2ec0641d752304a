"""The adapter interface every backend implements, and the objects that cross it.

Each backend turns a LaunchPlan into an ``Artifact`` whose text is exactly what ``submit`` sends, so a
dry run is the first half of a submit and nothing else. ``render`` is pure; the other calls talk to the
backend and raise ``BackendUnavailable`` (retry) or ``BackendRejected`` (don't) — never a bare exception.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from bridge.api.cluster import BridgeCluster
from bridge.errors import BackendRejected
from bridge.plan import LaunchPlan


@dataclass(frozen=True)
class ArtifactFile:
    name: str
    content: str
    media_type: str = "text/plain"


@dataclass(frozen=True)
class Artifact:
    """What a backend receives, rendered. ``files[0]`` is the main document."""

    backend: str
    kind: str
    plan: LaunchPlan
    files: tuple[ArtifactFile, ...]

    @property
    def main(self) -> str:
        return self.files[0].content

    def text(self) -> str:
        if len(self.files) == 1:
            return self.main
        return "".join(f"# --- {f.name} ---\n{f.content}" + ("" if f.content.endswith("\n") else "\n") for f in self.files)


class JobState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    COMPLETING = "Completing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    TIMEOUT = "Timeout"
    UNKNOWN = "Unknown"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)


@dataclass(frozen=True)
class JobRef:
    cluster: str
    backend: str
    job_id: str
    uid: str
    name: str


@dataclass(frozen=True)
class JobStatus:
    ref: JobRef
    state: JobState
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    nodes: tuple[str, ...] = field(default_factory=tuple)


class Adapter(ABC):
    """One backend. Instances are cheap; connections are opened lazily and reused."""

    backend: str = ""

    def __init__(self, cluster: BridgeCluster) -> None:
        self.cluster = cluster

    @abstractmethod
    def render(self, plan: LaunchPlan) -> Artifact:
        """Pure: the exact artifact submit would send. No I/O, no clock, no randomness."""

    def submit(self, artifact: Artifact) -> JobRef:
        raise self._unsupported("submit")

    def submit_many(self, artifacts: Sequence[Artifact]) -> list[JobRef]:
        """Submit several jobs; backends override this to look all of them up at once."""
        return [self.submit(artifact) for artifact in artifacts]

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        """States of many jobs with one backend query."""
        raise self._unsupported("poll")

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        raise self._unsupported("cancel")

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        raise self._unsupported("logs")

    def list_jobs(self) -> list[JobStatus]:
        """Every job hpc-bridge submitted to this cluster that the backend still knows, with its state."""
        raise self._unsupported("list")

    def check(self) -> str:
        """Reach the backend once; return a one-line description, raise BackendUnavailable if unreachable."""
        raise self._unsupported("check")

    def ref(self, job_id: str) -> JobRef:
        """A reference to a job known only by its backend id (CLI status/cancel/logs)."""
        return JobRef(self.cluster.name, self.backend, job_id, "", "")

    def find(self, uid: str) -> JobRef | None:
        """The job that already carries *uid*, if any (idempotent submit)."""
        raise self._unsupported("find")

    def _unsupported(self, operation: str) -> BackendRejected:
        return BackendRejected(self.backend, f"{operation} is not supported by the {self.backend} adapter yet "
                                             f"(render and --dry-run are)")
