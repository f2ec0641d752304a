"""What the cluster says of a JobSet, read without a client: its state from its conditions and counts, the
exit code its pods or failed Jobs carry, and which warning event explains a pod-less wait."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from bridge.adapters.base import JobState
from bridge.annotations import (
    ANCESTOR_LABEL,
    CANCELLED_ANNOTATION,
    JOBSET_NAME_LABEL,
    QUEUE_LABEL,
    REPLICATED_JOB_LABEL,
)

if TYPE_CHECKING:
    from kubernetes.client import V1Job, V1Pod

#: how the Job controller words a FailJob rule's match (pkg/controller/job/pod_failure_policy.go)
_EXIT_CODE_MESSAGE = re.compile(r"\bfailed with exit code (\d+)\b")


def jobset_state(jobset: dict[str, Any]) -> tuple[JobState, str | None, str | None]:
    """JobSet conditions and replicated-job counts → (state, reason, message)."""
    conditions = {c.get("type"): c for c in (jobset.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"}
    counts = (jobset.get("status") or {}).get("replicatedJobsStatus") or []
    for kind, state in (("Completed", JobState.SUCCEEDED), ("Failed", JobState.FAILED)):
        if kind in conditions:
            failed_initializer = next((c["name"] for c in counts if c.get("name") in _INITIALIZER_JOBS
                                       and (c.get("failed") or 0) > 0), None)
            if state == JobState.FAILED and failed_initializer:
                # the trainer never started: say which initializer, and for what
                return state, "InitializerFailed", (f"the {failed_initializer.split('-')[0]} initializer failed for "
                                                    f"{_storage_uri(jobset, failed_initializer)}")
            return state, conditions[kind].get("reason"), conditions[kind].get("message")
    if ((jobset.get("metadata") or {}).get("annotations") or {}).get(CANCELLED_ANNOTATION) == "true":
        return JobState.CANCELLED, "Cancelled", "cancelled through hpc-bridge (the JobSet is suspended)"
    queue = ((jobset.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    if queue and (jobset.get("spec") or {}).get("suspend"):
        # Kueue holds it suspended until it admits it: waiting in a queue is pending, as Slurm's PD
        return JobState.PENDING, "Queued", f"waiting in Kueue LocalQueue {queue}"
    if "Suspended" in conditions:
        return JobState.SUSPENDED, conditions["Suspended"].get("reason"), conditions["Suspended"].get("message")
    if (jobset.get("spec") or {}).get("suspend"):
        return JobState.SUSPENDED, "Suspended", None
    # "active" also counts pods still waiting for a node: only ready (or finished) pods mean running
    if any((c.get("ready") or 0) > 0 or (c.get("succeeded") or 0) > 0 for c in counts):
        fetching = next((c["name"] for c in counts if c.get("name") in _INITIALIZER_JOBS and (c.get("ready") or 0)),
                        None)
        if fetching:
            return (JobState.RUNNING, "Initializing",
                    f"Initializing ({fetching.split('-')[0]}): {_storage_uri(jobset, fetching)}")
        return JobState.RUNNING, None, None
    return JobState.PENDING, None, None


#: Kubeflow's initializer jobs (and their containers), which run before the trainer's
_INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")


def _storage_uri(jobset: dict[str, Any], job_name: str) -> str:
    """The URI an initializer job fetches: its container's STORAGE_URI in the JobSet."""
    for job in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if job.get("name") != job_name:
            continue
        pod = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
        for container in (pod.get("spec") or {}).get("containers") or []:
            for entry in container.get("env") or []:
                if container.get("name") == job_name and entry.get("name") == "STORAGE_URI":
                    return str(entry.get("value"))
    return "its STORAGE_URI"


def event_time(event: Any) -> float:  # a CoreV1Event or an EventsV1Event
    """When an event last happened: events.k8s.io writers set eventTime (and series), core ones lastTimestamp."""
    import datetime

    when = (event.series.last_observed_time if getattr(event, "series", None) is not None else None) or \
        event.last_timestamp or event.event_time or event.first_timestamp or \
        (event.metadata.creation_timestamp if event.metadata else None)
    return when.timestamp() if isinstance(when, datetime.datetime) else 0.0


def trainer_steps(jobset: dict[str, Any]) -> set[str]:
    """The replicated jobs Kubeflow marks as the trainer step (the ancestor label is on the Job template, so
    Jobs carry it and their pods do not; pods carry the replicated job's name)."""
    return {rjob.get("name") for rjob in ((jobset.get("spec") or {}).get("replicatedJobs") or [])
            if (((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)
            == "trainer"}


def failed_job_exit_code(jobset: str, jobs: list[V1Job], trainer_steps: set[str]) -> int | None:
    """The exit code a failed Job's condition names, the trainer step's first: a podFailurePolicy FailJob rule
    on exit codes words it "... failed with exit code N"."""
    found: list[tuple[bool, int]] = []
    for job in jobs:
        labels = (job.metadata.labels or {}) if job.metadata else {}
        if labels.get(JOBSET_NAME_LABEL) != jobset:
            continue
        for condition in (job.status.conditions or []) if job.status else []:
            if condition.type == "Failed" and condition.status == "True":
                match = _EXIT_CODE_MESSAGE.search(condition.message or "")
                if match:
                    found.append((labels.get(REPLICATED_JOB_LABEL) not in trainer_steps, int(match.group(1))))
    return min(found)[1] if found else None


def created_time(stamp: str | None) -> float:
    """An RFC 3339 creationTimestamp (seconds resolution) as a POSIX time; 0 when absent or unreadable."""
    import datetime

    try:
        return datetime.datetime.fromisoformat((stamp or "").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def pod_exit_code(pods: list[V1Pod], jobset: str, trainer_steps: set[str]) -> int | None:
    """The exit code of a failed JobSet's pods: the trainer step's ``node`` container's first, else the first
    non-zero one of any of its pods."""
    codes: list[tuple[bool, int]] = []
    for pod in pods:
        labels = pod.metadata.labels or {}
        if labels.get(JOBSET_NAME_LABEL) != jobset or not pod.status:
            continue
        for container in pod.status.container_statuses or []:
            terminated = container.state.terminated if container.state else None
            if container.name == "node" and terminated is not None and terminated.exit_code:
                codes.append((labels.get(REPLICATED_JOB_LABEL) not in trainer_steps, terminated.exit_code))
    return min(codes)[1] if codes else None


def live_pods(pods: list[V1Pod], jobset: str) -> int:
    """How many of JobSet *jobset*'s pods may still run its command: those not Succeeded or Failed (a pod being
    deleted runs until its container has stopped)."""
    return sum(1 for pod in pods if (pod.metadata.labels or {}).get(JOBSET_NAME_LABEL) == jobset
               and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed")))


def creation_warning(events: list[Any], name: str, jobset: dict[str, Any]) -> Any | None:
    """The last warning event about JobSet *name* or its Jobs since it was created, if any."""
    spec = jobset.get("spec") or {}
    # a JobSet of this name removed and submitted again: its predecessor's warnings are not about it
    since = created_time((jobset.get("metadata") or {}).get("creationTimestamp"))
    # the JobSet controller names a replicated job's Jobs <jobset>-<replicated job>-<index>
    jobs = {f"{name}-{rjob.get('name')}-{index}" for rjob in spec.get("replicatedJobs") or []
            for index in range(int(rjob.get("replicas") or 1))}
    about = [event for event in events if event.involved_object is not None and (
        (event.involved_object.kind == "JobSet" and event.involved_object.name == name) or
        (event.involved_object.kind == "Job" and event.involved_object.name in jobs)) and
        event_time(event) >= since]
    return max(about, key=event_time) if about else None


def quota_message(workload: dict[str, Any], where: str) -> str:
    """What Kueue says of a queued job's Workload in queue *where*: reserved, or why it waits for quota."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    reserved = conditions.get("QuotaReserved") or {}
    if reserved.get("status") == "True":
        return f"quota reserved in {where}; waiting for admission"
    why = reserved.get("message")
    return f"waiting for quota in {where}" + (f": {why}" if why else "")
