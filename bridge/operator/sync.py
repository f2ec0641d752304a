"""Following TrainJobs on one BridgeCluster: one sync loop per cluster, one batched poll per cycle for all of
its TrainJobs (``bridge.service.poll``), conditions and Events written on every change; the backend's event
journal, where it has one, wakes the loop at once."""

from __future__ import annotations

import functools
import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge import service
from bridge.errors import BackendRejected, BridgeError
from bridge.operator import conditions as cond
from bridge.operator.metrics import Metrics

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, JobStatus

log = logging.getLogger("hpcbridge.operator")


@dataclass
class Tracked:
    namespace: str
    name: str
    uid: str
    ref: Any  # JobRef
    conditions: list[dict[str, Any]]
    generation: int | None = None
    #: (state, reason, message, exit code) last written
    last: tuple[str, str | None, str | None, int | None] | None = None
    #: changes to write with the next poll's (Submitted: one status write where there would be two)
    pending: list[cond.Change] = field(default_factory=list, repr=False, compare=False)
    done: bool = False
    #: how many nodes the TrainJob runs on (its stand-in pods, one each)
    nodes: int = 1
    #: its job was there before it was followed (a restart, a fail-over): the Events of the state its conditions
    #: show were made then, and are not made again
    attached: bool = False
    #: held while its conditions are computed and written: one write at a time per TrainJob
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


@dataclass
class Timing:
    """Sync loop intervals: *fast* after a change, doubling to *slow* while nothing changes."""

    fast: float = 0.5
    slow: float = 1.5
    outage_retry: float = 2.0
    #: after the backend's journal names a job whose state the poll does not show changed yet (its listing
    #: lags the journal), polls again this often, for up to *lag_window* seconds
    journal_retry: float = 0.05
    lag_window: float = 1.0
    #: the share of the loop's time its cycles may take when woken by TrainJobs newly followed: a restart or a
    #: mass apply follows thousands in a row, and back-to-back cycles (each as long as the whole queue's
    #: listing) would take the time those TrainJobs' handlers need. The journal's wakes are not held back.
    busy_share: float = 1 / 3


class Views:
    """What a TrainJob's status shows beside its conditions (its Events, its stand-in pods), written apart from
    the sync cycle: a cycle hands them over and ends once its conditions are written, so a burst of views (a
    mass apply: an Event and pod writes per TrainJob) never holds up the next cycle's statuses. One TrainJob's
    views are written in the order they were handed over (each TrainJob keeps to one lane), many TrainJobs' at
    once (a lane each)."""

    def __init__(self, cluster_name: str, lanes: int = 8) -> None:
        self.lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"views-{cluster_name}-{index}")
                      for index in range(lanes)]
        self._queued = 0
        self._settled = threading.Condition()

    def submit(self, uid: str, write: Callable[[], Any]) -> None:
        with self._settled:
            self._queued += 1

        def run() -> None:
            try:
                write()
            except Exception:  # a view not written is logged; the TrainJob's status is not affected
                log.exception("writing a view of TrainJob uid %s", uid)
            finally:
                with self._settled:
                    self._queued -= 1
                    self._settled.notify_all()

        self.lanes[zlib.crc32(uid.encode()) % len(self.lanes)].submit(run)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until every view handed over is written; False if *timeout* passed first."""
        with self._settled:
            return self._settled.wait_for(lambda: self._queued == 0, timeout)

    def shutdown(self) -> None:
        for lane in self.lanes:
            lane.shutdown(wait=True)


class ClusterSync:
    """Follows every TrainJob on one BridgeCluster: one thread, one batched poll per cycle. Nothing runs until
    ``start``: a sync can be built and driven one cycle at a time (the unit tests do)."""

    def __init__(self, cluster_name: str, adapter: Adapter, api: Any, timing: Timing,
                 metrics: Metrics | None = None) -> None:
        self.cluster_name, self.adapter, self.api, self.timing = cluster_name, adapter, api, timing
        self.metrics = metrics or Metrics()
        self.tracked: dict[str, Tracked] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.unavailable: str | None = None
        #: told each state a poll finds changed, after it is written (the stand-in pods follow it)
        self.on_status: Callable[[Tracked, JobStatus], None] | None = None
        self.writers = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"status-{cluster_name}")
        self.views = Views(cluster_name)
        #: job ids the backend's journal named since the last poll; and those it named whose change the polls
        #: did not show yet, with the time to stop looking
        self.hinted: set[str] = set()
        self.lagging: dict[str, float] = {}
        self.journal_events = 0
        self.thread = threading.Thread(target=self._loop, name=f"sync-{cluster_name}", daemon=True)
        self.watcher = threading.Thread(target=self._watch, name=f"journal-{cluster_name}", daemon=True)

    def start(self) -> None:
        """Start the poll loop and the journal watcher (once)."""
        self.thread.start()
        self.watcher.start()

    def track(self, item: Tracked) -> None:
        with self.lock:
            self.tracked[item.uid] = item
        self.wake.set()

    def forget(self, uid: str) -> Tracked | None:
        with self.lock:
            return self.tracked.pop(uid, None)

    def change(self, item: Tracked, changes: list[cond.Change]) -> bool:
        """Apply *changes* to a followed TrainJob's conditions and write them (the one writer of them while it
        is followed); False when it is no longer followed, or gone (then no longer followed). Writes for
        different TrainJobs run at once; for one, one at a time."""
        from bridge.operator.kube import Gone

        with item.lock:
            with self.lock:
                if self.tracked.get(item.uid) is not item:
                    return False  # suspended or deleted meanwhile: what a poll before that said is stale
            updated = cond.apply(item.conditions, changes, item.generation)
            if updated == item.conditions:
                return True
            try:
                self.api.write_conditions(item.namespace, item.name, item.uid, updated)
            except Gone:
                with self.lock:
                    self.tracked.pop(item.uid, None)
                item.done = True
                return False
            item.conditions = updated
            return True

    def states(self) -> dict[str, int]:
        with self.lock:
            items = list(self.tracked.values())
        counts: dict[str, int] = {}
        for item in items:
            state = item.last[0] if item.last else "Submitted"
            counts[state] = counts.get(state, 0) + 1
        return counts

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _loop(self) -> None:
        interval = self.timing.fast
        while not self.stopping.is_set():
            with self.lock:
                active = [item for item in self.tracked.values() if not item.done]
            if not active:
                self.wake.wait(self.timing.slow)
                self.wake.clear()
                continue
            started = time.monotonic()
            try:
                changed = self.cycle(active)
            except BridgeError as exc:
                self.metrics.backend_error(self.cluster_name)
                self._outage(active, str(exc))
                self.wake.wait(self.timing.outage_retry)
                self.wake.clear()
                continue
            except Exception:  # never let one bad answer end the loop for every TrainJob of the cluster
                log.exception("sync loop for cluster %s", self.cluster_name)
                changed = False
            took = time.monotonic() - started
            self.metrics.cycle(self.cluster_name, took)
            interval = self.timing.fast if changed else min(interval * 2, self.timing.slow)
            with self.lock:
                lagging = bool(self.lagging)
            self.wake.wait(self.timing.journal_retry if lagging else interval)
            self.wake.clear()
            self._rest(started + took / self.timing.busy_share)

    def _rest(self, until: float) -> None:
        """Wait until *until* unless the journal names a job first (its change is shown at once)."""
        while not self.stopping.is_set():
            with self.lock:
                if self.hinted or self.lagging:
                    return
            left = until - time.monotonic()
            if left <= 0:
                return
            self.wake.wait(left)
            self.wake.clear()

    def _watch(self) -> None:
        """Follow the backend's event journal, where it has one: each job it names wakes the loop at once,
        so a state change reaches the TrainJob in one poll instead of up to an interval later. Polling goes
        on regardless; the journal only makes it prompt."""
        while not self.stopping.is_set():
            adapter = self.adapter
            error: BridgeError | None
            try:
                changes = service.journal(adapter)
            except BridgeError as exc:
                changes, error = None, exc
            else:
                error = None
            if changes is None and error is None:
                return  # no journal: polled only
            try:
                for job_id in changes or ():
                    if self.stopping.is_set() or adapter is not self.adapter:
                        break
                    if job_id is not None:
                        self.journal_events += 1
                        self.metrics.journal_event(self.cluster_name)
                        with self.lock:
                            self.hinted.add(job_id)
                        self.wake.set()
            except BackendRejected as exc:
                log.warning("cluster %s: no event journal (%s); its jobs are polled", self.cluster_name, exc)
                return
            except BridgeError as exc:
                error = exc
            finally:
                if changes is not None:
                    changes.close()
            if error is not None:
                log.info("cluster %s: event journal interrupted (%s); reopened in %gs", self.cluster_name, error,
                         self.timing.outage_retry)
            self.stopping.wait(self.timing.outage_retry)

    def cycle(self, active: list[Tracked]) -> bool:
        with self.lock:
            hinted, self.hinted = self.hinted, set()
            now = time.monotonic()
            followed = {item.ref.job_id for item in active}
            for job_id in hinted & followed:  # the journal names every job of the instance
                self.lagging.setdefault(job_id, now + self.timing.lag_window)
            self.lagging = {job_id: until for job_id, until in self.lagging.items() if until > now}
        statuses = service.poll(self.adapter, [item.ref for item in active])
        if self.unavailable is not None:
            self.unavailable = None
            for item in active:
                self._safely(item, [cond.Change(cond.BACKEND_UNAVAILABLE, False, "BackendAvailable",
                                                f"cluster {self.cluster_name} answers again")])
        work = []
        for item in active:
            status = statuses.get(item.ref)
            if status is None:
                continue
            key = (status.state.value, status.reason, status.message, status.exit_code)
            if key != item.last or item.pending:
                work.append((item, status, key))
                with self.lock:
                    self.lagging.pop(item.ref.job_id, None)

        def write(entry: tuple[Tracked, JobStatus, tuple[str, str | None, str | None, int | None]]
                  ) -> cond.Event | bool:
            """The TrainJob's conditions: False where not written, else the Event owed (True: none)."""
            item, status, key = entry
            job = f"{self.adapter.backend} job {item.ref.job_id} on cluster {self.cluster_name}"
            pending, item.pending = item.pending, []
            changes = [*pending, *cond.for_status(status.state.value, status.reason, status.message,
                                                  status.exit_code, job)]
            shown = item.conditions
            if not self._safely(item, changes):
                item.pending = pending
                return False
            # an Event per transition: queued (with each new reason), running on its hosts, ended; none for a
            # re-attached job still as its conditions show it (a restart of 10,000 would repeat 10,000 Events)
            announced = item.last is None and item.attached and item.conditions == shown
            event = None if announced else cond.event_for(item.last[:2] if item.last else None, key[0],
                                                          status.reason, status.exit_code, status.nodes, job)
            item.last = key
            item.done = status.state.finished
            return event or True

        def tell(item: Tracked, status: JobStatus, event: cond.Event | bool) -> None:
            """The Event and the stand-in pods: views of a status already written."""
            if isinstance(event, cond.Event):
                self.api.event(item.namespace, item.name, item.uid, event.reason, event.message,
                               warning=event.warning)
            if self.on_status is not None:
                self.on_status(item, status)

        # many jobs end together (a burst of completions): their status writes go out side by side; their
        # views after them, apart from the cycle
        written = list(self.writers.map(write, work)) if len(work) > 1 else [write(entry) for entry in work]
        for (item, status, _), event in zip(work, written, strict=True):
            if event is not False:
                self.views.submit(item.uid, functools.partial(tell, item, status, event))
        return bool(work)

    def _outage(self, active: list[Tracked], message: str) -> None:
        if self.unavailable is None:
            self.unavailable = message
            for item in active:
                if self._safely(item, [cond.Change(cond.BACKEND_UNAVAILABLE, True, "BackendUnavailable", message)]):
                    self.api.event(item.namespace, item.name, item.uid, "BackendUnavailable", message, warning=True)

    def _safely(self, item: Tracked, changes: list[cond.Change]) -> bool:
        try:
            return self.change(item, changes)
        except BridgeError as exc:
            log.warning("TrainJob %s/%s: status not written: %s", item.namespace, item.name, exc)
            return False
