"""One active operator among its replicas: leader election on a ``coordination.k8s.io/v1`` Lease.

Every replica is a candidate; the one whose name is the Lease's ``holderIdentity`` is the only one that runs
kopf (handlers, sync loops, submissions). The others stand by, reading the Lease every ``retry`` seconds, and
take it over only after they have seen it unchanged for ``duration`` seconds by their own clock (the holder's
clock is never compared with theirs). Every write is a replace at the resourceVersion last read, so two
candidates that race for the same expired Lease cannot both win.

The active replica renews every ``retry`` seconds; once it has not renewed for ``renew_deadline`` seconds
(shorter than ``duration``, so it stops before anyone may take over) or reads another holder, it has lost the
Lease and the process ends at once: nothing it started may write again. Its pod restarts as a candidate. A
replica stopped gracefully (SIGTERM: a rolling upgrade) releases the Lease after kopf has stopped, so a standby
takes over within ``retry`` seconds instead of ``duration``.

The state machine (``Elector``) takes the Lease API and the clock as arguments; ``LeaderElection`` runs it
with the kubernetes client, a renewing thread and the probe endpoints.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from bridge.errors import InvalidSpec

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

log = logging.getLogger("hpcbridge.operator")

STANDBY, ACTIVE, STOPPED = "standby", "active", "stopped"


@dataclass(frozen=True)
class LeaseTiming:
    """Seconds: how long a Lease not renewed stays someone's, how long its holder keeps trying to renew before
    it gives up (less than *duration*), how often candidates read it and the holder renews it."""

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0

    @classmethod
    def from_duration(cls, duration: float) -> LeaseTiming:
        """client-go's proportions (15 / 10 / 2 s) scaled to *duration*."""
        if duration < 2:
            raise InvalidSpec("--lease-duration", str(duration), "must be at least 2 seconds")
        return cls(duration, duration * 2 / 3, max(duration * 2 / 15, 0.2))


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec as the election reads and writes it, and the resourceVersion it was read at."""

    holder: str | None
    duration_seconds: int
    transitions: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    resource_version: str | None = None


class Conflict(Exception):
    """Someone else wrote the Lease since it was read (or created it first)."""


class LeaseApi(Protocol):
    """One Lease: read it (None where there is none), create it, replace it at its resourceVersion."""

    def read(self) -> LeaseRecord | None: ...
    def create(self, record: LeaseRecord) -> LeaseRecord: ...
    def replace(self, record: LeaseRecord) -> LeaseRecord: ...


class Elector:
    """The election's state machine, one step per call of ``step``; *clock* is monotonic seconds and *now*
    the wall time written into the Lease (for people reading it, never for deciding)."""

    def __init__(self, leases: LeaseApi, identity: str, timing: LeaseTiming | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.leases, self.identity, self.timing = leases, identity, timing or LeaseTiming()
        self.clock, self.now = clock, now
        self.state = STANDBY
        #: the last record read or written, and when (this clock) it was seen to change
        self.observed: LeaseRecord | None = None
        self.observed_at = 0.0
        #: when this replica last wrote the Lease as its holder
        self.renewed_at = 0.0
        #: whether a read of the Lease has ever succeeded (a standby that cannot reach the API is not ready)
        self.reached = False
        #: the last failed attempt's error ("" once one succeeds)
        self.error = ""

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    def step(self) -> bool:
        """Acquire or renew once; True while this replica holds the Lease. A holder that finds it cannot renew
        past the deadline, or finds another holder, moves to ``stopped`` for good."""
        if self.state == STOPPED:
            return False
        try:
            held = self._try()
        except Exception as exc:  # an API error is a failed attempt: the deadline decides what it means
            if str(exc) != self.error:  # once per kind of trouble, not every retry
                log.warning("leader election: the Lease cannot be read or written: %s", _one_line(exc))
            self.error, held = str(exc), False
        else:
            self.error = ""
        if self.state == ACTIVE and not held and self.clock() - self.renewed_at > self.timing.renew_deadline:
            self.state = STOPPED
        elif held:
            self.state = ACTIVE
        return self.state == ACTIVE

    def lost(self) -> bool:
        return self.state == STOPPED

    def _try(self) -> bool:
        current = self.leases.read()
        self.reached = True
        stamp = self.now()
        if current is None:
            try:
                self._written(self.leases.create(LeaseRecord(self.identity, self._seconds(), 0, stamp, stamp)))
            except Conflict:
                return False
            return True
        if current != self.observed:
            self.observed, self.observed_at = current, self.clock()
        if current.holder == self.identity:  # ours (or an earlier life's of this pod: it is gone)
            record = replace(current, renew_time=stamp, duration_seconds=self._seconds())
        elif current.holder and self.clock() - self.observed_at <= current.duration_seconds:
            if self.state == ACTIVE:
                self.state = STOPPED  # someone else holds it: this replica lost it
            return False
        else:
            record = LeaseRecord(self.identity, self._seconds(), current.transitions + 1, stamp, stamp,
                                 current.resource_version)
        try:
            self._written(self.leases.replace(record))
        except Conflict:
            return False
        return True

    def release(self) -> None:
        """Give the Lease up (a graceful stop): no holder, a one-second duration, so a standby takes it at its
        next read. Nothing happens where this replica does not hold it."""
        was_active, self.state = self.active, STOPPED
        if not was_active or self.observed is None or self.observed.holder != self.identity:
            return
        try:
            self.leases.replace(replace(self.observed, holder=None, duration_seconds=1, renew_time=self.now()))
        except Exception as exc:  # it expires on its own
            log.warning("lease not released (%s): a standby takes over when it expires", exc)

    def _written(self, record: LeaseRecord) -> None:
        self.observed, self.observed_at = record, self.clock()
        self.renewed_at = self.observed_at

    def _seconds(self) -> int:
        return max(1, round(self.timing.duration))


class KubeLeases:
    """``LeaseApi`` on the API server: the Lease *name* in *namespace*."""

    def __init__(self, api_client: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name = namespace, name

    def read(self) -> LeaseRecord | None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _record(lease)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        return self._write(lambda body: self.api.create_namespaced_lease(self.namespace, body), record)

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        return self._write(lambda body: self.api.replace_namespaced_lease(self.name, self.namespace, body), record)

    def _write(self, call: Callable[[Any], Any], record: LeaseRecord) -> LeaseRecord:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                         resource_version=record.resource_version),
            spec=client.V1LeaseSpec(holder_identity=record.holder, lease_duration_seconds=record.duration_seconds,
                                    lease_transitions=record.transitions, acquire_time=record.acquire_time,
                                    renew_time=record.renew_time))
        try:
            return _record(call(body))
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(self.name) from None
            raise


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(spec.holder_identity or None, spec.lease_duration_seconds or 1, spec.lease_transitions or 0,
                       spec.acquire_time, spec.renew_time, lease.metadata.resource_version)


def _one_line(exc: Exception) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:  # the kubernetes client's ApiException prints headers and body on many lines
        return f"HTTP {status} {reason}"
    return " ".join(str(exc).split())[:300]


def default_identity() -> str:
    """$POD_NAME (the Deployment's downward API), else host and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def lease_name(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` (``--leader-elect``) as (namespace, name)."""
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise InvalidSpec("--leader-elect", value, "must be NAMESPACE/NAME of the Lease, e.g. "
                                                   "hpcbridge-system/hpcbridge-operator")
    return namespace, name


def _lost_lease() -> None:
    log.error("leader election: the Lease is lost (not renewed in time, or another replica holds it): stopping now")
    logging.shutdown()
    os._exit(1)


class LeaderElection:
    """The election as the operator runs it: ``wait_until_active`` blocks a standby, a thread renews the
    Lease while active (*on_lost* when it is lost: by default the process ends at once), ``release`` gives it
    up on a graceful stop. ``serve_probes`` answers /healthz (alive) and /readyz (the Lease can be read:
    active or standby, which the body says)."""

    def __init__(self, elector: Elector, on_lost: Callable[[], None] = _lost_lease,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.elector, self.on_lost, self.sleep = elector, on_lost, sleep
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def wait_until_active(self) -> None:
        announced = False
        while not self.elector.step():
            if not announced and self.elector.reached:
                holder = self.elector.observed.holder if self.elector.observed else None
                log.info("leader election: standing by as %s (%s holds the Lease)", self.elector.identity, holder)
                announced = True
            self.sleep(self.elector.timing.retry)
        log.info("leader election: %s is the active operator", self.elector.identity)
        self._renewer = threading.Thread(target=self._renew, name="lease-renewer", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.elector.timing.retry):
            self.elector.step()
            if self.elector.lost():
                if not self._stop.is_set():
                    self.on_lost()
                return

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.elector.timing.retry + 5)
        self.elector.release()

    def serve_probes(self, host: str, port: int) -> ThreadingHTTPServer:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        elector = self.elector

        class Probes(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/healthz":
                    code, text = 200, "ok"
                elif self.path == "/readyz":
                    ready = elector.reached and not elector.lost()
                    code, text = (200 if ready else 503), elector.state
                else:
                    code, text = 404, "not found"
                data = f"{text}\n".encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                return

        server = ThreadingHTTPServer((host, port), Probes)
        threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
        return server


def start(api_client: Any, lease: str, duration: float | None = None, probes: tuple[str, int] | None = None,
          identity: str | None = None) -> LeaderElection:
    """``--leader-elect NAMESPACE/NAME``: serve the probes on *probes* (host, port) when given, stand by until
    this replica holds the Lease, and return with it held and renewing."""
    namespace, name = lease_name(lease)
    timing = LeaseTiming.from_duration(duration) if duration is not None else LeaseTiming()
    election = LeaderElection(Elector(KubeLeases(api_client, namespace, name), identity or default_identity(),
                                      timing))
    if probes:
        election.serve_probes(*probes)
    election.wait_until_active()
    return election
