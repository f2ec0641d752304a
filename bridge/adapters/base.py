"""The contract every backend implements, and the objects that cross it.

A backend is one package under ``bridge.adapters`` plus one line in ``REGISTRY``; it implements every
method of ``Adapter`` and passes ``tests/integration/test_adapter_conformance.py`` on its real engine.

Each backend turns a LaunchPlan into an ``Artifact`` whose text is exactly what ``submit`` sends, so a
dry run is the first half of a submit and nothing else. ``render`` is pure; the other calls talk to the
backend and raise ``BackendUnavailable`` (retry) or ``BackendRejected`` (don't) — never a bare exception.
What a backend truly cannot do raises ``Unsupported``. Idempotency, retries and the durable record of
what was submitted live one layer up (``bridge.service``), never in a front end.
"""

from __future__ import annotations

import re
import signal as _signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from bridge.annotations import PREFIX, SBATCH_PASSTHROUGH_PREFIX
from bridge.api.cluster import BridgeCluster
from bridge.errors import InvalidSpec, Unsupported
from bridge.plan import SBATCH_DROPPED_OFF_SLURM, LaunchPlan


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
    #: the command line that sends the files, where a backend sends them with one (sbatch and its flags)
    command: tuple[str, ...] = ()

    @property
    def main(self) -> str:
        return self.files[0].content

    def document(self) -> dict[str, object]:
        """The artifact as data (``render -o json|yaml``): its backend, kind, command and files."""
        return {"backend": self.backend, "kind": self.kind, **({"command": list(self.command)} if self.command else {}),
                "files": [{"name": f.name, "mediaType": f.media_type, "content": f.content} for f in self.files]}

    def text(self) -> str:
        if self.command:
            import shlex

            shown = f"# --- command ---\n{shlex.join(self.command)}\n"
            return shown + "".join(f"# --- {f.name} ---\n{f.content}" + ("" if f.content.endswith("\n") else "\n")
                                   for f in self.files)
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
class Identity:
    """Who a job is for: the TrainJob's uid, name and namespace. Every backend job carries the uid."""

    uid: str
    name: str
    namespace: str = "default"
    #: the job this uid was last recorded with (the operator's annotation, which its tenant can write): only a
    #: hint where to look first; a backend answers with it only where that job carries this uid and is its own
    job_id: str | None = None


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


#: signals a cancel may send, by the name users write (TERM, SIGTERM and term all mean SIGTERM)
SIGNALS: Mapping[str, _signal.Signals] = {
    name: getattr(_signal, f"SIG{name}")
    for name in ("TERM", "INT", "HUP", "KILL", "QUIT", "USR1", "USR2", "CONT", "STOP", "ALRM")
}


def signal_name(name: str | None, field_name: str = "--signal") -> str | None:
    """A user-given signal name → its canonical short name (``TERM``); anything else is InvalidSpec."""
    if name is None:
        return None
    short = name.strip().upper().removeprefix("SIG")
    if short not in SIGNALS:
        raise InvalidSpec(field_name, name, f"unknown signal; use one of {', '.join(SIGNALS)}")
    return short


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond the contract's minimum; the layer and the conformance suite read it."""

    #: cancel(signal=...) delivers that signal to the job's processes before the hard stop
    signals: bool = True
    #: a suspended plan is submitted held and stays pending
    hold: bool = True
    #: logs(follow=True) streams while the job runs
    follow_logs: bool = True
    #: a job name exists once on the backend: a rerun removes the finished job of that name first
    unique_names: bool = False
    #: a job's name on the backend is its uid (the local cluster's state directories), not the TrainJob's name:
    #: a fresh uid is a fresh name, so each submit of a batch script is a job of its own there too
    named_by_uid: bool = False
    #: the job's processes run for real (False where the engine only schedules, e.g. kwok nodes)
    runs_commands: bool = True
    #: a batch script is sent as it is, with its own directives (``LaunchPlan.batch_script``); backends
    #: without this run what the script means, and refuse a script that has no TrainJob form
    batch_scripts: bool = False
    #: the job runs in the process that submits it, which must stay until it ends: a front end waits for it
    #: there and cancels it on Ctrl-C (the local cluster)
    foreground: bool = False
    #: ``list_jobs`` holds every job ``find`` could answer with for any uid (one listing of this identity's
    #: jobs, not one per namespace or name): lookups in a burst (an operator re-attaching thousands after a
    #: restart) may share one listing (``bridge.service.listing``) instead of a backend query per group
    lists_every_job: bool = False


@dataclass(frozen=True)
class OptionSpec:
    """One scheduler knob a backend understands (``hpcbridge.io/<name>`` or a cluster default)."""

    name: str
    #: what the option becomes in this backend's artifact, for `hpcbridge clusters --options` and errors
    maps_to: str


#: the knobs of BackendOptions that a TrainJob or cluster can set; adapters declare the subset they honour
OPTION_NAMES = ("partition", "account", "qos", "constraint", "exclusive", "array", "dependency", "output",
                "error", "sbatch")


@dataclass(frozen=True)
class NodeNeed:
    """What one node of a plan takes from a machine: CPUs, memory, GPUs (placement compares it to nodes)."""

    cpus: int
    memory_mib: int | None
    gpus: int

    @classmethod
    def of(cls, plan: LaunchPlan) -> NodeNeed:
        # at least a CPU per process: MPI ranks and torchrun workers each take one where nothing else is said
        return cls(max(plan.resources.cpu_count or 0, plan.procs_per_node, 1), plan.resources.memory_mib,
                   plan.resources.gpus)

    def text(self) -> str:
        memory = f", {self.memory_mib} MiB" if self.memory_mib else ""
        return f"{self.cpus} CPU{memory}, {self.gpus} GPU"


@dataclass(frozen=True)
class Capacity:
    """How many of a cluster's nodes could take one node of a plan (its NodeNeed, its partition or queue, its
    node labels): ``free`` now, ``fitting`` at all (busy nodes included, down or drained ones not); ``limit``
    why the cluster can never run the plan (a partition's time or size limit), else None; ``detail`` says
    what was counted, for ``--dry-run``."""

    free: int
    fitting: int
    detail: str
    limit: str | None = None


@dataclass(frozen=True)
class Amounts:
    """Nodes, CPUs, memory and GPUs of a cluster; None where the backend does not say (Flux gives no memory)."""

    nodes: int | None = None
    cpus: int | None = None
    memory_mib: int | None = None
    gpus: int | None = None

    def text(self) -> str:
        shown = [f"{value} {unit}" for value, unit in ((self.nodes, "nodes"), (self.cpus, "CPUs"),
                                                      (self.memory_mib, "MiB"), (self.gpus, "GPUs"))
                 if value is not None]
        return ", ".join(shown) or "nothing known"


@dataclass(frozen=True)
class ClusterSize:
    """What a whole cluster has (``total``) and, of it, what could run jobs (``usable``: nodes neither down nor
    drained), from one backend query; ``detail`` says where it came from. A backend that cannot say leaves
    the amounts None: never a guess (a virtual node then advertises only what is known)."""

    total: Amounts
    usable: Amounts
    detail: str


class Adapter(ABC):
    """One backend. Instances are cheap; connections are opened lazily and reused."""

    backend: str = ""
    capabilities: Capabilities = Capabilities()
    #: scheduler knobs this backend honours; a plan that sets any other is refused before rendering
    options: tuple[OptionSpec, ...] = ()

    def __init__(self, cluster: BridgeCluster) -> None:
        self.cluster = cluster

    # --- pure --------------------------------------------------------------------------------------

    @abstractmethod
    def render(self, plan: LaunchPlan) -> Artifact:
        """Pure: the exact artifact submit would send. No I/O, no clock, no randomness."""

    def check_options(self, plan: LaunchPlan) -> None:
        """Refuse every scheduler option this backend does not declare (InvalidSpec naming it)."""
        declared = {option.name for option in self.options}
        for name, value in set_options(plan):
            if name == "sbatch" and name not in declared:
                assert isinstance(value, tuple)  # set_options gives ("sbatch", (option, value))
                option, given = value
                raise InvalidSpec(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}{option}]", given,
                                  f"cluster {self.cluster.name!r} ({self.backend}) has no equivalent of sbatch's "
                                  f"--{option}; remove it or pick a Slurm cluster (off Slurm only options that "
                                  "change nothing about the job are dropped, each with a note: "
                                  f"{', '.join(SBATCH_DROPPED_OFF_SLURM)})")
            if name not in declared:
                known = ", ".join(sorted(declared)) or "none"
                raise InvalidSpec(f"metadata.annotations[{PREFIX}{name}]", value,
                                  f"cluster {self.cluster.name!r} ({self.backend}) has no {name} option "
                                  f"(it understands: {known}); remove it or pick another cluster")

    def admit(self, plan: LaunchPlan) -> None:  # noqa: B027 - only a backend that can tell before sending overrides it
        """Refuse (InvalidSpec) a plan this cluster could never start, where that can be told before anything
        is sent (the local cluster: this machine's GPUs, the working directory). The service calls it while
        preparing, so ``--dry-run`` refuses what ``submit`` would; a scheduler decides the rest when it is sent."""

    # --- talking to the backend --------------------------------------------------------------------

    def dry_run(self, artifact: Artifact) -> None:  # noqa: B027 - a backend whose scheduler can be asked overrides it
        """Ask the scheduler whether it would take *artifact*, exactly as ``submit`` sends it, sending nothing
        (sbatch ``--test-only``, a server-side dry run); refuse as ``submit`` would, with its error and message.
        Only ``--dry-run`` calls it: ``render`` stays offline, and ``submit`` gets the answer by sending."""


    @abstractmethod
    def submit(self, artifact: Artifact) -> JobRef:
        """Send the artifact, unconditionally (the layer looks the uid up first); return its reference."""

    @abstractmethod
    def find(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        """The newest job the backend knows for each uid, with its state, in one backend query.

        Uids the backend has no job for are absent. Finished jobs are included while the backend
        remembers them; the layer's durable record covers the rest. A backend may look at an identity's
        ``job_id`` first (costing what the batch holds, not what the cluster holds), answering from it only
        where that job carries the uid and has not finished (a finished one may have a newer rerun).
        """

    @abstractmethod
    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        """States of many jobs with one backend query; a job the backend doesn't know is UNKNOWN."""

    def changes(self) -> Generator[str | None, None, None] | None:
        """Where the backend pushes events: an endless iterator of the ids of jobs whose state just changed
        (poll them to read it), with None now and then while nothing happens so a consumer can stop; it ends,
        or raises BackendUnavailable, when the connection does. None where jobs are only polled."""
        return None

    def wait(self, ref: JobRef, timeout: float | None = None) -> JobStatus:
        """Block until the job ends (or *timeout* seconds pass: then its current status). Here: one batched
        poll a second, for backends with nothing to block on; a backend that can block overrides it."""
        return poll_until_finished(lambda: self.poll([ref])[ref], interval=1.0, timeout=timeout)

    @abstractmethod
    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        """Stop the job: with *signal*, send it first and wait up to *grace_seconds* before the hard stop."""

    @abstractmethod
    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        """The job's output; with *follow*, streamed while it runs and ending when the job ends."""

    @abstractmethod
    def list_jobs(self) -> list[JobStatus]:
        """The jobs hpc-bridge submitted to this cluster as this user, with their uids and states."""

    @abstractmethod
    def capacity(self, plan: LaunchPlan) -> Capacity:
        """How many nodes could take one of *plan*'s nodes, now and at all, from one batched backend query
        (``--cluster auto``); BackendUnavailable when the backend cannot be reached."""

    def size(self) -> ClusterSize:
        """The whole cluster's nodes, CPUs, memory and GPUs, in all and usable, from one backend query (a
        virtual node's capacity); BackendUnavailable when the backend cannot be reached. Here: nothing known."""
        return ClusterSize(Amounts(), Amounts(), f"{self.backend or 'this backend'} does not say its size")

    @abstractmethod
    def check(self) -> str:
        """Reach the backend once; return a one-line description, raise BackendUnavailable if unreachable."""

    def remove(self, ref: JobRef) -> None:  # noqa: B027 - backends whose names are unique override it
        """Delete a finished job's traces so its name can be used again (backends with unique names)."""

    def ref(self, job_id: str, identity: Identity | None = None) -> JobRef:
        """A reference to a job known by its backend id (and, where recorded, its identity)."""
        self.check_job_id(job_id)
        return JobRef(self.cluster.name, self.backend, job_id, identity.uid if identity else "",
                      identity.name if identity else "")

    #: what this backend's job ids look like; an id that doesn't match never reaches a command or a URL
    job_id_pattern: re.Pattern[str] | None = None

    def check_job_id(self, job_id: str) -> str:
        """*job_id* if it is one of this backend's ids, else InvalidSpec: an id reaches command lines and URLs,
        where '--me' or '../x' would mean something else."""
        if self.job_id_pattern is not None and not self.job_id_pattern.fullmatch(job_id):
            raise InvalidSpec("job id", job_id, f"not a {self.backend} job id")
        return job_id

    def close(self) -> None:  # noqa: B027 - adapters without connections keep this no-op
        """Release connections (the adapter may be used again afterwards)."""

    def unsupported(self, operation: str, why: str) -> Unsupported:
        return Unsupported(self.backend, f"{operation}: {why}")


def poll_until_finished(read: Callable[[], JobStatus], *, interval: float, timeout: float | None = None,
                        on_status: Callable[[JobStatus], None] | None = None,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> JobStatus:
    """The one wait loop: *read* a job's status every *interval* seconds until it ends, or until *timeout*
    seconds passed (then its status then); *on_status* sees every reading. ``Adapter.wait`` and the
    orchestration layer's ``Follow`` both wait through it."""
    give_up = None if timeout is None else clock() + timeout
    while True:
        status = read()
        if on_status is not None:
            on_status(status)
        if status.state.finished or (give_up is not None and clock() >= give_up):
            return status
        sleep(interval)


def set_options(plan: LaunchPlan) -> list[tuple[str, object]]:
    """(option name, value) for every scheduler knob the plan sets; sbatch pass-through as ("sbatch", (opt, v))."""
    options = plan.options
    found: list[tuple[str, object]] = []
    for name in OPTION_NAMES[:-1]:
        value = getattr(options, name)
        if value:
            found.append((name, value))
    found.extend(("sbatch", item) for item in options.sbatch_extra)
    return found
