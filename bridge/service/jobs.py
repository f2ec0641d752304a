"""Jobs already sent: references, status, following, cancelling, logs."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge.errors import InvalidSpec
from bridge.service.retries import NO_RETRY, Retry

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, JobRef, JobStatus


def job_refs(adapter: Adapter, job_ids: Sequence[str]) -> list[JobRef]:
    """References for jobs named by backend id, with the uid and name the record kept for them."""
    from bridge.adapters.base import Identity
    from bridge.records import Records

    known = Records(adapter.cluster.name).by_job_id(job_ids)
    refs = []
    for job_id in job_ids:
        item = known.get(job_id)
        refs.append(adapter.ref(job_id, Identity(item.uid, item.name, item.namespace) if item else None))
    return refs


def job_ref(adapter: Adapter, job_id: str, uid: str, name: str, namespace: str) -> JobRef:
    """A reference to a job whose TrainJob identity the caller knows (the operator: from the TrainJob)."""
    from bridge.adapters.base import Identity

    return adapter.ref(job_id, Identity(uid, name, namespace))


def owned_job(adapter: Adapter, uid: str, name: str, namespace: str, retry: Retry = NO_RETRY) -> JobStatus | None:
    """The job the backend holds for the TrainJob *uid*, looked up on the backend by that uid as the adapter's
    identity (a tenant's adapter sees only its own user's jobs): never an id someone wrote on the TrainJob.
    None when the backend has no job for it."""
    from bridge.adapters.base import Identity

    return retry.call(lambda: adapter.find([Identity(uid, name, namespace)])).get(uid)


def status(adapter: Adapter, job_ids: Sequence[str], retry: Retry = NO_RETRY) -> list[JobStatus]:
    refs = job_refs(adapter, job_ids)
    found = retry.call(lambda: adapter.poll(refs))
    return [found[ref] for ref in refs]


def poll(adapter: Adapter, refs: Sequence[JobRef], retry: Retry = NO_RETRY) -> dict[JobRef, JobStatus]:
    """The state of many jobs of one cluster in one batched query (what a sync loop calls each cycle)."""
    return retry.call(lambda: adapter.poll(refs)) if refs else {}


def list_jobs(adapter: Adapter, retry: Retry = NO_RETRY) -> list[JobStatus]:
    return retry.call(adapter.list_jobs)


@dataclass
class Follow:
    """Polls one job until it ends, calling *on_change* on every new (state, reason)."""

    adapter: Adapter
    ref: JobRef
    on_change: Callable[[JobStatus], None] = lambda status: None
    poll_interval: float = 1.0
    retry: Retry = field(default_factory=Retry)
    sleep: Callable[[float], None] = time.sleep

    def run(self) -> JobStatus:
        from bridge.adapters.base import poll_until_finished

        last: tuple[str, str | None] | None = None

        def told(current: JobStatus) -> None:
            nonlocal last
            if (current.state, current.reason) != last:
                self.on_change(current)
                last = (current.state, current.reason)

        return poll_until_finished(lambda: self.retry.call(lambda: self.adapter.poll([self.ref])[self.ref]),
                                   interval=self.poll_interval, on_status=told, sleep=self.sleep)


def exit_code(status: JobStatus) -> int:
    """The process exit code a front end reports for a finished job: the job's own, else 0 or 1."""
    if status.exit_code:
        return status.exit_code
    return 0 if status.state.value == "Succeeded" else 1


def cancel(adapter: Adapter, job_ids: Sequence[str], signal: str | None = None, grace_seconds: float | None = None,
           retry: Retry = NO_RETRY) -> None:
    from bridge.adapters.base import signal_name

    signal_name(signal)  # an unknown signal is refused before any job is touched
    if grace_seconds is not None and grace_seconds < 0:
        raise InvalidSpec("--grace", grace_seconds, "must not be negative")
    for ref in job_refs(adapter, job_ids):
        cancel_ref(adapter, ref, signal, grace_seconds, retry)


def cancel_ref(adapter: Adapter, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None,
               retry: Retry = NO_RETRY) -> None:
    """Cancel one job the caller found (``owned_job``), with the signal and grace of ``cancel``."""
    from bridge.adapters.base import signal_name

    name = signal_name(signal)
    retry.call(lambda: adapter.cancel(ref, signal=name, grace_seconds=grace_seconds))


def stop_and_remove(adapter: Adapter, ref: JobRef, retry: Retry = NO_RETRY) -> None:
    """Cancel a job and remove what submitting it created (a JobSet and its Secret), for a TrainJob that is
    deleted: nothing of it stays running or stored on the cluster. Backends that keep no objects only cancel."""
    status = retry.call(lambda: adapter.poll([ref])[ref])
    if not status.state.finished and status.state.value != "Unknown":
        retry.call(lambda: adapter.cancel(ref))
    if adapter.capabilities.unique_names:
        retry.call(lambda: adapter.remove(ref))


def status_documents(statuses: Iterable[JobStatus]) -> list[dict[str, Any]]:
    """Each job's status as ``hpcbridge status -o json|yaml`` reports it, with where it ran before and why it
    moved (its history, which migrate keeps) where it has one."""
    from bridge.records import JobStore

    documents: list[dict[str, Any]] = []
    for s in statuses:
        moves = JobStore().history(s.ref.uid) if s.ref.uid else []
        documents.append({"job": s.ref.job_id, "name": s.ref.name, "uid": s.ref.uid, "state": s.state.value,
                          "exitCode": s.exit_code, "reason": s.reason, "nodes": ",".join(s.nodes),
                          **({"message": s.message} if s.message else {}), **({"history": moves} if moves else {})})
    return documents


def logs(adapter: Adapter, job_id: str, follow: bool = False) -> Iterator[str]:
    (ref,) = job_refs(adapter, [job_id])
    return adapter.logs(ref, follow=follow)


def journal(adapter: Adapter) -> Generator[str | None, None, None] | None:
    """The backend's event journal, where it has one (``Adapter.changes``): the ids of jobs whose state just
    changed, for a sync loop to poll at once; None where jobs are only polled."""
    return adapter.changes()
