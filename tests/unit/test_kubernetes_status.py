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
