"""A backend job's state as TrainJob status conditions: Kubeflow's own types (Suspended, Complete, Failed, with
the backend's reason) and four of ours (Submitted, Running, BackendUnavailable, Migrated). Pure functions: no kopf, no
API calls.

Kubeflow's printer column shows the last condition's type, so a condition that turns True moves to the end
of the list and one that turns False to the front; one that only changes reason or message keeps its place. At most 8 conditions (the CRD's limit);
there are 7 types.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SUBMITTED, RUNNING, BACKEND_UNAVAILABLE = "Submitted", "Running", "BackendUnavailable"
SUSPENDED, COMPLETE, FAILED = "Suspended", "Complete", "Failed"
#: the TrainJob moved to another cluster (hpcbridge.io/migrate-to); its message says from where and why
MIGRATED = "Migrated"
#: what a TrainJob's final state is read from (Kubeflow: IsTrainJobFinished)
FINISHED_TYPES = (COMPLETE, FAILED)
_MAX_MESSAGE = 32768  # metav1.Condition.message


@dataclass(frozen=True)
class Change:
    """One condition to set; the rest of the list stays."""

    type: str
    status: bool
    reason: str
    message: str = ""


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def apply(conditions: Sequence[dict[str, Any]], changes: Sequence[Change], generation: int | None = None,
          at: str | None = None) -> list[dict[str, Any]]:
    """*conditions* with *changes* applied: lastTransitionTime moves only when the status flips."""
    result = [dict(c) for c in conditions]
    stamp = at or now()
    for change in changes:
        status = "True" if change.status else "False"
        found = next((c for c in result if c.get("type") == change.type), None)
        entry: dict[str, Any] = {"type": change.type, "status": status, "reason": change.reason or change.type,
                 "message": change.message[:_MAX_MESSAGE]}
        if generation is not None:
            entry["observedGeneration"] = generation
        if found is None:
            if not change.status:
                continue  # a condition that never was True is not worth a False entry
            entry["lastTransitionTime"] = stamp
            result.append(entry)
        elif found.get("status") != status:
            entry["lastTransitionTime"] = stamp
            # True: to the end, it is now the state the printer column shows; False: to the front, so a
            # condition that stopped holding (BackendUnavailable after an outage) is never what it shows
            result.remove(found)
            if change.status:
                result.append(entry)
            else:
                result.insert(0, entry)
        else:
            entry["lastTransitionTime"] = found.get("lastTransitionTime") or stamp
            found.clear()
            found.update(entry)
    if len(result) > 8:
        result = result[-8:]
    return result


def finished(conditions: Sequence[dict[str, Any]]) -> str | None:
    """Complete or Failed when one of them is True (the TrainJob is done), else None."""
    for condition in conditions:
        if condition.get("type") in FINISHED_TYPES and condition.get("status") == "True":
            kind: str = condition["type"]
            return kind
    return None


def for_status(state: str, reason: str | None, message: str | None, exit_code: int | None, job: str) -> list[Change]:
    """The changes a backend job's state means; *job* names it ("slurm job 42 on cluster hpc")."""
    detail = message or ""
    if state in ("Pending", "Unknown"):
        waiting = f"{job} is pending" + (f": {reason}" if reason else "") + (f" ({detail})" if detail else "")
        return [Change(SUBMITTED, True, "Submitted", waiting), Change(RUNNING, False, reason or "Pending", waiting)]
    if state in ("Running", "Completing"):
        return [Change(SUBMITTED, True, "Submitted", f"{job}"), Change(SUSPENDED, False, "Resumed", f"{job} runs"),
                Change(RUNNING, True, "Running", f"{job} is running")]
    if state == "Suspended":
        return [Change(RUNNING, False, "Suspended", f"{job} is suspended"),
                Change(SUSPENDED, True, "Suspended", "TrainJob is suspended")]
    if state == "Succeeded":
        return [Change(RUNNING, False, "Completed", f"{job} ended"),
                Change(COMPLETE, True, reason or "Completed", f"{job} succeeded" + (f": {detail}" if detail else ""))]
    # Failed, Cancelled, Timeout: the backend's reason, and the exit code when there is one
    why = {"Cancelled": "Cancelled", "Timeout": "DeadlineExceeded"}.get(state, reason or "Failed")
    code = f" with exit code {exit_code}" if exit_code else ""
    text = f"{job} {state.lower()}{code}" + (f": {detail}" if detail else (f" ({reason})" if reason else ""))
    return [Change(RUNNING, False, state, text), Change(FAILED, True, why, text)]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event for the TrainJob: what `kubectl describe trainjob` lists."""

    reason: str
    message: str
    warning: bool = False


#: states that are one phase to a reader of Events: a job Completing is still the job Running
_PHASE = {"Completing": "Running", "Unknown": "Pending"}


def event_for(previous: tuple[str, str | None] | None, state: str, reason: str | None, exit_code: int | None,
              hosts: Sequence[str], job: str) -> Event | None:
    """The Event a backend transition means, else None: *previous* is the (state, reason) last seen (None: the
    first poll), *job* names the job ("slurm job 42 on cluster hpc"). Queued with the scheduler's reason each
    time that reason changes; Running on its hosts; the end with its exit code. Only the job's id, hosts,
    state, reason and exit code go in: never its environment or the cluster's credentials."""
    before, before_reason = (_PHASE.get(previous[0], previous[0]), previous[1]) if previous else (None, None)
    phase = _PHASE.get(state, state)
    if phase == "Pending":
        if state == "Pending" and reason and (before != "Pending" or before_reason != reason):
            return Event("Queued", f"{job} is queued: {reason}")
        return None
    if phase == before:
        return None
    if phase == "Running":
        return Event("Running", f"{job} is running" + (f" on {', '.join(hosts)}" if hosts else ""))
    if phase == "Suspended":
        return Event("Suspended", f"{job} is suspended")
    code = f" with exit code {exit_code}" if exit_code is not None else ""
    why = f" ({reason})" if reason and phase != "Succeeded" else ""
    ended = {"Cancelled": "was cancelled", "Timeout": "timed out"}.get(phase, phase.lower())
    return Event(phase, f"{job} {ended}{code}{why}", warning=phase != "Succeeded")
