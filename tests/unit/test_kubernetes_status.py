"""How a JobSet's state, reason and exit code are read from what the controllers write (shapes as the API
server returns them; the real control plane runs these paths in tests/integration/kubernetes)."""

from __future__ import annotations

import datetime
from types import SimpleNamespace as NS

from bridge.adapters.kubernetes.status import event_time, failed_job_exit_code, live_pods, trainer_steps

MPI_JOBSET = {"spec": {"replicatedJobs": [
    {"name": "node", "template": {"metadata": {}}},
    {"name": "launcher", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}}},
]}}


def _job(jobset: str, rjob: str, message: str | None):
    conditions = [NS(type="Failed", status="True", message=message)] if message else []
    return NS(metadata=NS(labels={"jobset.sigs.k8s.io/jobset-name": jobset,
                                  "jobset.sigs.k8s.io/replicatedjob-name": rjob}),
              status=NS(conditions=conditions))


def test_the_trainer_step_is_the_replicated_job_kubeflow_labels() -> None:
    assert trainer_steps(MPI_JOBSET) == {"launcher"}
    assert trainer_steps({}) == set()


def test_a_failed_jobs_exit_code_prefers_the_trainer_step_and_its_own_jobset() -> None:
    jobs = [_job("a", "node", "Container node for pod a/a-node-0-0-x failed with exit code 1 matching FailJob rule"),
            _job("a", "launcher", "Container node for pod a/a-launcher-0-0-y failed with exit code 7 matching ..."),
            _job("b", "launcher", "Container node for pod a/b-launcher-0-0-z failed with exit code 3 matching ...")]
    assert failed_job_exit_code("a", jobs, {"launcher"}) == 7
    assert failed_job_exit_code("b", jobs, {"launcher"}) == 3
    assert failed_job_exit_code("a", [_job("a", "node", "BackoffLimitExceeded")], {"launcher"}) is None
    assert failed_job_exit_code("c", jobs, set()) is None


def test_an_events_time_is_its_latest_observation() -> None:
    at = datetime.datetime(2026, 12, 5, 1, 0, tzinfo=datetime.UTC)
    later = at + datetime.timedelta(minutes=5)
    core = NS(series=None, last_timestamp=at, event_time=None, first_timestamp=at, metadata=None)
    series = NS(series=NS(last_observed_time=later), last_timestamp=None, event_time=at, first_timestamp=None,
                metadata=None)
    assert event_time(core) == at.timestamp() and event_time(series) == later.timestamp()


def _pod(jobset: str, phase: str | None):
    return NS(metadata=NS(labels={"jobset.sigs.k8s.io/jobset-name": jobset}),
              status=NS(phase=phase) if phase else None)


def test_a_cancelled_jobsets_pods_that_may_still_run_count_as_live() -> None:
    # a pod being deleted keeps phase Running until its container has stopped: a move waits for it
    pods = [_pod("a", "Running"), _pod("a", "Succeeded"), _pod("a", "Failed"), _pod("a", "Pending"),
            _pod("a", None), _pod("b", "Running")]
    assert live_pods(pods, "a") == 3
    assert live_pods(pods, "b") == 1
    assert live_pods([_pod("a", "Failed")], "a") == 0 and live_pods([], "a") == 0


class _Reads:
    """The API calls a poll makes, answered from *jobsets* and *pods* (a pod: its JobSet, its PodScheduled
    reason), and counted."""

    def __init__(self) -> None:
        self.jobsets: list[str] = []
        self.pods: dict[str, str] = {}
        self.calls: list[str] = []

    def list_namespaced_custom_object(self, group, version, namespace, plural, **_):
        self.calls.append(plural)
        return {"items": [{"metadata": {"name": name, "labels": {"hpcbridge.io/uid": name}}, "spec": {},
                           "status": {"replicatedJobsStatus": [{"name": "node", "active": 1}]}}
                          for name in self.jobsets]}

    def list_namespaced_pod(self, namespace, label_selector):
        self.calls.append("pods")
        return NS(items=[NS(metadata=NS(labels={"jobset.sigs.k8s.io/jobset-name": jobset}),
                            status=NS(conditions=[NS(type="PodScheduled", status="False", reason=reason,
                                                     message=f"{jobset}: {reason}")]))
                         for jobset, reason in self.pods.items()])

    def list_namespaced_event(self, namespace, field_selector):
        self.calls.append("events")
        return NS(items=[])


def test_a_long_lived_adapter_reads_why_jobsets_pend_only_when_others_pend_or_the_last_read_is_old(
        monkeypatch) -> None:
    """The operator's adapter polls every cycle: one JobSet list each, and the pods of pending JobSets only when
    a new one pends or PENDING_REASONS_TTL has passed; the reason read stands in between."""
    from bridge.adapters import kubernetes as module
    from bridge.adapters.base import JobRef, JobState
    from tests import builders

    reads, now = _Reads(), [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    adapter = module.KubernetesAdapter(builders.cluster("kubernetes", "k8s"))
    monkeypatch.setattr(adapter, "_custom", lambda: reads)
    monkeypatch.setattr(adapter, "_core", lambda: reads)
    ref_a, ref_b = (JobRef("k8s", "kubernetes", f"team/{name}", name, name) for name in ("a", "b"))
    reads.jobsets, reads.pods = ["a"], {"a": "Unschedulable"}

    def poll(*refs):
        reads.calls.clear()
        return adapter.poll(list(refs)), list(reads.calls)

    statuses, calls = poll(ref_a)
    assert calls == ["jobsets", "pods"]
    assert (statuses[ref_a].state, statuses[ref_a].reason) == (JobState.PENDING, "Unschedulable")
    reads.pods = {"a": "SchedulerError"}  # changed, but not read again yet: the reason read stands
    now[0] += 5
    statuses, calls = poll(ref_a)
    assert calls == ["jobsets"] and statuses[ref_a].reason == "Unschedulable"
    assert statuses[ref_a].message == "a: Unschedulable"
    reads.jobsets, reads.pods["b"] = ["a", "b"], "Unschedulable"  # another JobSet pends: read at once
    statuses, calls = poll(ref_a, ref_b)
    assert calls == ["jobsets", "pods"]
    assert (statuses[ref_a].reason, statuses[ref_b].reason) == ("SchedulerError", "Unschedulable")
    now[0] += module.KubernetesAdapter.PENDING_REASONS_TTL  # the last read is old: read again
    reads.pods = {"b": "Unschedulable"}  # a's pods gone: no reason for it any more
    statuses, calls = poll(ref_a, ref_b)
    assert calls == ["jobsets", "pods", "events"]
    assert (statuses[ref_a].reason, statuses[ref_b].reason) == (None, "Unschedulable")
    now[0] += 1
    statuses, calls = poll(ref_a, ref_b)  # a had no reason at the last read: it still has none, unread
    assert calls == ["jobsets"] and statuses[ref_a].reason is None
    reads.jobsets = []  # nothing pends: nothing kept, so b pending again is read at once
    poll(ref_a, ref_b)
    reads.jobsets = ["b"]
    now[0] += 1
    statuses, calls = poll(ref_b)
    assert calls == ["jobsets", "pods"] and statuses[ref_b].reason == "Unschedulable"
