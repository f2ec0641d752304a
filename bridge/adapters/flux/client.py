"""Two ways to talk to a Flux broker, one interface: the ``flux`` command (here or over SSH) and flux-python.

The command works with any broker version; flux-python (``pip install 'hpc-bridge[flux]'``, the release that
matches the broker) saves a process per call and is imported only when a cluster asks for it.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, TypeVar

from bridge.adapters.base import SIGNALS
from bridge.adapters.transport import CommandResult, Transport
from bridge.errors import BackendRejected, BackendUnavailable
from bridge.extras import MissingExtra

_T = TypeVar("_T")

_TRANSIENT = ("Connection refused", "No such file or directory", "Unable to connect", "flux_open",
              "broker is not running", "Connection reset")


#: job events after which ``flux jobs`` shows another state of ours (RUN, INACTIVE with its result, an exception)
JOURNAL_EVENTS = ("start", "clean", "exception")

#: run by the broker's own Python next to it (``flux python``, here or over SSH): the job manager's event
#: journal from now on, one line "<id> <event>" per event of JOURNAL_EVENTS, and "-" each second without one
JOURNAL_SCRIPT = f"""
import flux, flux.job
wanted = {set(JOURNAL_EVENTS)!r}
consumer = flux.job.JournalConsumer(flux.Flux(), full=False).start()
while True:
    try:
        event = consumer.poll(1.0)
    except TimeoutError:
        print("-", flush=True)
        continue
    if event is None:
        break
    if event.name in wanted:
        print(event.jobid.f58, event.name, flush=True)
"""


class FluxCLI:
    """The ``flux`` command over a Transport."""

    def __init__(self, transport: Transport, flux: str = "flux") -> None:
        self.transport, self.flux = transport, flux

    def run(self, args: Sequence[str], what: str, stdin: str | None = None, timeout: float = 60.0,
            check: bool = True, resend: bool = True) -> CommandResult:
        result = self.transport.run([self.flux, *args], stdin=stdin, timeout=timeout, resend=resend)
        if result.ok or not check:
            return result
        text = " ".join((result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}").split())
        if any(marker in text for marker in _TRANSIENT):
            raise BackendUnavailable("flux", f"{what}: {text[:400]}")
        raise BackendRejected("flux", f"{what}: {text[:400]}")

    def ids_by_name(self, mine: bool = False) -> dict[str, list[str]]:
        """Job ids by job name, every state; every user's unless *mine*."""
        who = [] if mine else ["--user=all"]
        listing = self.run(["jobs", "-a", *who, "--no-header", "--format={id.f58} {name}"], "flux jobs").stdout
        names: dict[str, list[str]] = {}
        for line in listing.splitlines():
            job_id, _, name = line.partition(" ")
            names.setdefault(name.strip(), []).append(job_id)
        return names

    def jobspec(self, job_id: str) -> dict[str, Any] | None:
        info = self.run(["job", "info", job_id, "jobspec"], "flux job info", check=False)
        try:
            return json.loads(info.stdout) if info.ok else None
        except json.JSONDecodeError:
            return None

    def queues(self) -> list[str]:
        """The instance's named queues (none where it has only its anonymous one)."""
        listing = self.run(["queue", "list", "--no-header", "--format={queue}"], "flux queue list").stdout
        return [line.strip() for line in listing.splitlines() if line.strip()]

    def submit_refusal(self, text: str) -> str:
        """*text*, a refusal of the job manager's, as a submit through this client reports it."""
        return f"flux job submit: flux-job: {text}"

    def submit(self, jobspec: str, urgency: int | None) -> str:
        hold = [f"--urgency={urgency}"] if urgency is not None else []
        result = self.run(["job", "submit", *hold], "flux job submit", stdin=jobspec, resend=False)
        job_id = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        if not job_id:
            raise BackendUnavailable("flux", "flux job submit printed no job id")
        return job_id

    def jobs(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """``flux jobs --json`` entries for *ids* (one call)."""
        result = self.run(["jobs", "--json", *ids], "flux jobs", check=False)
        found: list[dict[str, Any]] = []
        for line in result.stdout.splitlines():
            try:
                payload = json.loads(line)
            except json.JSONDecodeError:
                continue
            found += payload.get("jobs", [payload]) if isinstance(payload, dict) else []
        if not found and not result.ok and not any(m in result.stderr for m in ("unknown", "not found")):
            self.run(["jobs", "--json", *ids], "flux jobs")  # raises the typed error
        return found

    def wait_clean(self, job_id: str, timeout: float) -> bool:
        done = self.run(["job", "wait-event", f"--timeout={timeout:g}", job_id, "clean"], "flux job wait-event",
                        timeout=timeout + 30, check=False)
        return done.ok

    def kill(self, job_id: str, signal: str) -> None:
        self.run(["job", "kill", f"--signal={signal}", job_id], "flux job kill")

    def cancel(self, job_id: str) -> None:
        self.run(["cancel", job_id], "flux cancel")

    def output(self, job_id: str, follow: bool) -> Iterator[str]:
        if follow:
            # attach --read-only prints the output as the job writes it and returns when the job ends
            # (its exit status is the job's, so it is not an error here)
            yield from self.transport.stream([self.flux, "job", "attach", "--read-only", job_id], check=False)
            return
        result = self.run(["job", "eventlog", "--format=json", "--path=guest.output", job_id], "flux job eventlog")
        chunks = []
        for line in result.stdout.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            context = event.get("context", {})
            if event.get("name") == "data" and "data" in context:
                chunks.append(context["data"])
        yield from chunks

    def journal(self) -> Generator[str | None, None, None]:
        """Ids of jobs as JOURNAL_EVENTS happen to them, None each second without one (``Adapter.changes``)."""
        pending = ""
        # silence for 30 s (no heartbeat) means the connection is gone
        for chunk in self.transport.stream([self.flux, "python", "-c", JOURNAL_SCRIPT], timeout=30.0):
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                job_id, _, event = line.strip().partition(" ")
                yield job_id if event else None

    def resources(self, queue: str | None) -> dict[str, str]:
        """Each resource state's set in R's short form (free, allocated, down), of *queue* if given."""
        args = ["resource", "list", "--no-header", "--format={state}|{rlist}", *(["--queue", queue] if queue else [])]
        lines = self.run(args, "flux resource list", timeout=30).stdout.splitlines()
        return dict(line.split("|", 1) for line in lines if "|" in line)

    def describe(self) -> str:
        version = self.run(["version"], "flux version").stdout.splitlines()
        size = self.run(["getattr", "size"], "flux getattr size").stdout.strip()
        return f"{version[0] if version else 'flux'}; instance size {size}"


#: errno values of flux-python calls that mean "the broker is not reachable now", not "no"
_TRANSIENT_ERRNO = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ENOTCONN, errno.EPIPE, errno.ETIMEDOUT,
                    errno.EHOSTUNREACH, errno.EAGAIN, errno.ENOSYS, errno.EIO}


def python_error(exc: OSError, what: str) -> Exception:
    """flux-python raises OSError for everything: transport trouble is retryable, the rest is a refusal."""
    if exc.errno in _TRANSIENT_ERRNO:
        return BackendUnavailable("flux", f"{what}: {exc.strerror or exc}")
    return BackendRejected("flux", f"{what}: {exc.strerror or exc}")


class FluxPython:
    """flux-python: one handle per adapter (``local://`` or ``ssh://`` URIs)."""

    def __init__(self, uri: str | None) -> None:
        try:
            import flux
            import flux.job  # needs ply, which flux-python's metadata forgets
        except ImportError:
            # an install to make, not a broker to wait for; transport: cli needs no bindings
            raise MissingExtra("flux", "Flux's python transport",
                               then="(flux-python of the broker's release), or use transport: cli") from None
        self._flux, self._job, self.uri = flux, flux.job, uri
        try:
            self.handle = flux.Flux(uri) if uri else flux.Flux()
        except OSError as exc:
            raise BackendUnavailable("flux", f"cannot open {uri or '$FLUX_URI'}: {exc}") from None

    def _id(self, job_id: str) -> Any:  # a flux.job.JobID (flux-python has no type information)
        return self._job.JobID(job_id)

    def _call(self, what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise python_error(exc, what) from None

    def ids_by_name(self, mine: bool = False) -> dict[str, list[str]]:
        names: dict[str, list[str]] = {}
        who = {} if mine else {"user": "all"}
        jobs = self._call("job list", lambda: self._job.JobList(self.handle, attrs=["name"], max_entries=0,
                                                                **who).jobs())
        for info in jobs:
            names.setdefault(info.name, []).append(info.id.f58)
        return names

    def jobspec(self, job_id: str) -> dict[str, Any] | None:
        try:
            reply = self.handle.rpc("job-info.lookup", {"id": int(self._id(job_id)), "keys": ["jobspec"],
                                                        "flags": 0}).get()
        except OSError:
            return None
        value = reply.get("jobspec")
        jobspec: dict[str, Any] | None = json.loads(value) if isinstance(value, str) else value
        return jobspec

    def queues(self) -> list[str]:
        answer = self._call("queue list", lambda: self.handle.rpc("job-manager.queue-list").get())
        return [str(name) for name in answer.get("queues") or []]

    def submit_refusal(self, text: str) -> str:
        return f"submit: {text}"

    def submit(self, jobspec: str, urgency: int | None) -> str:
        kwargs = {"urgency": urgency} if urgency is not None else {}
        job_id: str = self._call("submit", self._job.submit, self.handle, jobspec, **kwargs).f58
        return job_id

    def jobs(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """One job-list RPC for all *ids*, in the shape ``flux jobs --json`` prints."""
        infos = self._call("job list", lambda: self._job.JobList(self.handle, ids=[self._id(i) for i in ids],
                                                                 user="all").jobs())
        found: list[dict[str, Any]] = []
        for info in infos:
            exception = {"occurred": bool(getattr(info, "exception", None) and info.exception.occurred)}
            if exception["occurred"]:
                exception.update(type=info.exception.type, note=info.exception.note)
            found.append({"id": int(info.id), "jobid": info.id.f58, "state": info.state, "result": info.result,
                          "returncode": info.returncode, "nodelist": info.nodelist, "exception": exception})
        return found

    def wait_clean(self, job_id: str, timeout: float) -> bool:
        """Blocks on the eventlog (the RPC streams events; no polling); the broker ends it at ``clean``."""
        try:
            self._job.event_wait(self.handle, self._id(job_id), "clean", raiseJobException=False)
        except OSError:
            return False
        return True

    def kill(self, job_id: str, signal: str) -> None:
        self._call("kill", self._job.kill, self.handle, self._id(job_id), SIGNALS[signal])

    def cancel(self, job_id: str) -> None:
        self._call("cancel", self._job.cancel, self.handle, self._id(job_id))

    def output(self, job_id: str, follow: bool) -> Iterator[str]:
        if not follow:
            out = self._call("output", self._job.job_output, self.handle, self._id(job_id), nowait=True)
            yield from ([out.stdout, out.stderr] if out.stderr else [out.stdout])
            return
        # the guest.output eventlog streams while the job runs; the watch ends when the job's shell closes it
        try:
            for event in self._job.event_watch(self.handle, self._id(job_id), eventlog="guest.output"):
                context = getattr(event, "context", {}) or {}
                if getattr(event, "name", "") == "data" and context.get("data"):
                    yield context["data"]
        except OSError as exc:
            raise python_error(exc, "output") from None

    def journal(self) -> Generator[str | None, None, None]:
        """As ``FluxCLI.journal``, through a handle of its own (a handle serves one thread; this one blocks)."""
        try:
            handle = self._flux.Flux(self.uri) if self.uri else self._flux.Flux()
            consumer = self._job.JournalConsumer(handle, full=False).start()
        except OSError as exc:
            raise python_error(exc, "journal") from None
        try:
            while True:
                try:
                    event = consumer.poll(1.0)
                except TimeoutError:
                    yield None
                    continue
                except OSError as exc:
                    raise python_error(exc, "journal") from None
                if event is None:
                    return
                if event.name in JOURNAL_EVENTS:
                    yield event.jobid.f58
        finally:
            consumer.stop()

    def resources(self, queue: str | None) -> dict[str, str]:
        if queue:
            raise BackendRejected("flux", f"resources of queue {queue!r}: flux-python gives the instance's only; "
                                          "use transport: cli")
        from flux.resource.list import resource_list

        listing = self._call("resource list", lambda: resource_list(self.handle).get())
        return {"free": str(listing.free), "allocated": str(listing.allocated), "down": str(listing.down)}

    def describe(self) -> str:
        return f"flux-python {getattr(self._flux, '__version__', '?')}; instance size {self.handle.attr_get('size')}"
