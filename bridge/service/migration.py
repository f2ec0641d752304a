"""Moving a job to another cluster: stop it, wait until it has ended, run its TrainJob there resuming from its
checkpoint; each move goes into the job's history."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.annotations import CHECKPOINT_ANNOTATION
from bridge.errors import BackendUnavailable, InvalidSpec
from bridge.service.inputs import read_input
from bridge.service.jobs import job_refs
from bridge.service.preparation import Prepared, prepare
from bridge.service.retries import NO_RETRY, Retry
from bridge.service.submission import Submitted, submit

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, JobRef, JobStatus
    from bridge.api.cluster import BridgeCluster


#: where a migrated job finds the checkpoint to resume from (the annotation CHECKPOINT_ANNOTATION declares it)
RESUME_ENV = "HPCBRIDGE_RESUME_FROM"


def parse_stop_signal(text: str) -> tuple[str, float]:
    """``USR1@60`` (Slurm's --signal spelling: the signal, then the seconds it gets before the hard stop) →
    ("USR1", 60.0); a bare signal gets 30 s."""
    from bridge.adapters.base import signal_name

    name, _, grace = text.partition("@")
    if grace and not grace.isdigit():
        raise InvalidSpec("--signal", text, "write SIGNAL@SECONDS, e.g. USR1@60")
    return signal_name(name) or "TERM", float(grace) if grace else 30.0


@dataclass(frozen=True)
class Moved:
    """A job moved: where it ran, how it ended there, and where it runs now."""

    source: JobStatus
    submitted: Submitted
    prepared: Prepared
    move: dict[str, Any]


def migrate(adapter: Adapter, job_id: str, target: str, *, signal: str = "TERM", grace_seconds: float = 30.0,
            reason: str = "", configured: Mapping[str, BridgeCluster] | None = None, wait_seconds: float = 300.0,
            retry: Retry = NO_RETRY, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> Moved:
    """Stop job *job_id* (*signal*, then the hard stop after *grace_seconds*), wait until it has ended, and run
    its TrainJob again on cluster *target* with HPCBRIDGE_RESUME_FROM set to its declared checkpoint directory
    (annotation hpcbridge.io/checkpoint-dir); the move goes into the job's history. The job keeps its uid."""
    import yaml

    from bridge.records import JobStore

    (ref,) = job_refs(adapter, [job_id])
    store = JobStore()
    text = store.definition(ref.uid) if ref.uid else None
    if text is None:
        raise InvalidSpec("JOB", job_id, f"no definition of this job on this machine (cluster {adapter.cluster.name}): "
                                         "only jobs submitted from here with this hpc-bridge can be moved")
    documents = list(yaml.safe_load_all(text))
    add_resume_env(next(doc for doc in documents if doc.get("kind") == "TrainJob"), job_id)
    source = read_input("-", stdin=yaml.safe_dump_all(documents, sort_keys=False))
    # refused here: nothing was stopped yet
    prepared = prepare(source, cluster=target, configured=configured, cluster_field="--to")
    if prepared.plan.cluster == adapter.cluster.name:
        raise InvalidSpec("--to", target, f"job {job_id} already runs on cluster {target}")
    moved = move(adapter, ref, prepared, signal=signal, grace_seconds=grace_seconds, reason=reason,
                 wait_seconds=wait_seconds, retry=retry, clock=clock, sleep=sleep)
    store.add_move(ref.uid, moved.move)
    return moved


def move(adapter: Adapter, ref: JobRef, prepared: Prepared, *, signal: str = "TERM", grace_seconds: float = 30.0,
         reason: str = "", wait_seconds: float = 300.0, retry: Retry = NO_RETRY,
         send: Callable[[Prepared], Submitted] | None = None, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> Moved:
    """The move of job *ref* on *adapter*, once its target took the TrainJob (*prepared*, with
    ``add_resume_env``): stop the job and wait until it has ended (``stop_to_move``), send *prepared* again under
    its uid, and the entry for its history, which the caller keeps where its history lives (``migrate``: this
    machine's record; the operator: the TrainJob). *send* sends it (the operator: its group commit, which runs it
    again as ``if_finished="rerun"`` does); by default ``submit``."""
    status, stopped_by = stop_to_move(adapter, ref, signal, grace_seconds, wait_seconds=wait_seconds, retry=retry,
                                      clock=clock, sleep=sleep)
    submitted = send(prepared) if send is not None else submit(prepared, if_finished="rerun", retry=retry)
    record = move_record(status, stopped_by, prepared.plan.cluster, submitted.ref.job_id, reason)
    return Moved(status, submitted, prepared, record)


def add_resume_env(trainjob: dict[str, Any], job_id: str) -> None:
    """HPCBRIDGE_RESUME_FROM = the TrainJob's declared checkpoint directory, in its trainer's environment (the
    TrainJob as a wire document, changed in place); InvalidSpec where it declares none."""
    checkpoint = ((trainjob.get("metadata") or {}).get("annotations") or {}).get(CHECKPOINT_ANNOTATION)
    if not checkpoint:
        raise InvalidSpec(f"metadata.annotations[{CHECKPOINT_ANNOTATION}]", None,
                          f"job {job_id} declares no checkpoint directory to resume from; a moved job would start "
                          "over")
    trainer = trainjob.setdefault("spec", {}).setdefault("trainer", {})
    env = [entry for entry in trainer.get("env") or [] if entry.get("name") != RESUME_ENV]
    trainer["env"] = [*env, {"name": RESUME_ENV, "value": checkpoint}]


def stop_to_move(adapter: Adapter, ref: JobRef, signal: str, grace_seconds: float, *, wait_seconds: float = 300.0,
                 retry: Retry = NO_RETRY, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[JobStatus, str | None]:
    """Stop a job that is to run elsewhere and wait until it has ended: its final status, and the signal that
    stopped it (None: it had ended already). BackendUnavailable when it has not ended after *wait_seconds*:
    then it must not run twice, so nothing else happens."""
    from bridge.adapters.base import poll_until_finished, signal_name

    status = retry.call(lambda: adapter.poll([ref])[ref])
    if status.state.finished or status.state.value == "Unknown":
        return status, None
    stopped_by = signal_name(signal)
    retry.call(lambda: adapter.cancel(ref, signal=stopped_by, grace_seconds=grace_seconds))
    status = poll_until_finished(lambda: retry.call(lambda: adapter.poll([ref])[ref]), interval=0.5,
                                 timeout=wait_seconds, clock=clock, sleep=sleep)
    if not status.state.finished:
        raise BackendUnavailable(adapter.backend, f"job {ref.job_id} still {status.state.value} "
                                 f"{wait_seconds:g}s after SIG{stopped_by}: not moved; try again")
    return status, stopped_by


def move_record(source: JobStatus, stopped_by: str | None, target: str, job_id: str, reason: str) -> dict[str, Any]:
    """One entry of a job's history of moves."""
    from bridge.records import now

    return {"at": now(), "from": {"cluster": source.ref.cluster, "job": source.ref.job_id,
                                  "state": source.state.value, "exitCode": source.exit_code},
            "to": {"cluster": target, "job": job_id},
            "signal": f"SIG{stopped_by}" if stopped_by else None, "reason": reason or None}


def history(uid: str) -> list[dict[str, Any]]:
    from bridge.records import JobStore

    return JobStore().history(uid) if uid else []
