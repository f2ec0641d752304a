"""The operator's logic, without kopf: run a TrainJob (resolve + submit through ``bridge.service``, as the CLI
does), follow it with one sync loop per BridgeCluster (one batched poll per cycle for all of its TrainJobs,
conditions and Events on every change), stop it when it is deleted.

kopf (``bridge.operator.main``) only routes watch events here; the API is behind ``KubeApi`` so the logic is
tested with the real API server and, in unit tests, with a fake.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from bridge import service
from bridge.annotations import (
    CLUSTER_ANNOTATION,
    HISTORY_ANNOTATION,
    JOB_CLUSTER_ANNOTATION,
    JOB_ID_ANNOTATION,
    MIGRATE_ANNOTATION,
    MIGRATE_REASON_ANNOTATION,
    MIGRATE_SIGNAL_ANNOTATION,
)
from bridge.errors import BackendRejected, BridgeError, InvalidSpec
from bridge.operator import conditions as cond
from bridge.operator.metrics import Metrics

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, JobStatus
    from bridge.api.cluster import BridgeCluster
    from bridge.api.trainjob import TrainJob
    from bridge.tenancy import Request
from bridge.api.trainjob import MANAGED_BY_BRIDGE

log = logging.getLogger("hpcbridge.operator")
#: notes shown as Events per TrainJob, at most (a script with many dropped lines must not flood the namespace)
MAX_NOTE_EVENTS = 20


class Permanent(Exception):
    """The TrainJob cannot run as written (its status says why); retrying will not help."""


class Temporary(Exception):
    """The backend could not be reached; try again after ``delay`` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


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
        self.writers = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"status-{cluster_name}")
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
            self.metrics.cycle(self.cluster_name, time.monotonic() - started)
            interval = self.timing.fast if changed else min(interval * 2, self.timing.slow)
            with self.lock:
                lagging = bool(self.lagging)
            self.wake.wait(self.timing.journal_retry if lagging else interval)
            self.wake.clear()

    def _watch(self) -> None:
        """Follow the backend's event journal, where it has one: each job it names wakes the loop at once,
        so a state change reaches the TrainJob in one poll instead of up to an interval later. Polling goes
        on regardless; the journal only makes it prompt."""
        while not self.stopping.is_set():
            adapter = self.adapter
            error: BridgeError | None
            try:
                changes = adapter.changes()
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

        def write(entry: tuple[Tracked, JobStatus, tuple[str, str | None, str | None, int | None]]) -> None:
            item, status, key = entry
            job = f"{self.adapter.backend} job {item.ref.job_id} on cluster {self.cluster_name}"
            pending, item.pending = item.pending, []
            changes = [*pending, *cond.for_status(status.state.value, status.reason, status.message,
                                                  status.exit_code, job)]
            if not self._safely(item, changes):
                item.pending = pending
            else:
                # an Event per change of state; waiting is what Submitted already said
                if (item.last is None or item.last[0] != key[0]) and key[0] not in ("Pending", "Unknown"):
                    warning = status.state.value in ("Failed", "Cancelled", "Timeout")
                    self.api.event(item.namespace, item.name, item.uid, status.state.value, changes[-1].message,
                                   warning=warning)
                item.last = key
                item.done = status.state.finished

        # many jobs end together (a burst of completions): their status writes go out side by side
        if len(work) > 1:
            list(self.writers.map(write, work))
        else:
            for entry in work:
                write(entry)
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


class Submitter:
    """Group commit of one cluster's submissions: ``run`` calls arriving from many kopf workers while a group
    is being sent wait and go out together as the next group, with one lookup by uid for all of it (one
    squeue for a burst of TrainJobs instead of one each); a lone submission goes out at once."""

    def __init__(self, retry: service.Retry) -> None:
        self.retry = retry
        self._queue: list[tuple[Any, service.IfFinished, Future[service.Submitted]]] = []
        self._lock = threading.Lock()
        self._sending = False

    def submit(self, prepared: service.Prepared, if_finished: service.IfFinished) -> service.Submitted:
        future: Future[service.Submitted] = Future()
        with self._lock:
            self._queue.append((prepared, if_finished, future))
            lead, self._sending = not self._sending, True
        if lead:  # this caller sends groups until none is waiting; the others wait for their answers
            while True:
                with self._lock:
                    group, self._queue = self._queue, []
                    if not group:
                        self._sending = False
                        break
                self._send(group)
        return future.result()

    def _send(self, group: list[tuple[Any, service.IfFinished, Future[service.Submitted]]]) -> None:
        batches: dict[tuple[int, str], list[tuple[Any, service.IfFinished, Future[service.Submitted]]]] = {}
        for entry in group:
            batches.setdefault((id(entry[0].adapter), entry[1]), []).append(entry)
        for batch in batches.values():
            self._send_batch(batch)

    def _send_batch(self, batch: list[tuple[Any, service.IfFinished, Future[service.Submitted]]]) -> None:
        # one plan per uid (kopf runs one handler per TrainJob at a time; a duplicate shares the answer)
        by_uid: dict[str, list[Future[service.Submitted]]] = {}
        plans = []
        for prepared, _, future in batch:
            if prepared.plan.uid not in by_uid:
                plans.append(prepared)
            by_uid.setdefault(prepared.plan.uid, []).append(future)
        try:
            results = service.submit_many(plans, if_finished=batch[0][1], retry=self.retry)
        except BaseException as exc:
            if len(plans) > 1 and not (isinstance(exc, BridgeError) and exc.retryable):
                # one plan the backend refuses must not fail the others: each alone (those already sent are
                # found by uid, not sent again)
                for prepared in plans:
                    self._send_batch([(prepared, batch[0][1], f) for f in by_uid[prepared.plan.uid]])
                return
            for futures in by_uid.values():
                for future in futures:
                    future.set_exception(exc)
            return
        for prepared, result in zip(plans, results, strict=True):
            for future in by_uid[prepared.plan.uid]:
                future.set_result(result)


@dataclass
class Reconciler:
    """Runs, follows and stops TrainJobs managed by hpc-bridge."""

    api: Any  # KubeApi
    #: the cluster for a TrainJob that names none (its annotations, its runtime's)
    default_cluster: str | None = None
    timing: Timing = field(default_factory=Timing)
    retry: service.Retry = field(default_factory=lambda: service.Retry(attempts=3))
    adapter_for: Callable[[BridgeCluster], Adapter] = service.get_adapter
    syncs: dict[str, ClusterSync] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: per cluster: the BridgeCluster an adapter was made for and the adapter (shared by submissions, the sync
    #: loop, suspend and delete: one connection per cluster)
    _adapters: dict[tuple[str, str | None], tuple[BridgeCluster, Adapter]] = field(default_factory=dict)
    _submitters: dict[str, Submitter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.metrics.states = self._states

    def _states(self) -> dict[tuple[str, str], int]:
        return {(cluster, state): count for cluster, sync in list(self.syncs.items())
                for state, count in sync.states().items()}

    # --- entry points (kopf handlers call these)

    def run(self, body: dict[str, Any]) -> dict[str, str]:
        """A TrainJob created, resumed, or found at start-up: submit it (idempotently by uid) and follow it;
        a suspended one (Kueue creates them suspended until admitted) is only marked Suspended. Returns the
        annotations that record its backend job, where they are not there yet: the caller writes them (kopf,
        with its own patch of the TrainJob: one write instead of two)."""
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        namespace, name, uid = _identity(meta)
        current = list((body.get("status") or {}).get("conditions") or [])
        if spec.get("managedBy") not in (None, "", MANAGED_BY_BRIDGE):
            return {}  # another controller's (the kopf filter already says which are ours)
        if cond.finished(current):
            return {}  # done before this operator started: its record stays as it is
        from bridge.api.loader import parse_object
        from bridge.operator.kube import without_server_fields

        item = Tracked(namespace, name, uid, None, current, meta.get("generation"))
        if spec.get("suspend"):
            self._standalone_change(item, [cond.Change(cond.RUNNING, False, "Suspended", "TrainJob is suspended"),
                                           cond.Change(cond.SUSPENDED, True, "Suspended", "TrainJob is suspended")])
            return {}
        # resumed after a suspend: the job the suspend stopped is finished, and runs again (a job sent after the
        # resume is found still running, or has finished and then the TrainJob is finished too)
        suspended = next((c for c in current if c.get("type") == cond.SUSPENDED), None)
        if_finished: service.IfFinished = "rerun" if suspended is not None else "attach"
        try:
            from bridge.operator.kueue import as_admitted

            # the body kopf hands over is a TrainJob's
            trainjob = cast("TrainJob", parse_object(as_admitted(without_server_fields(body)),
                                                     f"TrainJob {namespace}/{name}"))
            ref_spec = trainjob.spec.runtime_ref
            runtime = self.api.runtime(namespace, ref_spec.kind or "ClusterTrainingRuntime", ref_spec.name)
            source = service.Input((trainjob, *([runtime] if runtime is not None else [])),
                                   f"TrainJob {namespace}/{name}", None)
            prepared = service.prepare(source, configured=self.api.clusters(),
                                       default_cluster=self.default_cluster or "", adapter_for=self._adapter,
                                       tenancy=self._tenancy(namespace))
            submitted = self._submitter(prepared.adapter.cluster.name).submit(prepared, if_finished)
        except InvalidSpec as exc:
            self.metrics.submission(_target(body), "refused")
            reason = ("NamespaceNotAllowed" if exc.field == "metadata.namespace" else
                      "InvalidBridgeCluster" if exc.field.startswith("BridgeCluster ") else "InvalidTrainJob")
            self._refuse(item, reason, str(exc))
            raise Permanent(str(exc)) from None
        except BackendRejected as exc:
            self.metrics.submission(_target(body), "refused")
            self.metrics.backend_error(_target(body))
            self._refuse(item, "BackendRejected", str(exc))
            raise Permanent(str(exc)) from None
        except BridgeError as exc:
            if not exc.retryable:
                self._refuse(item, type(exc).__name__, str(exc))
                raise Permanent(str(exc)) from None
            self.metrics.submission(_target(body), "unavailable")
            self.metrics.backend_error(_target(body))
            self._standalone_change(item, [cond.Change(cond.BACKEND_UNAVAILABLE, True, "BackendUnavailable",
                                                       str(exc))])
            raise Temporary(str(exc), self.timing.outage_retry) from None
        ref = submitted.ref
        self.metrics.submission(prepared.adapter.cluster.name, "attached" if submitted.existing else "submitted")
        item.ref = ref
        cluster = prepared.adapter.cluster.name
        sync = self._sync(cluster, None)  # polls as the cluster's own identity; the tenant's acts
        recorded = {JOB_ID_ANNOTATION: ref.job_id, JOB_CLUSTER_ANNOTATION: cluster}
        annotations = meta.get("annotations") or {}
        job = f"{prepared.adapter.backend} job {ref.job_id} on cluster {cluster}"
        first = not submitted.existing
        changes = [cond.Change(cond.SUBMITTED, True, "Submitted", f"submitted as {job}"),
                   cond.Change(cond.BACKEND_UNAVAILABLE, False, "BackendAvailable", f"{job} found")]
        if suspended is not None:
            changes.append(cond.Change(cond.SUSPENDED, False, "Resumed", "TrainJob is resumed"))
        item.pending = changes  # written with the first poll of the job, which track() asks for at once
        sync.track(item)
        if first:  # an Event is a courtesy: it does not hold up the next submission
            sync.writers.submit(self.api.event, namespace, name, uid, "Submitted", f"submitted as {job}")
            # what the CLI prints as notes (an option dropped off Slurm, a field not honoured), so kubectl
            # describe shows it too: nothing the TrainJob asked for is left out silently
            for note in prepared.notes[:MAX_NOTE_EVENTS]:
                sync.writers.submit(self.api.event, namespace, name, uid, "Note", note)
        return {key: value for key, value in recorded.items() if annotations.get(key) != value}

    def suspend(self, body: dict[str, Any], grace_seconds: float = 30.0) -> None:
        """``spec.suspend`` set: the backend job is stopped (SIGTERM, then killed after the grace) and the
        TrainJob shows Suspended; unsetting it runs the TrainJob again (``run``). The job stopped is the one the
        backend holds for this TrainJob's uid under its tenant's identity; a job whose state is Unknown is left
        alone."""
        meta = body.get("metadata") or {}
        namespace, name, uid = _identity(meta)
        current = list((body.get("status") or {}).get("conditions") or [])
        if cond.finished(current):
            return
        item = None
        for sync in list(self.syncs.values()):
            item = sync.forget(uid) or item
        cluster = self._job_cluster(meta, item)
        if cluster is not None:
            try:
                adapter, owned = self._owned_job(cluster, namespace, uid, name)
                if owned is not None and not owned.state.finished and owned.state.value != "Unknown":
                    service.cancel_ref(adapter, owned.ref, signal="TERM", grace_seconds=grace_seconds,
                                       retry=self.retry)
                    self.api.event(namespace, name, uid, "Suspended", f"{adapter.backend} job {owned.ref.job_id} "
                                                                      "stopped")
            except InvalidSpec as exc:  # the namespace is no tenant of that cluster: nothing of it to stop there
                log.warning("TrainJob %s/%s: suspend: %s", namespace, name, exc)
            except BridgeError as exc:
                if exc.retryable:
                    raise Temporary(str(exc), self.timing.outage_retry) from None
                raise Permanent(str(exc)) from None
        changes = [cond.Change(cond.RUNNING, False, "Suspended", "TrainJob is suspended"),
                   cond.Change(cond.SUSPENDED, True, "Suspended", "TrainJob is suspended")]
        if item is None:
            self._standalone_change(Tracked(namespace, name, uid, None, current, meta.get("generation")), changes)
            return
        with item.lock:  # after a write of the sync loop still in flight, on top of what it wrote
            self._standalone_change(item, changes)

    def migrate(self, body: dict[str, Any]) -> dict[str, str | None]:
        """``hpcbridge.io/migrate-to`` set on a running TrainJob: as ``hpcbridge migrate`` does — the target
        must take it (else a Warning event, and it runs on where it is), the backend job is stopped with
        ``hpcbridge.io/migrate-signal`` (default TERM@30) and has ended, the TrainJob runs on the target with
        HPCBRIDGE_RESUME_FROM. Returns the annotations to write: the new job, the TrainJob's cluster (so a
        restarted operator follows it there), the history, and migrate-to removed."""
        import copy
        import json

        from bridge.api.loader import parse_object
        from bridge.operator.kube import without_server_fields

        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        namespace, name, uid = _identity(meta)
        annotations = meta.get("annotations") or {}
        target = annotations.get(MIGRATE_ANNOTATION)
        tracked = self._tracked(uid)
        cluster = self._job_cluster(meta, tracked)
        current = list((body.get("status") or {}).get("conditions") or [])
        done: dict[str, str | None] = {MIGRATE_ANNOTATION: None}
        if not target or target == cluster or cond.finished(current):
            return done  # nothing runs elsewhere to move (a finished TrainJob stays as it ended)
        if cluster is None or spec.get("suspend"):
            return {**done, CLUSTER_ANNOTATION: target}  # not running: it runs on the target when it runs
        try:  # the target must take it before anything stops
            signal, grace = service.parse_stop_signal(annotations.get(MIGRATE_SIGNAL_ANNOTATION) or "TERM@30")
            doc = copy.deepcopy(without_server_fields(body))
            doc["metadata"].setdefault("annotations", {})[CLUSTER_ANNOTATION] = target
            service.add_resume_env(doc, f"the job of TrainJob {name} on {cluster}")
            trainjob = cast("TrainJob", parse_object(doc, f"TrainJob {namespace}/{name}"))  # kopf's TrainJob
            ref_spec = trainjob.spec.runtime_ref
            runtime = self.api.runtime(namespace, ref_spec.kind or "ClusterTrainingRuntime", ref_spec.name)
            source = service.Input((trainjob, *([runtime] if runtime is not None else [])),
                                   f"TrainJob {namespace}/{name}", None)
            prepared = service.prepare(source, cluster=target, configured=self.api.clusters(),
                                       adapter_for=self._adapter, tenancy=self._tenancy(namespace))
        except InvalidSpec as exc:  # refused before anything stopped: it runs on where it is
            self.api.event(namespace, name, uid, "MigrationRefused", str(exc), warning=True)
            return done
        try:  # the job to move is the one the backend holds for this uid under the tenant's identity
            source_adapter, owned = self._owned_job(cluster, namespace, uid, name)
        except InvalidSpec:
            owned = None
        except BridgeError as exc:
            if exc.retryable:
                raise Temporary(str(exc), self.timing.outage_retry) from None
            raise Permanent(str(exc)) from None
        if owned is None or owned.state.value == "Unknown":
            return {**done, CLUSTER_ANNOTATION: target}  # nothing of it runs there: it runs on the target
        job_id = owned.ref.job_id
        item = None
        for sync in list(self.syncs.values()):
            item = sync.forget(uid) or item
        item = item or Tracked(namespace, name, uid, None, current, meta.get("generation"))
        try:
            status, stopped_by = service.stop_to_move(source_adapter, owned.ref, signal, grace, retry=self.retry)
            submitted = self._submitter(target).submit(prepared, "rerun")
        except BridgeError as exc:
            if exc.retryable:
                raise Temporary(str(exc), self.timing.outage_retry) from None
            self.api.event(namespace, name, uid, "MigrationFailed", str(exc), warning=True)
            raise Permanent(str(exc)) from None
        move = service.move_record(status, stopped_by, target, submitted.ref.job_id,
                                   annotations.get(MIGRATE_REASON_ANNOTATION) or "")
        history = [*json.loads(annotations.get(HISTORY_ANNOTATION) or "[]"), move]
        how = f" after {move['signal']}" if move["signal"] else ""
        why = f": {move['reason']}" if move["reason"] else ""
        message = (f"moved from {cluster} job {job_id} ({status.state.value}{how}) to {target} job "
                   f"{submitted.ref.job_id}{why}")
        job = f"{prepared.adapter.backend} job {submitted.ref.job_id} on cluster {target}"
        item.ref = submitted.ref
        item.pending = [cond.Change(cond.MIGRATED, True, "Migrated", message),
                        cond.Change(cond.SUBMITTED, True, "Submitted", f"submitted as {job}")]
        self._sync(target, None).track(item)
        self.api.event(namespace, name, uid, "Migrated", message)
        return {**done, JOB_ID_ANNOTATION: submitted.ref.job_id, JOB_CLUSTER_ANNOTATION: target,
                CLUSTER_ANNOTATION: target, HISTORY_ANNOTATION: json.dumps(history, sort_keys=True)}

    def delete(self, body: dict[str, Any]) -> None:
        """A TrainJob being deleted: the job the backend holds for its uid, under its tenant's identity, is
        cancelled and what was created for it removed."""
        meta = body.get("metadata") or {}
        namespace, name, uid = _identity(meta)
        item = None
        for sync in list(self.syncs.values()):
            item = sync.forget(uid) or item
        cluster = self._job_cluster(meta, item)
        if cluster is None:
            return  # never submitted, or its cluster is gone
        try:
            adapter, owned = self._owned_job(cluster, namespace, uid, name)
            if owned is not None:
                service.stop_and_remove(adapter, owned.ref, retry=self.retry)
        except InvalidSpec as exc:
            log.warning("TrainJob %s/%s: delete: %s", namespace, name, exc)
        except BridgeError as exc:
            if exc.retryable:
                raise Temporary(str(exc), self.timing.outage_retry) from None
            log.warning("TrainJob %s/%s: cancelling its job on %s: %s", namespace, name, cluster, exc)

    def shutdown(self) -> None:
        for sync in self.syncs.values():
            sync.stop()
        for sync in self.syncs.values():
            sync.thread.join(timeout=10)
            sync.writers.shutdown(wait=True)
        adapters = [sync.adapter for sync in self.syncs.values()] + [kept for _, kept in self._adapters.values()]
        for adapter in {id(adapter): adapter for adapter in adapters}.values():
            adapter.close()

    # --- helpers

    def _tenancy(self, namespace: str) -> Request:
        from bridge.tenancy import Request

        return Request(namespace, self.api.namespace_labels(namespace))

    def _owned_job(self, cluster: str, namespace: str, uid: str, name: str) -> tuple[Adapter, JobStatus | None]:
        """The adapter that acts for *namespace*'s tenant on *cluster*, and the job the backend holds for the
        TrainJob *uid* as that tenant (None: none); InvalidSpec when the cluster maps no tenant to *namespace*."""
        adapter = service.tenant_adapter(self.api.clusters()[cluster], self._tenancy(namespace), self._adapter)
        return adapter, service.owned_job(adapter, uid, name, namespace, retry=self.retry)

    def _tracked(self, uid: str) -> Tracked | None:
        for sync in list(self.syncs.values()):
            with sync.lock:
                found = sync.tracked.get(uid)
            if found is not None:
                return found
        return None

    def _job_cluster(self, meta: dict[str, Any], item: Tracked | None) -> str | None:
        """The cluster to look for the TrainJob's job on: where this operator follows it, else where its
        annotation says. The annotation is only where to look: the job itself is found there by the TrainJob's
        uid, as its tenant, so a cluster named wrongly finds nothing."""
        if item is not None and item.ref is not None:
            followed: str = item.ref.cluster
            return followed
        cluster: str | None = (meta.get("annotations") or {}).get(JOB_CLUSTER_ANNOTATION)
        if not cluster or cluster not in self.api.clusters():
            return None
        return cluster

    def _adapter(self, cluster: BridgeCluster) -> Adapter:
        """The adapter for BridgeCluster *cluster* (as configured, or a tenant's overlay of it, whose own
        credential Secrets are read here): the one kept for it, unless its spec changed since."""
        from bridge.tenancy import tenant_of

        key = (cluster.name, tenant_of(cluster))
        with self._lock:
            kept = self._adapters.get(key)
            if kept is not None and kept[0] == cluster:
                return kept[1]
        adapter = self.adapter_for(self.api.credentialed(cluster) if key[1] is not None else cluster)
        with self._lock:
            self._adapters[key] = (cluster, adapter)
            sync = self.syncs.get(cluster.name) if key[1] is None else None
            if sync is not None:
                # the loop polls through the new connection from its next cycle; the old one is let go
                # rather than closed under a poll in flight
                sync.adapter = adapter
        return adapter

    def _submitter(self, cluster: str) -> Submitter:
        with self._lock:
            found = self._submitters.get(cluster)
            if found is None:
                found = self._submitters[cluster] = Submitter(self.retry)
            return found

    def _sync(self, cluster: str, adapter: Adapter | None) -> ClusterSync:
        with self._lock:
            sync = self.syncs.get(cluster)
        if sync is not None:
            return sync
        if adapter is None:
            adapter = self._adapter(self.api.clusters()[cluster])
        with self._lock:
            sync = self.syncs.get(cluster)
            if sync is None:
                sync = self.syncs[cluster] = ClusterSync(cluster, adapter, self.api, self.timing, self.metrics)
                sync.start()
            return sync

    def _refuse(self, item: Tracked, reason: str, message: str) -> None:
        self._standalone_change(item, [cond.Change(cond.FAILED, True, reason, message)])
        self.api.event(item.namespace, item.name, item.uid, reason, message, warning=True)

    def _standalone_change(self, item: Tracked, changes: list[cond.Change]) -> None:
        """Conditions for a TrainJob no sync loop follows (refused, or its cluster unreachable)."""
        from bridge.operator.kube import Gone

        updated = cond.apply(item.conditions, changes, item.generation)
        if updated != item.conditions:
            try:
                self.api.write_conditions(item.namespace, item.name, item.uid, updated)
            except Gone:
                return
            item.conditions = updated


def _target(body: dict[str, Any]) -> str:
    """The cluster a TrainJob names (for metrics when it could not be resolved), else "none"."""
    return ((body.get("metadata") or {}).get("annotations") or {}).get(CLUSTER_ANNOTATION) or "none"


def _identity(meta: dict[str, Any]) -> tuple[str, str, str]:
    """A TrainJob's namespace, name and uid from its metadata (the API server sets the name and uid of every
    object it holds)."""
    return meta.get("namespace") or "default", cast(str, meta.get("name")), cast(str, meta.get("uid"))
