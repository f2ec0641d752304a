"""The orchestration layer with faked transports: idempotency, the durable record, retries, error classes.

The real engines run the same code in tests/integration/test_adapter_conformance.py; here a fake backend
lets each rule be shown alone (a job that left the queue, a send whose answer was lost, a flaky backend).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence

import pytest

from bridge import service
from bridge.adapters.base import (
    Adapter,
    Artifact,
    ArtifactFile,
    Capabilities,
    Identity,
    JobRef,
    JobState,
    JobStatus,
    signal_name,
)
from bridge.adapters.transport import CommandResult, Transport
from bridge.api.cluster import BridgeCluster
from bridge.errors import AlreadyRan, BackendRejected, BackendUnavailable, InvalidSpec
from bridge.records import Records

TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: plain}
spec: {mlPolicy: {numNodes: 1}}
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: fake-job, namespace: team}
spec: {runtimeRef: {name: plain}, trainer: {command: [train]}}
"""


class FakeBackend(Adapter):
    """A scheduler in memory: jobs, a queue that forgets finished jobs, and scripted failures."""

    backend = "fake"
    capabilities = Capabilities()

    def __init__(self, cluster) -> None:
        super().__init__(cluster)
        self.jobs: dict[str, dict] = {}
        self.queue: set[str] = set()  # what find() still lists (Slurm's squeue before MinJobAge)
        self.sent = 0
        self.fail_next: list[Exception] = []
        self.lose_answer = False
        self.free_nodes = 8  # what capacity() reports free (of 8)

    def render(self, plan) -> Artifact:
        return Artifact("fake", "text", plan, (ArtifactFile("job", plan.name),))

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    def submit(self, artifact: Artifact) -> JobRef:
        self._maybe_fail()
        self.sent += 1
        job_id = str(100 + self.sent)
        self.jobs[job_id] = {"uid": artifact.plan.uid, "name": artifact.plan.name, "state": JobState.RUNNING}
        self.queue.add(job_id)
        if self.lose_answer:
            self.lose_answer = False
            raise BackendUnavailable("fake", "connection reset after the job was accepted")
        return JobRef(self.cluster.name, "fake", job_id, artifact.plan.uid, artifact.plan.name)

    def _status(self, job_id: str, ref: JobRef) -> JobStatus:
        job = self.jobs.get(job_id)
        if job is None:
            return JobStatus(ref, JobState.UNKNOWN, reason="NoRecord")
        return JobStatus(ref, job["state"], exit_code=0 if job["state"] == JobState.SUCCEEDED else None)

    def find(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        self._maybe_fail()
        wanted = {i.uid for i in identities}
        found = {}
        for job_id in sorted(self.queue, key=int):
            job = self.jobs[job_id]
            if job["uid"] in wanted:
                found[job["uid"]] = self._status(job_id, JobRef(self.cluster.name, "fake", job_id, job["uid"],
                                                                job["name"]))
        return found

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        self._maybe_fail()
        return {ref: self._status(ref.job_id, ref) for ref in refs}

    def wait(self, ref: JobRef, timeout: float | None = None) -> JobStatus:
        return self.poll([ref])[ref]

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        self.jobs[ref.job_id]["state"] = JobState.CANCELLED

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        yield ""

    def list_jobs(self) -> list[JobStatus]:
        return []

    def capacity(self, plan):
        from bridge.adapters.base import Capacity

        return Capacity(self.free_nodes, 8, f"fake: {self.free_nodes} of 8 nodes free")

    def check(self) -> str:
        return "fake"

    def finish(self, job_id: str, forget: bool = False) -> None:
        self.jobs[job_id]["state"] = JobState.SUCCEEDED
        if forget:
            self.queue.discard(job_id)


@pytest.fixture
def prepared(monkeypatch, tmp_path) -> service.Prepared:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    cluster = BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                            "metadata": {"name": "fake"}, "spec": {"type": "slurm"}})
    monkeypatch.setattr(service.targets, "get_adapter", lambda cluster: FakeBackend(cluster))
    source = service.read_input("-", stdin=TRAINJOB)
    return service.prepare(source, cluster="fake", configured={"fake": cluster})


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


class ScriptedTransport(Transport):
    def __init__(self, answers: dict[str, CommandResult]) -> None:
        self.answers = answers

    def run(self, argv, stdin=None, timeout=60.0, resend=True) -> CommandResult:
        key = " ".join(argv[:2]) if argv[0] == "sacct" and "--completion" in argv else argv[0]
        return self.answers[key]

    def stream(self, argv, timeout=24 * 3600.0, check=True):
        yield from ()


def _slurm(transport):
    from bridge.adapters.slurm import SlurmAdapter

    cluster = BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                            "metadata": {"name": "s"}, "spec": {"type": "slurm"}})
    return SlurmAdapter(cluster, transport=transport)


def test_slurm_history_lookup_failure_raises_instead_of_reading_as_no_jobs() -> None:
    gone = CommandResult(("squeue",), 1, "", "slurm_load_jobs error: Invalid job id specified")
    adapter = _slurm(ScriptedTransport({
        "squeue": gone,
        "sacct": CommandResult(("sacct",), 1, "", "sacct: error: Problem talking to the database: Connection refused"),
    }))
    ref = JobRef("s", "slurm", "42", "u", "n")
    with pytest.raises(BackendUnavailable):
        adapter.poll([ref])
    adapter = _slurm(ScriptedTransport({
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
