"""The orchestration layer with faked transports: idempotency, the durable record, retries, error classes.

The real engines run the same code in tests/integration/test_adapter_conformance.py; here a fake backend
lets each rule be shown alone (a job that left the queue, a send whose answer was lost, a flaky backend).
"""

from __future__ import annotations

import errno

import pytest

from bridge import service
from bridge.adapters.base import Identity, JobRef, signal_name
from bridge.adapters.transport import CommandResult
from bridge.errors import AlreadyRan, BackendRejected, BackendUnavailable, InvalidSpec
from bridge.records import Records
from tests.builders import TRAINJOB, cluster
from tests.fakes import FakeBackend, FakeTransport


@pytest.fixture
def prepared(monkeypatch, tmp_path) -> service.Prepared:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    fake = cluster("slurm", "fake")
    monkeypatch.setattr(service.targets, "get_adapter", lambda cluster: FakeBackend(cluster))
    source = service.read_input("-", stdin=TRAINJOB)
    return service.prepare(source, cluster="fake", configured={"fake": fake})


def test_running_job_is_returned_not_sent_again(prepared) -> None:
    first = service.submit(prepared)
    again = service.submit(prepared)
    assert not first.existing and again.existing and again.ref.job_id == first.ref.job_id
    assert prepared.adapter.sent == 1


def test_finished_job_that_left_the_queue_is_found_through_the_record(prepared) -> None:
    backend: FakeBackend = prepared.adapter  # type: ignore[assignment]
    first = service.submit(prepared)
    backend.finish(first.ref.job_id, forget=True)  # squeue forgot it; history (jobcomp) still knows it
    assert backend.find([Identity(prepared.plan.uid, prepared.plan.name)]) == {}
    with pytest.raises(AlreadyRan) as info:
        service.submit(prepared)
    assert info.value.job_id == first.ref.job_id and info.value.state == "Succeeded"
    assert info.value.exit_code == 2 and "--rerun" in str(info.value)
    assert backend.sent == 1
    attached = service.submit(prepared, if_finished="attach")
    assert attached.existing and attached.ref.job_id == first.ref.job_id
    rerun = service.submit(prepared, if_finished="rerun")
    assert not rerun.existing and rerun.ref.job_id != first.ref.job_id and backend.sent == 2
    # the record keeps both runs; the newest one is what the uid means now
    assert Records("fake").by_uid([prepared.plan.uid])[prepared.plan.uid].job_id == rerun.ref.job_id


def test_record_is_written_before_submit_returns_and_names_jobs_for_status(prepared) -> None:
    ref = service.submit(prepared).ref
    item = Records("fake").by_job_id([ref.job_id])[ref.job_id]
    assert (item.uid, item.name, item.namespace) == (prepared.plan.uid, "fake-job", "team")
    (status,) = service.status(prepared.adapter, [ref.job_id])
    assert status.ref.uid == prepared.plan.uid and status.ref.name == "fake-job"


def test_transient_errors_are_retried_with_backoff_then_raised(prepared) -> None:
    backend: FakeBackend = prepared.adapter  # type: ignore[assignment]
    slept: list[float] = []
    told: list[int] = []
    retry = service.Retry(attempts=4, first_delay=0.5, sleep=slept.append,
                          on_retry=lambda exc, attempt, delay: told.append(attempt))
    backend.fail_next = [BackendUnavailable("fake", "down"), BackendUnavailable("fake", "still down")]
    assert not service.submit(prepared, retry=retry).existing
    assert slept == [0.5, 1.0] and told == [1, 2] and backend.sent == 1
    backend.fail_next = [BackendUnavailable("fake", "down")] * 4
    slept.clear()
    with pytest.raises(BackendUnavailable):
        service.status(backend, ["101"], retry=retry)
    assert slept == [0.5, 1.0, 2.0]  # bounded: 4 attempts, 3 waits


def test_permanent_errors_are_not_retried(prepared) -> None:
    backend: FakeBackend = prepared.adapter  # type: ignore[assignment]
    slept: list[float] = []
    backend.fail_next = [BackendRejected("fake", "invalid partition")]
    with pytest.raises(BackendRejected):
        service.submit(prepared, retry=service.Retry(sleep=slept.append))
    assert slept == [] and backend.sent == 0


def test_retry_after_a_lost_answer_finds_the_job_instead_of_sending_it_twice(prepared) -> None:
    backend: FakeBackend = prepared.adapter  # type: ignore[assignment]
    backend.lose_answer = True
    submitted = service.submit(prepared, retry=service.Retry(sleep=lambda _: None))
    assert submitted.existing and backend.sent == 1 and submitted.ref.job_id == "101"


def test_signals_come_from_a_table() -> None:
    assert [signal_name(n) for n in ("TERM", "sigusr1", "SIGKILL", None)] == ["TERM", "USR1", "KILL", None]
    for bad in ("FOO", "SIGSEGV", "__class__", "TERM;id", ""):
        with pytest.raises(InvalidSpec):
            signal_name(bad)


def test_an_input_file_cannot_replace_a_configured_cluster(prepared) -> None:
    configured = {"fake": prepared.adapter.cluster}
    text = TRAINJOB + "---\napiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\nmetadata: {name: fake}\n" \
                      "spec: {type: slurm, defaults: {launchCommand: [evil]}}\n"
    with pytest.raises(InvalidSpec, match="may not replace a configured cluster"):
        service.prepare(service.read_input("-", stdin=text), cluster="fake", configured=configured)


# --- error classes at the backend boundary ----------------------------------------------------------------


def scripted(answers: dict[str, CommandResult]) -> FakeTransport:
    """A transport answering each command by its name (sacct's completion query: ``sacct --completion``)."""
    def answer(argv: tuple[str, ...]) -> CommandResult:
        return answers[" ".join(argv[:2]) if argv[0] == "sacct" and "--completion" in argv else argv[0]]

    return FakeTransport(answer)


def _slurm(transport):
    from bridge.adapters.slurm import SlurmAdapter

    return SlurmAdapter(cluster("slurm", "s"), transport=transport)


def test_slurm_history_lookup_failure_raises_instead_of_reading_as_no_jobs() -> None:
    gone = CommandResult(("squeue",), 1, "", "slurm_load_jobs error: Invalid job id specified")
    adapter = _slurm(scripted({
        "squeue": gone,
        "sacct": CommandResult(("sacct",), 1, "", "sacct: error: Problem talking to the database: Connection refused"),
    }))
    ref = JobRef("s", "slurm", "42", "u", "n")
    with pytest.raises(BackendUnavailable):
        adapter.poll([ref])
    adapter = _slurm(scripted({
        "squeue": gone,
        "sacct": CommandResult(("sacct",), 1, "", "sacct: error: Slurm accounting storage is disabled"),
        "sacct --completion": CommandResult(("sacct",), 1, "", "sacct: error: jobcomp plugin: permission denied"),
    }))
    with pytest.raises(BackendRejected):
        adapter.poll([ref])


def test_flux_python_errors_are_classified_by_errno() -> None:
    from bridge.adapters.flux.client import python_error

    assert isinstance(python_error(OSError(errno.ECONNRESET, "reset"), "submit"), BackendUnavailable)
    assert isinstance(python_error(OSError(errno.ENOENT, "unknown job"), "kill"), BackendRejected)
    assert not isinstance(python_error(OSError(errno.EPERM, "not yours"), "cancel"), BackendUnavailable)


def test_kubernetes_client_errors_are_classified_and_bugs_are_not_swallowed() -> None:
    pytest.importorskip("kubernetes")
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import MaxRetryError

    from bridge.adapters.kubernetes.client import CLIENT_ERRORS, translate

    assert isinstance(translate(ApiException(status=503, reason="unavailable"), "list"), BackendUnavailable)
    assert isinstance(translate(ApiException(status=422, reason="invalid"), "create"), BackendRejected)
    assert isinstance(translate(MaxRetryError(None, "/apis", "refused"), "list"), BackendUnavailable)
    assert not issubclass(TypeError, CLIENT_ERRORS) and not issubclass(KeyError, CLIENT_ERRORS)
