"""Job arrays where the backend has none: the spec as its indices, each element's plan and variables, and the
``%`` limit kept while the elements are sent (fake backend, fake clock). Real engines:
tests/integration/test_arrays_anywhere.py, with Slurm's own arrays as the oracle."""

from __future__ import annotations

import pytest

from bridge import service
from bridge.adapters.base import JobState
from bridge.errors import BackendRejected, InvalidSpec
from bridge.plan import expand_array
from tests.builders import TRAINJOB, cluster
from tests.fakes import FakeBackend

ARRAY = TRAINJOB.replace("metadata: {name: fake-job, namespace: team}",
                         "metadata: {name: fake-job, namespace: team, annotations: {hpcbridge.io/array: '1-7:3,10%2'}}")


def test_array_specs_expand_as_slurm_reads_them() -> None:
    assert expand_array("0-15:4") == ([0, 4, 8, 12], None, 4)
    assert expand_array("1,3,5-7%2") == ([1, 3, 5, 6, 7], 2, 1)
    assert expand_array("3,1,3") == ([3, 1], None, 1)  # an index given twice is one element
    with pytest.raises(InvalidSpec, match="more than 1000 elements"):
        expand_array("0-5000")


@pytest.fixture
def array(monkeypatch, tmp_path) -> service.Prepared:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    fake = cluster("slurm", "fake")
    backend = FakeBackend(fake)
    monkeypatch.setattr(service.targets, "get_adapter", lambda cluster: backend)
    return service.prepare(service.read_input("-", stdin=ARRAY), cluster="fake", configured={"fake": fake})


def test_each_element_is_a_job_of_its_own_with_slurms_array_variables(array) -> None:
    assert [e.plan.name for e in array.elements] == ["fake-job-1", "fake-job-4", "fake-job-7", "fake-job-10"]
    assert len({e.plan.uid for e in array.elements}) == 4 and array.plan.uid not in {e.plan.uid for e in array.elements}
    env = dict((entry.name, entry.value) for entry in array.elements[1].plan.env)
    assert {k: v for k, v in env.items() if k.startswith("SLURM_ARRAY_")} == {
        "SLURM_ARRAY_JOB_ID": array.plan.uid, "SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "10", "SLURM_ARRAY_TASK_STEP": "1"}
    assert all(e.plan.options.array is None and e.plan.options.slurm_job_name == "fake-job" for e in array.elements)
    assert len(array.artifact.files) == 4 and array.array_limit == 2
    assert "array 1-7:3,10%2: 4 jobs on fake, one per element (fake-job-1 …), at most 2 unfinished at once" in \
        array.notes


def test_no_more_than_the_limit_are_unfinished_while_elements_are_sent(array) -> None:
    backend = array.adapter
    waits: list[str] = []
    log: list[tuple[int, int]] = []  # (elements sent, unfinished) at each wait

    def sleep(_seconds: float) -> None:
        unfinished = [job_id for job_id, job in backend.jobs.items() if job["state"] == JobState.RUNNING]
        log.append((len(backend.jobs), len(unfinished)))
        backend.finish(sorted(unfinished, key=int)[0])  # the oldest element ends while the next one waits

    sent = service.submit_array(array, sleep=sleep, on_wait=waits.append)
    assert [s.ref.name for s in sent] == ["fake-job-1", "fake-job-4", "fake-job-7", "fake-job-10"]
    assert log == [(2, 2), (3, 2)] and len(waits) == 2
    assert waits[0] == "fake-job-7 waits: 2 elements unfinished, the limit is 2"
    # sent again: every element is found by its uid, nothing is sent twice
    again = service.submit_array(array, if_finished="attach", sleep=sleep)
    assert all(s.existing for s in again) and backend.sent == 4


def test_the_batched_path_refuses_an_array_it_cannot_send_element_by_element(array) -> None:
    with pytest.raises(InvalidSpec, match="has no job arrays: its elements are sent one by one"):
        service.submit(array)


DEPENDENT = TRAINJOB.replace("metadata: {name: fake-job, namespace: team}",
                             "metadata: {name: later, namespace: team, annotations: {hpcbridge.io/dependency: "
                             "'afterok:101,afterany:102'}}")


@pytest.fixture
def kept(monkeypatch, tmp_path):
    """A backend that keeps no dependencies (as the local cluster and Kubernetes), with jobs 101 and 102."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    local = cluster("local", "k")
    backend = FakeBackend(local)
    for job_id in ("101", "102"):
        backend.jobs[job_id] = {"uid": f"u{job_id}", "name": f"j{job_id}", "state": JobState.RUNNING}
    backend.sent = 2
    monkeypatch.setattr(service.targets, "get_adapter", lambda cluster: backend)
    return backend, local


def test_a_dependency_the_backend_cannot_hold_is_kept_by_ordered_creation(kept) -> None:
    backend, cluster = kept
    prepared = service.prepare(service.read_input("-", stdin=DEPENDENT), cluster="k", configured={"k": cluster})
    assert prepared.waits_for == "afterok:101,afterany:102" and prepared.plan.options.dependency is None
    told: list[str] = []
    ends = iter([("101", JobState.SUCCEEDED), ("102", JobState.FAILED)])

    def sleep(_seconds: float) -> None:  # one job ends per check
        job_id, state = next(ends)
        backend.jobs[job_id]["state"] = state
        assert len(backend.jobs) == 2  # nothing sent while waiting

    submitted = service.submit(prepared, on_wait=told.append, sleep=sleep)
    assert submitted.ref.job_id == "103" and backend.jobs["103"]["name"] == "later"
    assert told == ["later waits for 101 (Running), 102 (Running) (afterok:101,afterany:102)"]


def test_a_dependency_that_can_never_hold_sends_nothing(kept) -> None:
    backend, cluster = kept
    backend.jobs["101"]["state"] = JobState.FAILED
    backend.jobs["102"]["state"] = JobState.SUCCEEDED
    prepared = service.prepare(service.read_input("-", stdin=DEPENDENT), cluster="k", configured={"k": cluster})
    with pytest.raises(BackendRejected, match="dependency afterok:101 can never hold: job 101 ended Failed"):
        service.submit(prepared, sleep=lambda _: None)
    assert set(backend.jobs) == {"101", "102"}
    with pytest.raises(InvalidSpec, match="keeps no dependencies"):
        service.submit_many([prepared])  # the operator's path does not wait


def test_kept_dependencies_name_the_backends_own_ids() -> None:
    for value, ok in (("afterok:default/train-1:ns/other", True), ("afterany:3f2a-77", True),
                      ("singleton", True), ("after:5", False), ("afterok:a?afterany:b", False)):
        text = DEPENDENT.replace("afterok:101,afterany:102", value)
        local = cluster("local", "k")
        if ok:
            assert service.prepare(service.read_input("-", stdin=text), cluster="k",
                                   configured={"k": local}).waits_for == value
        else:
            with pytest.raises(InvalidSpec, match="not a dependency like afterok:JOB"):
                service.prepare(service.read_input("-", stdin=text), cluster="k", configured={"k": local})
