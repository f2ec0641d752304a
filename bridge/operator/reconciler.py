"""The operator's logic, without kopf: run a TrainJob (resolve + submit through ``bridge.service``, as the CLI
does), follow it with one sync loop per BridgeCluster (one batched poll per cycle for all of its TrainJobs,
conditions and Events on every change), stop it when it is deleted.

kopf (``bridge.operator.main``) only routes watch events here; the API is behind ``KubeApi`` so the logic is
tested with the real API server and, in unit tests, with a fake.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn, cast

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
from bridge.api.trainjob import MANAGED_BY_BRIDGE
from bridge.errors import BackendRejected, BridgeError, InvalidSpec
from bridge.operator import conditions as cond
from bridge.operator.metrics import Metrics
from bridge.operator.submitter import Submitter
from bridge.operator.sync import ClusterSync, Timing, Tracked

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, JobRef, JobStatus
    from bridge.api.cluster import BridgeCluster
    from bridge.api.trainjob import TrainJob
    from bridge.tenancy import Request

log = logging.getLogger("hpcbridge.operator")
#: notes shown as Events per TrainJob, at most (a script with many dropped lines must not flood the namespace)
MAX_NOTE_EVENTS = 20


#: what a suspended TrainJob shows
SUSPENDED_CHANGES = (cond.Change(cond.RUNNING, False, "Suspended", "TrainJob is suspended"),
                     cond.Change(cond.SUSPENDED, True, "Suspended", "TrainJob is suspended"))


class Permanent(Exception):
    """The TrainJob cannot run as written (its status says why); retrying will not help."""


class Temporary(Exception):
    """The backend could not be reached; try again after ``delay`` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay

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
    #: handed to every sync loop: told each changed state of a followed TrainJob (the stand-in pods)
    on_status: Callable[[Tracked, JobStatus], None] | None = None
    #: jobs on backends that run no pods tag each line with its node (the stand-in pods' logs are per node)
    tag_output: bool = False

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
        item = Tracked(namespace, name, uid, None, current, meta.get("generation"))
        if spec.get("suspend"):
            self._standalone_change(item, SUSPENDED_CHANGES)
            return {}
        # resumed after a suspend: the job the suspend stopped is finished, and runs again (a job sent after the
        # resume is found still running, or has finished and then the TrainJob is finished too)
        resumed = any(c.get("type") == cond.SUSPENDED for c in current)
        # a TrainJob whose status (written only by the operator, never by its tenant) says it was sent is
        # re-attached, never sent again: its job may have finished and been forgotten while no operator ran
        sent = any(c.get("type") == cond.SUBMITTED and c.get("status") == "True" for c in current)
        prepared, submitted = self._submit(body, item, "rerun" if resumed else "reattach" if sent else "attach")
        return self._follow(item, meta.get("annotations") or {}, prepared, submitted, resumed)

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
        item = self._unfollow(uid)
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
                self._fail(exc)
        if item is None:
            self._standalone_change(Tracked(namespace, name, uid, None, current, meta.get("generation")),
                                    SUSPENDED_CHANGES)
            return
        with item.lock:  # after a write of the sync loop still in flight, on top of what it wrote
            self._standalone_change(item, SUSPENDED_CHANGES)

    def migrate(self, body: dict[str, Any]) -> dict[str, str | None]:
        """``hpcbridge.io/migrate-to`` set on a running TrainJob: as ``hpcbridge migrate`` does
        (``bridge.service.move``) — the target must take it (else a Warning event, and it runs on where it is),
        the backend job is stopped with ``hpcbridge.io/migrate-signal`` (default TERM@30) and has ended, the
        TrainJob runs on the target with HPCBRIDGE_RESUME_FROM. Returns the annotations to write: the new job,
        the TrainJob's cluster (so a restarted operator follows it there), the history, and migrate-to removed."""
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        namespace, name, uid = _identity(meta)
        annotations = meta.get("annotations") or {}
        target = annotations.get(MIGRATE_ANNOTATION)
        cluster = self._job_cluster(meta, self._tracked(uid))
        current = list((body.get("status") or {}).get("conditions") or [])
        done: dict[str, str | None] = {MIGRATE_ANNOTATION: None}
        if not target or target == cluster or cond.finished(current):
            return done  # nothing runs elsewhere to move (a finished TrainJob stays as it ended)
        if cluster is None or spec.get("suspend"):
            return {**done, CLUSTER_ANNOTATION: target}  # not running: it runs on the target when it runs
        try:  # the target must take it before anything stops
            signal, grace = service.parse_stop_signal(annotations.get(MIGRATE_SIGNAL_ANNOTATION) or "TERM@30")
            prepared = self._prepare_move(body, cluster, target)
        except InvalidSpec as exc:  # refused before anything stopped: it runs on where it is
            self.api.event(namespace, name, uid, "MigrationRefused", str(exc), warning=True)
            return done
        found = self._job_to_move(cluster, namespace, uid, name)
        if found is None:
            return {**done, CLUSTER_ANNOTATION: target}  # nothing of it runs there: it runs on the target
        source_adapter, job = found
        item = self._unfollow(uid) or Tracked(namespace, name, uid, None, current, meta.get("generation"))
        try:
            moved = service.move(source_adapter, job, prepared, signal=signal, grace_seconds=grace,
                                 reason=annotations.get(MIGRATE_REASON_ANNOTATION) or "", retry=self.retry,
                                 send=lambda prepared: self._submitter(target).submit(prepared, "rerun"))
        except BridgeError as exc:
            if not exc.retryable:
                self.api.event(namespace, name, uid, "MigrationFailed", str(exc), warning=True)
            self._fail(exc)
        return {**done, **self._moved(item, cluster, job.job_id, target, moved, annotations)}

    def delete(self, body: dict[str, Any]) -> None:
        """A TrainJob being deleted: the job the backend holds for its uid, under its tenant's identity, is
        cancelled and what was created for it removed."""
        meta = body.get("metadata") or {}
        namespace, name, uid = _identity(meta)
        item = self._unfollow(uid)
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
            sync.views.shutdown()
        adapters = [sync.adapter for sync in self.syncs.values()] + [kept for _, kept in self._adapters.values()]
        for adapter in {id(adapter): adapter for adapter in adapters}.values():
            adapter.close()

    # --- the steps of the entry points

    def _submit(self, body: dict[str, Any], item: Tracked,
                if_finished: service.IfFinished) -> tuple[service.Prepared, service.Submitted]:
        """Prepare the TrainJob *body* for its cluster, as its tenant, and send it (idempotently by uid). A
        refusal is written on it (Failed, a Warning Event) and is Permanent; an outage shows BackendUnavailable
        and is Temporary."""
        from bridge.operator.kube import without_server_fields
        from bridge.operator.kueue import as_admitted

        namespace, name = item.namespace, item.name
        try:
            source = self._source(as_admitted(without_server_fields(body)), namespace, name)
            prepared = service.prepare(source, configured=self.api.clusters(),
                                       default_cluster=self.default_cluster or "", adapter_for=self._adapter,
                                       tenancy=self._tenancy(namespace), tag_output=self.tag_output)
            cluster = prepared.adapter.cluster.name
            annotations = (body.get("metadata") or {}).get("annotations") or {}
            if annotations.get(JOB_CLUSTER_ANNOTATION) == cluster and annotations.get(JOB_ID_ANNOTATION):
                # where this operator recorded its job: the lookup by uid looks there first (a re-attach after a
                # restart then costs what its group holds, not the whole queue), and trusts it only on a match
                prepared = replace(prepared, recorded_job=annotations[JOB_ID_ANNOTATION])
            return prepared, self._submitter(cluster).submit(prepared, if_finished)
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

    def _source(self, trainjob: dict[str, Any], namespace: str, name: str) -> service.Input:
        """A TrainJob document (as kopf hands it over) and the runtime it names, read from the API (none: a
        built-in stands in), as the service reads a file."""
        from bridge.api.loader import parse_object

        parsed = cast("TrainJob", parse_object(trainjob, f"TrainJob {namespace}/{name}"))
        ref_spec = parsed.spec.runtime_ref
        runtime = self.api.runtime(namespace, ref_spec.kind or "ClusterTrainingRuntime", ref_spec.name)
        return service.Input((parsed, *([runtime] if runtime is not None else [])), f"TrainJob {namespace}/{name}",
                             None)

    def _follow(self, item: Tracked, annotations: dict[str, str], prepared: service.Prepared,
                submitted: service.Submitted, resumed: bool) -> dict[str, str]:
        """Follow a TrainJob just sent (or found sent) on its cluster's sync loop; Events for a job sent now
        and its notes. Returns the annotations that record its job, where they are not there yet."""
        ref = submitted.ref
        self.metrics.submission(prepared.adapter.cluster.name, "attached" if submitted.existing else "submitted")
        item.ref, item.nodes, item.attached = ref, prepared.plan.nodes, submitted.existing
        cluster = prepared.adapter.cluster.name
        sync = self._sync(cluster, None)  # polls as the cluster's own identity; the tenant's acts
        recorded = {JOB_ID_ANNOTATION: ref.job_id, JOB_CLUSTER_ANNOTATION: cluster}
        job = f"{prepared.adapter.backend} job {ref.job_id} on cluster {cluster}"
        first = not submitted.existing
        changes = [cond.Change(cond.SUBMITTED, True, "Submitted", f"submitted as {job}"),
                   cond.Change(cond.BACKEND_UNAVAILABLE, False, "BackendAvailable", f"{job} found")]
        if resumed:
            changes.append(cond.Change(cond.SUSPENDED, False, "Resumed", "TrainJob is resumed"))
        item.pending = changes  # written with the first poll of the job, which track() asks for at once
        if first:  # an Event is a courtesy: it does not hold up the next submission; before the poll's
            sync.views.submit(item.uid, functools.partial(self.api.event, item.namespace, item.name, item.uid,
                                                          "Submitted", f"submitted as {job}"))
            # what the CLI prints as notes (an option dropped off Slurm, a field not honoured), so kubectl
            # describe shows it too: nothing the TrainJob asked for is left out silently
            for note in prepared.notes[:MAX_NOTE_EVENTS]:
                sync.views.submit(item.uid, functools.partial(self.api.event, item.namespace, item.name, item.uid,
                                                              "Note", note))
        sync.track(item)
        return {key: value for key, value in recorded.items() if annotations.get(key) != value}

    def _prepare_move(self, body: dict[str, Any], cluster: str, target: str) -> service.Prepared:
        """The TrainJob *body* prepared on *target*, as its tenant, resuming from its checkpoint: InvalidSpec
        where the target does not take it (then nothing is stopped)."""
        import copy

        from bridge.operator.kube import without_server_fields

        namespace, name, _ = _identity(body.get("metadata") or {})
        doc = copy.deepcopy(without_server_fields(body))
        doc["metadata"].setdefault("annotations", {})[CLUSTER_ANNOTATION] = target
        service.add_resume_env(doc, f"the job of TrainJob {name} on {cluster}")
        return service.prepare(self._source(doc, namespace, name), cluster=target, configured=self.api.clusters(),
                               adapter_for=self._adapter, tenancy=self._tenancy(namespace),
                               cluster_field=f"metadata.annotations[{MIGRATE_ANNOTATION}]",
                               tag_output=self.tag_output)

    def _job_to_move(self, cluster: str, namespace: str, uid: str, name: str) -> tuple[Adapter, JobRef] | None:
        """The job the backend holds for the TrainJob *uid* under its tenant's identity on *cluster*, and the
        adapter that acts for that tenant there; None when nothing of it runs there."""
        try:
            adapter, owned = self._owned_job(cluster, namespace, uid, name)
        except InvalidSpec:
            return None
        except BridgeError as exc:
            self._fail(exc)
        if owned is None or owned.state.value == "Unknown":
            return None
        return adapter, owned.ref

    def _moved(self, item: Tracked, cluster: str, job_id: str, target: str, moved: service.Moved,
               annotations: dict[str, str]) -> dict[str, str | None]:
        """A TrainJob moved: followed on *target* from now on (Migrated and Submitted with the first poll),
        an Event; the annotations that record its new job and its history."""
        import json

        move, submitted = moved.move, moved.submitted
        history = [*json.loads(annotations.get(HISTORY_ANNOTATION) or "[]"), move]
        how = f" after {move['signal']}" if move["signal"] else ""
        why = f": {move['reason']}" if move["reason"] else ""
        message = (f"moved from {cluster} job {job_id} ({moved.source.state.value}{how}) to {target} job "
                   f"{submitted.ref.job_id}{why}")
        job = f"{moved.prepared.adapter.backend} job {submitted.ref.job_id} on cluster {target}"
        item.ref = submitted.ref
        item.pending = [cond.Change(cond.MIGRATED, True, "Migrated", message),
                        cond.Change(cond.SUBMITTED, True, "Submitted", f"submitted as {job}")]
        self._sync(target, None).track(item)
        self.api.event(item.namespace, item.name, item.uid, "Migrated", message)
        return {JOB_ID_ANNOTATION: submitted.ref.job_id, JOB_CLUSTER_ANNOTATION: target,
                CLUSTER_ANNOTATION: target, HISTORY_ANNOTATION: json.dumps(history, sort_keys=True)}

    def _unfollow(self, uid: str) -> Tracked | None:
        """Stop following the TrainJob *uid* on every sync loop: what it was followed as, or None."""
        item = None
        for sync in list(self.syncs.values()):
            item = sync.forget(uid) or item
        return item

    def _fail(self, exc: BridgeError) -> NoReturn:
        """A backend error as kopf is to take it: Temporary (retried after a while) or Permanent."""
        if exc.retryable:
            raise Temporary(str(exc), self.timing.outage_retry) from None
        raise Permanent(str(exc)) from None

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
                sync.on_status = self.on_status
                sync.start()
            return sync

    def _refuse(self, item: Tracked, reason: str, message: str) -> None:
        self._standalone_change(item, [cond.Change(cond.FAILED, True, reason, message)])
        self.api.event(item.namespace, item.name, item.uid, reason, message, warning=True)

    def _standalone_change(self, item: Tracked, changes: Sequence[cond.Change]) -> None:
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
