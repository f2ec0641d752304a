"""``hpcbridge migrate`` in the orchestration layer, with fake backends and a fake clock: what is stopped, in
which order, what the target gets, what is refused before anything stops. Real clusters: test_migrate.py."""

from __future__ import annotations

import pytest
import yaml

from bridge import service
from bridge.adapters.base import JobState
from bridge.errors import BackendUnavailable, InvalidSpec
from tests.builders import TRAINJOB, cluster
from tests.fakes import FakeBackend

CHECKPOINTED = TRAINJOB.replace("metadata: {name: fake-job, namespace: team}",
                                "metadata: {name: fake-job, namespace: team, annotations: "
                                "{hpcbridge.io/checkpoint-dir: /shared/ckpt}}")


class Recording(FakeBackend):
    cancels: list = []
    stays_running = False

    def cancel(self, ref, signal=None, grace_seconds=None) -> None:
        self.cancels.append((self.cluster.name, ref.job_id, signal, grace_seconds))
        if not self.stays_running:
            self.jobs[ref.job_id]["state"] = JobState.SUCCEEDED  # it checkpointed and stopped itself


@pytest.fixture
def clusters(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    Recording.cancels = []
    Recording.stays_running = False
    adapters: dict[str, Recording] = {}

    def adapter_for(cluster):
        return adapters.setdefault(cluster.name, Recording(cluster))

    monkeypatch.setattr(service.targets, "get_adapter", adapter_for)
    configured = {name: cluster(name=name) for name in ("a", "b")}
    return configured, adapters


def submit_on_a(configured, text: str = CHECKPOINTED):
    prepared = service.prepare(service.read_input("-", stdin=text), cluster="a", configured=configured)
    return prepared, service.submit(prepared).ref


def test_stop_signal_spelling() -> None:
    assert service.parse_stop_signal("USR1@60") == ("USR1", 60.0)
    assert service.parse_stop_signal("SIGTERM") == ("TERM", 30.0)
    for bad in ("USR1@soon", "NOSUCH@5"):
        with pytest.raises(InvalidSpec):
            service.parse_stop_signal(bad)


def test_the_job_is_stopped_then_run_on_the_target_with_its_checkpoint_and_the_move_is_kept(clusters) -> None:
    configured, adapters = clusters
    first, ref = submit_on_a(configured)
    moved = service.migrate(adapters["a"], ref.job_id, "b", signal="USR1", grace_seconds=60, reason="drain",
                            configured=configured, sleep=lambda _: None)
    assert Recording.cancels == [("a", ref.job_id, "USR1", 60)]
    assert moved.source.state == JobState.SUCCEEDED
    plan = moved.prepared.plan
    assert plan.cluster == "b" and plan.uid == first.plan.uid  # the same TrainJob, now on b
    assert ("HPCBRIDGE_RESUME_FROM", "/shared/ckpt") in [(e.name, e.value) for e in plan.env]
    assert adapters["b"].jobs[moved.submitted.ref.job_id]["uid"] == first.plan.uid
    (move,) = service.history(first.plan.uid)
    assert move["from"] == {"cluster": "a", "job": ref.job_id, "state": "Succeeded", "exitCode": 0}
    assert move["to"] == {"cluster": "b", "job": moved.submitted.ref.job_id}
    assert (move["signal"], move["reason"]) == ("SIGUSR1", "drain")
    # and back: the definition stored with the move's submit carries the checkpoint on
    back = service.migrate(adapters["b"], moved.submitted.ref.job_id, "a", configured=configured,
                           sleep=lambda _: None)
    assert back.prepared.plan.cluster == "a" and len(service.history(first.plan.uid)) == 2
    names = [e.name for e in back.prepared.plan.env]
    assert names.count("HPCBRIDGE_RESUME_FROM") == 1


@pytest.mark.parametrize("text, target, words", [
    (TRAINJOB, "b", "declares no checkpoint directory"),
    (CHECKPOINTED, "a", "already runs on cluster a"),
    (CHECKPOINTED, "nowhere", "no such cluster"),
])
def test_what_cannot_move_is_refused_before_anything_is_stopped(clusters, text, target, words) -> None:
    configured, adapters = clusters
    _, ref = submit_on_a(configured, text)
    with pytest.raises(InvalidSpec, match=words) as info:
        service.migrate(adapters["a"], ref.job_id, target, configured=configured, sleep=lambda _: None)
    assert info.value.exit_code == 2
    assert Recording.cancels == [] and adapters["a"].jobs[ref.job_id]["state"] == JobState.RUNNING


def test_a_job_unknown_here_cannot_be_moved(clusters) -> None:
    configured, adapters = clusters
    with pytest.raises(InvalidSpec, match="no definition of this job on this machine"):
        service.migrate(Recording(configured["a"]), "4242", "b", configured=configured)


def test_a_job_that_does_not_stop_is_not_run_twice(clusters) -> None:
    configured, adapters = clusters
    _, ref = submit_on_a(configured)
    Recording.stays_running = True
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(BackendUnavailable, match="still Running 300s after SIGTERM: not moved"):
        service.migrate(adapters["a"], ref.job_id, "b", configured=configured, clock=lambda: now[0], sleep=sleep)
    assert "b" not in adapters or not adapters["b"].jobs


def test_definition_kept_at_submit_is_the_trainjob_with_its_uid(clusters, tmp_path) -> None:
    configured, _ = clusters
    prepared, _ = submit_on_a(configured)
    from bridge.records import JobStore

    documents = list(yaml.safe_load_all(JobStore().definition(prepared.plan.uid)))
    assert [doc["kind"] for doc in documents] == ["ClusterTrainingRuntime", "TrainJob"]
    assert documents[1]["metadata"]["uid"] == prepared.plan.uid
    assert oct((tmp_path / "hpcbridge" / "jobs" / prepared.plan.uid / "definition.yaml").stat().st_mode & 0o777) == "0o600"
