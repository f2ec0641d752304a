"""Sending prepared jobs: idempotent by uid, recorded before submit returns, dependencies and array limits
waited for where the backend keeps none."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Literal

from bridge.annotations import ARRAY_ANNOTATION, DEPENDENCY_ANNOTATION
from bridge.errors import AlreadyRan, BackendRejected, InvalidSpec, JobGone
from bridge.service.jobs import job_refs
from bridge.service.preparation import Prepared
from bridge.service.retries import NO_RETRY, Retry

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, Identity, JobRef, JobStatus
    from bridge.plan import LaunchPlan
    from bridge.records import Records

#: what submit does when the TrainJob's uid already has a finished job on the cluster; "reattach" is "attach"
#: for a TrainJob known to have been sent: a uid nobody knows any more raises JobGone instead of being sent again
IfFinished = Literal["error", "attach", "reattach", "rerun"]


@dataclass(frozen=True)
class Submitted:
    ref: JobRef
    #: the job already existed (this call sent nothing)
    existing: bool
    #: its state when found, for an existing job
    status: JobStatus | None = None


@dataclass(frozen=True)
class Listing:
    """Every job one adapter's identity has on its cluster, read at once (``listing``). A burst of lookups by
    recorded job id (an operator re-attaching thousands of TrainJobs after a restart) is answered from it, one
    backend read for the burst instead of one per group; how long it serves is its keeper's choice."""

    adapter: Adapter
    #: job id -> status, for each listed job that carries a uid
    jobs: Mapping[str, JobStatus]

    def live(self, identity: Identity) -> JobStatus | None:
        """The job *identity* records, where the listing holds it carrying that uid and unfinished: what
        ``Adapter.find`` answers from a recorded id. Anything else (no id, another uid's job, a finished job
        that may have a newer rerun) is for ``find`` to answer."""
        status = self.jobs.get(identity.job_id or "")
        if status is None or status.ref.uid != identity.uid:
            return None
        return None if status.state.finished or status.state.value == "Unknown" else status


def listing(adapter: Adapter, retry: Retry = NO_RETRY) -> Listing | None:
    """One read of every job *adapter*'s identity has, for ``submit_many(listing=...)``; None where the backend's
    listing is not what its lookup by uid reads (``Capabilities.lists_every_job``)."""
    if not adapter.capabilities.lists_every_job:
        return None
    statuses = retry.call(adapter.list_jobs)
    return Listing(adapter, {status.ref.job_id: status for status in statuses})


def _identity(plan: LaunchPlan, job_id: str | None = None) -> Identity:
    from bridge.adapters.base import Identity

    return Identity(plan.uid, plan.name, plan.namespace, job_id)


def submit(prepared: Prepared, *, if_finished: IfFinished = "error", retry: Retry = NO_RETRY,
           on_wait: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> Submitted:
    if prepared.waits_for:
        wait_for_dependency(prepared.adapter, prepared.waits_for, prepared.plan, retry=retry, on_wait=on_wait,
                            sleep=sleep)
        prepared = replace(prepared, waits_for=None)
    return submit_many([prepared], if_finished=if_finished, retry=retry)[0]


def dry_run(prepared: Prepared, *, if_finished: IfFinished = "error", retry: Retry = NO_RETRY) -> Submitted | None:
    """The first half of ``submit``: each artifact submit would send (an array's elements, one by one) is looked
    up by uid as submit looks it up, then the scheduler is asked about it, and nothing is sent; the refusal is
    the one ``submit`` would raise (a job that already ran: ``AlreadyRan``, as *if_finished* says; a uid made
    for this submission is not looked up: nothing carries it). The job
    submit would answer with instead of sending (one of the uid pending or running) is returned. What a dry
    run prints is ``prepared.artifact``, what ``submit`` sends."""
    from bridge.records import Records

    existing: Submitted | None = None
    for element in prepared.elements or (prepared,):
        adapter, plan = element.adapter, element.plan
        records = Records(adapter.cluster.name)
        status = None if prepared.fresh_uid else retry.call(partial(_existing, adapter, records, [plan])).get(plan.uid)
        found = None if status is None else _found_asked(adapter, plan, status, if_finished)
        if found is not None:
            existing = existing or found
            continue
        retry.call(partial(adapter.dry_run, element.artifact))
    return existing


def wait_for_dependency(adapter: Adapter, spec: str, plan: LaunchPlan, *, retry: Retry = NO_RETRY,
                        on_wait: Callable[[str], None] | None = None, poll_seconds: float = 1.0,
                        sleep: Callable[[float], None] = time.sleep) -> None:
    """Block until *spec* (afterok/afterany/afternotok:JOB[:JOB], singleton; items joined by ",") holds on
    *adapter*'s cluster: one batched poll per check. A dependency that can no longer hold (afterok on a job that
    failed) is BackendRejected, and nothing is sent, as Slurm never starts such a job."""
    items = [item.split(":") for item in spec.split(",")]
    ids = [job for kind, *jobs in items if kind != "singleton" for job in jobs]
    told = False
    while True:
        waiting = []
        states = retry.call(lambda: adapter.poll(job_refs(adapter, ids))) if ids else {}
        by_id = {ref.job_id: status for ref, status in states.items()}
        for kind, *jobs in items:
            if kind == "singleton":
                others = [s for s in retry.call(adapter.list_jobs)
                          if s.ref.name == plan.name and s.ref.uid != plan.uid and not s.state.finished]
                waiting += [f"{s.ref.job_id} (same name)" for s in others]
                continue
            for job in jobs:
                status = by_id[job]
                if status.state.value == "Unknown":
                    raise BackendRejected(adapter.backend, f"dependency {kind}:{job}: no such job on cluster "
                                                           f"{adapter.cluster.name}")
                if not status.state.finished:
                    waiting.append(f"{job} ({status.state.value})")
                elif kind == "afterok" and status.state.value != "Succeeded" or \
                        kind == "afternotok" and status.state.value == "Succeeded":
                    raise BackendRejected(adapter.backend, f"dependency {kind}:{job} can never hold: job {job} "
                                                           f"ended {status.state.value}; {plan.name} was not sent")
        if not waiting:
            return
        if on_wait is not None and not told:
            on_wait(f"{plan.name} waits for {', '.join(waiting)} ({spec})")
            told = True
        sleep(poll_seconds)


def submit_array(prepared: Prepared, *, if_finished: IfFinished = "error", retry: Retry = NO_RETRY,
                 poll_seconds: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                 on_wait: Callable[[str], None] | None = None,
                 on_sent: Callable[[Submitted], None] | None = None) -> list[Submitted]:
    """Send a job array's elements in order (each idempotent by its own uid, as ``submit``); with a ``%``
    limit, an element is sent only while fewer than that many sent ones are unfinished (one batched poll per
    check), so the submitting process stays until the last element is sent."""
    adapter = prepared.adapter
    if prepared.waits_for:
        wait_for_dependency(adapter, prepared.waits_for, prepared.plan, retry=retry, on_wait=on_wait, sleep=sleep)
    sent: list[Submitted] = []
    for element in prepared.elements:
        if prepared.array_limit is not None:
            told = False
            while True:
                running = [s.ref for s in sent]
                states = retry.call(partial(adapter.poll, running)) if running else {}
                unfinished = sum(1 for status in states.values() if not status.state.finished)
                if unfinished < prepared.array_limit:
                    break
                if on_wait is not None and not told:
                    on_wait(f"{element.plan.name} waits: {unfinished} elements unfinished, the limit is "
                            f"{prepared.array_limit}")
                    told = True
                sleep(poll_seconds)
        sent.append(submit(element, if_finished=if_finished, retry=retry))
        if on_sent is not None:
            on_sent(sent[-1])
    return sent


def submit_many(batch: Sequence[Prepared], *, if_finished: IfFinished = "error",
                retry: Retry = NO_RETRY, listing: Listing | None = None) -> list[Submitted]:
    """Submit plans bound for one cluster, idempotently by uid, with one lookup for the whole batch.

    A uid whose job is pending or running gets that job back. A uid whose job finished raises ``AlreadyRan``
    (``if_finished="error"``), gets the finished job back (``"attach"``, the operator re-attaching), or
    runs again (``"rerun"``). With ``"reattach"`` (the operator picking up a TrainJob whose status says it was
    sent) a finished job is attached to, and a uid neither the backend nor the record knows raises ``JobGone``:
    its job finished and was forgotten (Slurm's MinJobAge) while nobody watched, and sending it again would run
    it twice. The lookup asks the backend first, then the durable record for jobs the backend no longer lists.
    A *listing* of the cluster's jobs read meanwhile (``listing``) answers the uids whose recorded job it holds
    unfinished; the rest are looked up. Transient failures are retried whole, lookup included, so a retry after
    a send whose answer was lost finds the job instead of sending it twice.
    """
    if not batch:
        return []
    adapter = _one_cluster(batch)
    from bridge.records import Records

    records = Records(adapter.cluster.name)
    results: dict[str, Submitted] = {}

    def attempt() -> list[Submitted]:
        pending = [p for p in batch if p.plan.uid not in results]
        existing = _existing(adapter, records, [p.plan for p in pending],
                             {p.plan.uid: p.recorded_job for p in pending if p.recorded_job},
                             listing if listing is not None and listing.adapter is adapter else None)
        to_send: list[Prepared] = []
        for prepared in pending:
            status = existing.get(prepared.plan.uid)
            if status is None and if_finished == "reattach":
                plan = prepared.plan
                raise JobGone(f"{plan.namespace}/{plan.name} (uid {plan.uid}) was sent to cluster {plan.cluster} "
                              "before, but the cluster no longer knows its job (it finished and was purged while "
                              "no operator watched): its outcome is lost and it is not sent again; delete and "
                              "re-create the TrainJob to run it again")
            found = None if status is None else _found(adapter, prepared.plan, status, if_finished)
            if found is None:
                to_send.append(prepared)
            else:
                results[prepared.plan.uid] = found
        for prepared in to_send:
            results[prepared.plan.uid] = _send(adapter, records, prepared)
        return [results[p.plan.uid] for p in batch]

    return retry.call(attempt)


def _one_cluster(batch: Sequence[Prepared]) -> Adapter:
    """The one adapter a batch goes through; a job that needs ``submit``'s waiting (a dependency the backend
    cannot hold, an array sent element by element) is refused."""
    held = next((p for p in batch if p.waits_for), None)
    if held is not None:
        raise InvalidSpec(f"metadata.annotations[{DEPENDENCY_ANNOTATION}]", held.waits_for,
                          f"cluster {held.adapter.cluster.name} keeps no dependencies: hpcbridge submit waits for "
                          "them, which this path does not do")
    array = next((p for p in batch if p.elements), None)
    if array is not None:
        raise InvalidSpec(f"metadata.annotations[{ARRAY_ANNOTATION}]", array.plan.options.array,
                          f"cluster {array.adapter.cluster.name} has no job arrays: its elements are sent one by one "
                          "(hpcbridge submit), which this path does not do")
    adapter = batch[0].adapter
    if any(p.adapter is not adapter for p in batch):
        raise ValueError("submit_many takes plans for one cluster (one adapter)")
    return adapter


def _found(adapter: Adapter, plan: LaunchPlan, status: JobStatus, if_finished: IfFinished) -> Submitted | None:
    """What submit answers for a uid that already has a job: that job, or None where it is to be sent again
    (``rerun``: a backend with unique names first loses the finished one); AlreadyRan where it may not."""
    found = _found_asked(adapter, plan, status, if_finished)
    if found is None and adapter.capabilities.unique_names:
        adapter.remove(status.ref)
    return found


def _found_asked(adapter: Adapter, plan: LaunchPlan, status: JobStatus,
                 if_finished: IfFinished) -> Submitted | None:
    """``_found`` without its one change (a finished job a rerun removes first): what a dry run answers."""
    if not status.state.finished and status.state.value != "Unknown":
        return Submitted(status.ref, True, status)
    if if_finished in ("attach", "reattach"):
        return Submitted(status.ref, True, status)
    if if_finished == "rerun":
        return None
    what = (f"{status.state.value}" if status.state.value != "Unknown"
            else "which the cluster no longer knows (recorded by this machine)")
    raise AlreadyRan(f"{plan.namespace}/{plan.name} (uid {plan.uid}) already ran on cluster {plan.cluster} "
                     f"as job {status.ref.job_id}, {what}; `hpcbridge status "
                     f"{status.ref.job_id}` shows it; submit --rerun runs it again",
                     status.ref.job_id, status.state.value)


def _send(adapter: Adapter, records: Records, prepared: Prepared) -> Submitted:
    """Send one job and record it (and keep its definition, for ``migrate``) before anyone hears of it."""
    from bridge.records import JobStore, Submission, now

    ref = adapter.submit(prepared.artifact)
    plan = prepared.plan
    records.add([Submission(plan.uid, ref.job_id, plan.name, plan.namespace, now())])
    if prepared.objects:
        JobStore().keep_definition(plan.uid, prepared.definition())
    return Submitted(ref, False)


def _existing(adapter: Adapter, records: Records, plans: Sequence[LaunchPlan],
              last_jobs: Mapping[str, str] | None = None, listing: Listing | None = None) -> dict[str, JobStatus]:
    """Jobs that already carry these uids: the backend's view (where *last_jobs*, uid -> job id, says a uid's
    job was, looked at first: in *listing* where one is given), then the record for what it forgot."""
    identities = [_identity(plan, (last_jobs or {}).get(plan.uid)) for plan in plans]
    found: dict[str, JobStatus] = {}
    if listing is not None:
        found = {identity.uid: status for identity in identities if (status := listing.live(identity)) is not None}
    asked = [identity for identity in identities if identity.uid not in found]
    if asked:
        found.update(adapter.find(asked))
    missing = [plan.uid for plan in plans if plan.uid not in found]
    recorded = records.by_uid(missing) if missing else {}
    if recorded:
        from bridge.adapters.base import Identity

        refs = [adapter.ref(item.job_id, Identity(item.uid, item.name, item.namespace)) for item in recorded.values()]
        for ref, status in adapter.poll(refs).items():
            found[ref.uid] = status
    return found
