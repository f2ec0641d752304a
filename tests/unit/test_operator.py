"""The operator's logic without an API server: conditions from backend states, and a cluster's sync loop
through an outage (the real API server, Slurm and kubelet pods: tests/integration/kubernetes/test_operator.py)."""

from __future__ import annotations

from bridge.adapters.base import JobRef, JobState, JobStatus
from bridge.errors import BackendUnavailable
from bridge.operator import conditions as cond
from bridge.operator.sync import ClusterSync, Timing, Tracked


def test_a_condition_turning_true_moves_last_and_keeps_its_time_while_unchanged() -> None:
    first = cond.apply([], [cond.Change("Submitted", True, "Submitted", "as job 1")], at="T1")
    assert first == [{"type": "Submitted", "status": "True", "reason": "Submitted", "message": "as job 1",
                      "lastTransitionTime": "T1"}]
    # a False condition that never was True is not written
    assert cond.apply(first, [cond.Change("Running", False, "Pending")], at="T2") == first
    running = cond.apply(first, [cond.Change("Running", True, "Running", "runs")], at="T2")
    assert [c["type"] for c in running] == ["Submitted", "Running"]
    same = cond.apply(running, [cond.Change("Submitted", True, "Submitted", "as job 1 (again)")], at="T3")
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["message"] == "as job 1 (again)"
    done = cond.apply(running, cond.for_status("Succeeded", None, None, 0, "slurm job 1"), at="T4")
    assert [(c["type"], c["status"]) for c in done] == [("Running", "False"), ("Submitted", "True"),
                                                         ("Complete", "True")]
    assert cond.finished(done) == "Complete" and cond.finished(running) is None


def test_backend_states_map_to_kubeflow_conditions() -> None:
    failed = cond.for_status("Failed", "NonZeroExitCode", None, 7, "slurm job 9 on cluster hpc")
    assert failed[-1] == cond.Change("Failed", True, "NonZeroExitCode",
                                     "slurm job 9 on cluster hpc failed with exit code 7 (NonZeroExitCode)")
    assert cond.for_status("Timeout", "TimeLimit", None, None, "j")[-1].reason == "DeadlineExceeded"
    assert cond.for_status("Cancelled", None, None, None, "j")[-1].reason == "Cancelled"
    assert cond.for_status("Suspended", None, None, None, "j")[-1] == cond.Change("Suspended", True, "Suspended",
                                                                                  "TrainJob is suspended")
    pending = cond.for_status("Pending", "Resources", None, None, "j")
    assert pending[-1] == cond.Change("Running", False, "Resources", "j is pending: Resources")


class FakeApi:
    def __init__(self) -> None:
        self.written: list[tuple[str, list[dict]]] = []
        self.events: list[tuple[str, str, bool]] = []

    def write_conditions(self, namespace, name, uid, conditions) -> None:
        self.written.append((name, conditions))

    def event(self, namespace, name, uid, reason, message, warning=False) -> None:
        self.events.append((name, reason, warning))


class FakeAdapter:
    backend = "slurm"

    def __init__(self) -> None:
        self.states: dict[str, JobState] = {}
        self.down = False
        self.polls = 0

    def poll(self, refs):
        self.polls += 1
        if self.down:
            raise BackendUnavailable("slurm", "slurmctld: connection refused")
        return {ref: JobStatus(ref, self.states[ref.job_id]) for ref in refs}

    def changes(self):
        return None

    def close(self) -> None:
        pass


def test_a_sync_starts_no_thread_until_started() -> None:
    sync = ClusterSync("hpc", FakeAdapter(), FakeApi(), Timing(fast=60, slow=60, outage_retry=60))
    assert sync.thread.ident is None and sync.watcher.ident is None  # built, not running
    sync.start()
    try:
        assert sync.thread.ident is not None and sync.watcher.ident is not None
    finally:
        sync.stop()
        sync.thread.join(timeout=5)
    # the reconciler starts the sync it makes for a cluster
    from bridge.operator.reconciler import Reconciler

    reconciler = Reconciler(FakeApi())
    try:
        made = reconciler._sync("hpc", FakeAdapter())
        assert made.thread.ident is not None and made.watcher.ident is not None
    finally:
        reconciler.shutdown()


def test_trainjobs_followed_in_a_row_wake_no_back_to_back_cycles() -> None:
    """A restart follows thousands of TrainJobs in a row, each waking the loop: its cycles (each as long as
    the whole queue's listing) still take at most ``busy_share`` of its time, leaving the rest to the handlers
    that follow them."""
    import threading
    import time

    class SlowAdapter(FakeAdapter):
        def __init__(self) -> None:
            super().__init__()
            self.spans: list[tuple[float, float]] = []

        def poll(self, refs):
            started = time.monotonic()
            time.sleep(0.05)
            found = {ref: JobStatus(ref, JobState.PENDING) for ref in refs}
            self.spans.append((started, time.monotonic()))
            return found

    adapter = SlowAdapter()
    sync = ClusterSync("hpc", adapter, FakeApi(), Timing(fast=60, slow=60, outage_retry=60, busy_share=0.25))
    sync.start()
    stop = threading.Event()

    def follow() -> None:  # as kopf's handlers do on a restart: one TrainJob after another, each a wake
        index = 0
        while not stop.is_set():
            sync.track(Tracked("ns", f"job-{index}", f"uid-{index}",
                               JobRef("hpc", "slurm", str(index), f"uid-{index}", f"job-{index}"), []))
            index += 1
            time.sleep(0.001)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        deadline = time.monotonic() + 60
        while len(adapter.spans) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        follower.join()
        sync.stop()
        sync.thread.join(timeout=10)
        sync.views.shutdown()
    spans = adapter.spans
    assert len(spans) >= 5
    # each cycle's next one starts no sooner than three of its lengths after it ended (a share of 1/4)
    for (start, end), (next_start, _) in zip(spans, spans[1:], strict=False):
        assert next_start - end >= 3 * (end - start)


def test_one_batched_poll_per_cycle_and_an_outage_marks_but_never_fails_jobs() -> None:
    api, adapter = FakeApi(), FakeAdapter()
    sync = ClusterSync("hpc", adapter, api, Timing(fast=60, slow=60, outage_retry=60))  # not started: driven here
    items = [Tracked("ns", f"job-{i}", f"uid-{i}", JobRef("hpc", "slurm", str(i), f"uid-{i}", f"job-{i}"), [])
             for i in range(3)]
    for item in items:
        adapter.states[item.ref.job_id] = JobState.RUNNING
        sync.tracked[item.uid] = item
    assert sync.cycle(items) is True and adapter.polls == 1
    assert sync.views.settle(timeout=10)
    # written side by side: in any order
    assert sorted(e for e in api.events if e[1] == "Running") == [(f"job-{i}", "Running", False) for i in range(3)]
    assert sync.cycle(items) is False and adapter.polls == 2  # nothing changed: nothing written
    written = len(api.written)
    adapter.down = True
    sync._outage(items, "slurm unavailable: slurmctld: connection refused")
    sync._outage(items, "slurm unavailable: slurmctld: connection refused")  # reported once per outage
    assert len(api.written) == written + 3
    assert all(not item.done and cond.finished(item.conditions) is None for item in items)
    assert [c["type"] for c in items[0].conditions][-1] == "BackendUnavailable"
    adapter.down = False
    adapter.states["0"] = JobState.SUCCEEDED
    assert sync.cycle(items) is True
    assert items[1].conditions[0]["type"] == "BackendUnavailable" and items[1].conditions[0]["status"] == "False"
    assert items[1].conditions[-1]["type"] == "Running"  # what kubectl's State column shows again
    assert items[0].done and cond.finished(items[0].conditions) == "Complete"
    assert not items[1].done
    # suspended (no longer followed) while a poll was out: what that poll said is not written
    sync.forget(items[1].uid)
    adapter.states["1"] = JobState.CANCELLED
    before = list(items[1].conditions)
    sync.cycle(items)
    assert items[1].conditions == before and cond.finished(before) is None


def test_a_re_attached_job_as_its_conditions_show_it_gets_no_second_event_and_one_that_moved_does() -> None:
    """After a restart every TrainJob is followed anew: its first poll makes no Event where the TrainJob's
    conditions already show that state (the operator before made it); a state reached while none ran does."""
    adapter = FakeAdapter()
    refs = {name: JobRef("hpc", "slurm", job, f"u-{name}", name) for name, job in (("same", "1"), ("moved", "2"),
                                                                                   ("fresh", "3"))}
    adapter.states.update({"1": JobState.RUNNING, "2": JobState.RUNNING, "3": JobState.RUNNING})
    earlier, api = ClusterSync("hpc", adapter, FakeApi(), Timing(fast=60, slow=60, outage_retry=60)), FakeApi()
    shown = {name: Tracked("ns", name, ref.uid, ref, []) for name, ref in refs.items()}
    earlier.tracked.update({item.uid: item for item in shown.values()})
    earlier.cycle(list(shown.values()))  # the operator before the restart: Running, each with its Event
    assert earlier.views.settle(timeout=10) and len(earlier.api.events) == 3
    adapter.states["2"] = JobState.SUCCEEDED  # while no operator ran
    sync = ClusterSync("hpc", adapter, api, Timing(fast=60, slow=60, outage_retry=60))
    items = {name: Tracked("ns", name, ref.uid, ref, list(shown[name].conditions), attached=name != "fresh")
             for name, ref in refs.items()}  # "fresh": followed as a job it just sent
    sync.tracked.update({item.uid: item for item in items.values()})
    assert sync.cycle(list(items.values())) is True
    assert sync.views.settle(timeout=10)
    assert sorted(api.events) == [("fresh", "Running", False), ("moved", "Succeeded", False)]
    adapter.states["1"] = JobState.FAILED  # after the first poll, every transition has its Event as before
    sync.cycle(list(items.values()))
    assert sync.views.settle(timeout=10) and api.events[-1] == ("same", "Failed", True)


def test_views_never_hold_up_the_next_cycles_statuses_and_keep_each_trainjobs_order() -> None:
    """A cycle ends once its conditions are written: while the Events of one cycle cannot be written yet (an
    API server slow with a burst of them), the next cycle writes its statuses; each TrainJob's Events then come
    in the order of its transitions."""
    import threading

    class SlowEvents(FakeApi):
        def __init__(self) -> None:
            super().__init__()
            self.gate = threading.Event()

        def event(self, namespace, name, uid, reason, message, warning=False) -> None:
            assert self.gate.wait(30)
            super().event(namespace, name, uid, reason, message, warning)

    api, adapter = SlowEvents(), FakeAdapter()
    sync = ClusterSync("hpc", adapter, api, Timing(fast=60, slow=60, outage_retry=60))
    items = [Tracked("ns", f"job-{i}", f"uid-{i}", JobRef("hpc", "slurm", str(i), f"uid-{i}", f"job-{i}"), [])
             for i in range(4)]
    for item in items:
        adapter.states[item.ref.job_id] = JobState.RUNNING
        sync.tracked[item.uid] = item
    cycles = threading.Thread(target=lambda: [sync.cycle(items), adapter.states.update(
        {item.ref.job_id: JobState.SUCCEEDED for item in items}), sync.cycle(items)])
    cycles.start()
    cycles.join(timeout=10)
    assert not cycles.is_alive(), "a cycle waited for the Events of the one before"
    assert all(cond.finished(item.conditions) == "Complete" for item in items) and not api.events
    api.gate.set()
    assert sync.views.settle(timeout=10)
    for item in items:
        assert [reason for name, reason, _ in api.events if name == item.name] == ["Running", "Succeeded"]
    sync.views.shutdown()


def test_metrics_are_prometheus_text() -> None:
    from bridge.operator.metrics import Metrics

    metrics = Metrics(clusters=lambda: {"hpc", 'we"ird'})  # configured BridgeClusters: labels name only those
    metrics.submission("hpc", "submitted")
    metrics.submission("hpc", "submitted")
    metrics.backend_error('we"ird')
    metrics.cycle("hpc", 0.03)
    metrics.cycle("hpc", 7.0)
    metrics.states = lambda: {("hpc", "Running"): 3}
    text = metrics.render()
    assert 'hpcbridge_submissions_total{cluster="hpc",result="submitted"} 2' in text
    assert 'hpcbridge_backend_errors_total{cluster="we\\"ird"} 1' in text
    assert 'hpcbridge_sync_cycle_seconds_bucket{cluster="hpc",le="0.05"} 1' in text
    assert 'hpcbridge_sync_cycle_seconds_bucket{cluster="hpc",le="10.0"} 2' in text
    assert 'hpcbridge_sync_cycle_seconds_bucket{cluster="hpc",le="+Inf"} 2' in text
    assert 'hpcbridge_sync_cycle_seconds_count{cluster="hpc"} 2' in text
    assert 'hpcbridge_trainjobs{cluster="hpc",state="Running"} 3' in text
    assert text.endswith("\n") and all(line.startswith(("#", "hpcbridge_")) for line in text.splitlines())


class FakeBatchAdapter:
    """Submissions for the Submitter: ``find`` knows what ``submit`` sent; uids in ``refuse`` are refused."""

    backend = "slurm"

    def __init__(self, refuse: set[str] = frozenset()) -> None:
        import threading
        from types import SimpleNamespace

        self.cluster = SimpleNamespace(name="hpc")
        self.capabilities = SimpleNamespace(unique_names=False)
        self.refuse, self.sent, self.finds = refuse, {}, []
        self.gate = threading.Event()
        self.gate.set()

    def find(self, identities):
        self.finds.append(sorted(i.uid for i in identities))
        return {i.uid: JobStatus(self.sent[i.uid], JobState.PENDING) for i in identities if i.uid in self.sent}

    def submit(self, artifact):
        from bridge.errors import BackendRejected

        self.gate.wait(10)
        uid = artifact.uid
        if uid in self.refuse:
            raise BackendRejected("slurm", f"sbatch: error: invalid partition for {uid}")
        self.sent[uid] = JobRef("hpc", "slurm", str(100 + len(self.sent)), uid, uid)
        return self.sent[uid]


def _prepared(adapter, uid: str):
    from types import SimpleNamespace

    from bridge.service import Prepared

    plan = SimpleNamespace(uid=uid, name=uid, namespace="ns", cluster="hpc")
    return Prepared(adapter, plan, SimpleNamespace(uid=uid, plan=plan))


def test_submissions_arriving_together_share_one_lookup_and_a_refused_one_fails_alone(tmp_path, monkeypatch) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    import pytest

    from bridge import service
    from bridge.errors import BackendRejected
    from bridge.operator.submitter import Submitter

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    adapter = FakeBatchAdapter(refuse={"bad"})
    submitter = Submitter(service.Retry(attempts=1))
    adapter.gate.clear()  # the first submission is held at the backend while the others arrive
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(submitter.submit, _prepared(adapter, "a"), "attach")
        while not adapter.finds:
            time.sleep(0.01)
        rest = {uid: pool.submit(submitter.submit, _prepared(adapter, uid), "attach")
                for uid in ("b", "c", "bad", "d", "e")}
        while len(submitter._queue) < 5:
            time.sleep(0.01)
        adapter.gate.set()
        assert first.result(10).ref.job_id == "100"
        with pytest.raises(BackendRejected, match="invalid partition for bad"):
            rest["bad"].result(10)
        results = {uid: future.result(10) for uid, future in rest.items() if uid != "bad"}
    # the five that waited went out as one group (one lookup); the refusal sent each alone, and those sent
    # before it were found by uid, not sent again
    assert adapter.finds[:2] == [["a"], ["b", "bad", "c", "d", "e"]]
    assert sorted(adapter.sent) == ["a", "b", "c", "d", "e"]
    assert {uid: r.ref.uid for uid, r in results.items()} == {u: u for u in "bcde"}
    assert len({r.ref.job_id for r in results.values()}) == 4


def test_re_attach_groups_share_one_listing_whose_jobs_answer_only_the_trainjobs_that_recorded_them(
        tmp_path, monkeypatch) -> None:
    """A restart re-attaches thousands of TrainJobs, group after group: one listing of the cluster's jobs
    answers them while it is fresh; a listed job answers only for the uid it carries, recorded on the TrainJob,
    and only while unfinished (a finished one may have a newer rerun): everything else is looked up as before."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace
    from types import SimpleNamespace

    from bridge import service
    from bridge.operator.submitter import Submitter

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    adapter = FakeBatchAdapter()
    adapter.capabilities = SimpleNamespace(unique_names=False, lists_every_job=True)
    for uid, job_id in {"a": "200", "b": "201", "c": "302", "d": "203", "e": "204", "f": "205", "g": "206",
                        "h": "207"}.items():
        adapter.sent[uid] = JobRef("hpc", "slurm", job_id, uid, uid)
    listed = {"201": ("b", JobState.RUNNING), "202": ("other", JobState.PENDING),  # c recorded 202: not its job
              "203": ("d", JobState.SUCCEEDED), "204": ("e", JobState.PENDING), "206": ("g", JobState.PENDING),
              "207": ("h", JobState.PENDING)}
    listings: list[int] = []

    def list_jobs():
        listings.append(1)
        return [JobStatus(JobRef("hpc", "slurm", job_id, uid, uid), state) for job_id, (uid, state) in listed.items()]

    adapter.list_jobs = list_jobs  # type: ignore[attr-defined]
    held, find = threading.Event(), adapter.find
    adapter.find = lambda identities: (find(identities), held.wait(10))[0]  # type: ignore[method-assign]
    now = [0.0]
    submitter = Submitter(service.Retry(attempts=1), listing_life=10.0, clock=lambda: now[0])

    def recorded(uid: str, job_id: str | None):
        return replace(_prepared(adapter, uid), recorded_job=job_id)

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(submitter.submit, recorded("a", "200"), "reattach")  # alone: looked up by its id
        while not adapter.finds:
            time.sleep(0.01)
        group = {uid: pool.submit(submitter.submit, recorded(uid, job_id), "reattach")
                 for uid, job_id in (("b", "201"), ("c", "202"), ("d", "203"), ("e", None), ("f", "999"))}
        while len(submitter._queue) < 5:
            time.sleep(0.01)
        held.set()
        assert first.result(10).ref.job_id == "200"
        answers = {uid: future.result(10) for uid, future in group.items()}
    assert {uid: a.ref.job_id for uid, a in answers.items()} == {"b": "201", "c": "302", "d": "203", "e": "204",
                                                                 "f": "205"}
    assert all(a.existing for a in answers.values()) and adapter.sent["b"].job_id == "201"
    assert answers["b"].status.state is JobState.RUNNING  # as listed
    assert listings == [1] and adapter.finds == [["a"], ["c", "d", "e", "f"]]
    # a lone re-attach while the listing is fresh is answered from it; once it is old, by the lookup again
    now[0] = 9.0
    assert submitter.submit(recorded("g", "206"), "reattach").ref.job_id == "206"
    assert listings == [1] and len(adapter.finds) == 2
    now[0] = 10.5
    assert submitter.submit(recorded("h", "207"), "reattach").ref.job_id == "207"
    assert listings == [1] and adapter.finds[2:] == [["h"]]
    # new TrainJobs ("attach") are never answered from a listing
    assert submitter.submit(recorded("n", None), "attach").existing is False and adapter.finds[3:] == [["n"]]


def test_a_trainjob_sent_before_whose_job_the_backend_forgot_is_not_sent_again(tmp_path, monkeypatch) -> None:
    import pytest

    from bridge import service
    from bridge.errors import JobGone

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # an empty record: a new operator pod's disk
    adapter = FakeBatchAdapter()
    # its job finished and left squeue (MinJobAge) while no operator ran: re-attaching must not send it twice
    with pytest.raises(JobGone, match="ns/gone .*not sent again"):
        service.submit_many([_prepared(adapter, "gone")], if_finished="reattach")
    assert adapter.sent == {}
    # still known: re-attached as it is; a TrainJob never sent ("attach") is sent
    adapter.sent["known"] = JobRef("hpc", "slurm", "7", "known", "known")
    assert service.submit_many([_prepared(adapter, "known")], if_finished="reattach")[0].ref.job_id == "7"
    assert service.submit_many([_prepared(adapter, "new")], if_finished="attach")[0].existing is False


def test_the_reconciler_re_attaches_a_trainjob_whose_status_says_it_was_sent(monkeypatch) -> None:
    from bridge.operator.reconciler import Reconciler

    modes: list[str] = []
    reconciler = Reconciler(api=FakeApi())

    def submit(body, item, if_finished):
        modes.append(if_finished)
        raise RuntimeError("stop here")

    monkeypatch.setattr(reconciler, "_submit", submit)
    sent = {"type": "Submitted", "status": "True", "reason": "Submitted", "message": "as job 1"}
    suspended = {"type": "Suspended", "status": "False", "reason": "Resumed", "message": "resumed"}
    for conditions in ([], [sent], [sent, suspended]):
        body = {"metadata": {"namespace": "ns", "name": "j", "uid": "u"}, "spec": {},
                "status": {"conditions": conditions}}
        try:
            reconciler.run(body)
        except RuntimeError:
            pass
    assert modes == ["attach", "reattach", "rerun"]


def test_the_job_a_trainjob_records_reaches_the_lookup_by_uid_on_its_own_cluster_only(tmp_path, monkeypatch) -> None:
    """A restart re-attaches each TrainJob through a lookup by uid: the job id the operator recorded on it is
    handed to the adapter (which checks it) where it was recorded on the cluster the TrainJob goes to."""
    from bridge import service
    from bridge.annotations import JOB_CLUSTER_ANNOTATION, JOB_ID_ANNOTATION
    from bridge.operator.reconciler import Reconciler
    from bridge.operator.sync import Tracked

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    adapter = FakeBatchAdapter()
    asked: list[list[tuple[str, str | None]]] = []
    find = adapter.find
    adapter.find = lambda identities: asked.append([(i.uid, i.job_id) for i in identities]) or find(  # type: ignore
        identities)
    api = FakeApi()
    api.clusters = dict  # type: ignore[attr-defined]
    api.namespace_labels = lambda namespace: {}  # type: ignore[attr-defined]
    reconciler = Reconciler(api=api)
    monkeypatch.setattr(reconciler, "_source", lambda *args: None)
    monkeypatch.setattr(service, "prepare", lambda *args, **kwargs: _prepared(adapter, "u"))
    for cluster in ("hpc", "elsewhere"):
        body = {"metadata": {"namespace": "ns", "name": "u", "uid": "u",
                             "annotations": {JOB_ID_ANNOTATION: "41", JOB_CLUSTER_ANNOTATION: cluster}}}
        reconciler._submit(body, Tracked("ns", "u", "u", None, [], None), "attach")
    assert asked == [[("u", "41")], [("u", None)]]


class JournalAdapter(FakeAdapter):
    """A backend with an event journal whose job listing lags it by one poll."""

    def __init__(self) -> None:
        import queue

        super().__init__()
        self.journal: queue.Queue = queue.Queue()
        self.lag: dict[str, JobState] = {}

    def changes(self):
        import queue

        while True:
            try:
                yield self.journal.get(timeout=0.2)
            except queue.Empty:
                yield None

    def poll(self, refs):
        self.polls += 1
        shown = {ref: JobStatus(ref, self.lag.pop(ref.job_id, self.states[ref.job_id])) for ref in refs}
        return shown


def test_a_journal_event_wakes_the_loop_and_a_lagging_listing_is_polled_again_soon() -> None:
    import time

    api, adapter = FakeApi(), JournalAdapter()
    item = Tracked("ns", "job", "uid", JobRef("hpc", "flux", "f1", "uid", "job"), [])
    adapter.states["f1"] = JobState.RUNNING
    # polls every 60 s on its own: only the journal can make it prompt
    sync = ClusterSync("hpc", adapter, api, Timing(fast=60, slow=60, outage_retry=60))
    sync.start()
    try:
        sync.track(item)
        deadline = time.monotonic() + 10
        while item.last is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert item.last[0] == "Running"
        adapter.states["f1"] = JobState.SUCCEEDED
        adapter.lag["f1"] = JobState.RUNNING  # the first poll after the event still shows it running
        polls = adapter.polls
        adapter.journal.put("f0")  # another user's job: no effect
        adapter.journal.put("f1")
        while not item.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert item.done and cond.finished(item.conditions) == "Complete"
        assert adapter.polls - polls >= 2 and sync.journal_events == 2
    finally:
        sync.stop()
        sync.thread.join(timeout=5)


def test_migrate_to_on_a_trainjob_with_nothing_running_elsewhere_moves_nothing() -> None:
    """hpcbridge.io/migrate-to is honoured only for a TrainJob running on another cluster; otherwise the
    annotation is taken off (finished: it stays as it ended; not yet running: it runs on the target when it
    does), and a target that would refuse it leaves it running where it is, with a Warning event."""
    from bridge.operator.reconciler import Reconciler

    class Api(FakeApi):
        def clusters(self):
            from tests.builders import cluster

            return {name: cluster("slurm", name, allowedNamespaces=["ns"]) for name in ("a", "b")}

        def runtime(self, namespace, kind, name):
            return None

        def namespace_labels(self, namespace):
            return {}

    reconciler = Reconciler(Api())

    def body(annotations: dict, conditions=(), suspend=False) -> dict:
        return {"metadata": {"name": "t", "namespace": "ns", "uid": "0b4c1f7e-0000-4000-8000-000000000001",
                             "annotations": annotations},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend,
                         "trainer": {"command": ["train"]}},
                "status": {"conditions": list(conditions)}}

    running = {"operator.hpcbridge.io/job-id": "7", "operator.hpcbridge.io/job-cluster": "a"}
    remove = {"hpcbridge.io/migrate-to": None}
    assert reconciler.migrate(body({**running, "hpcbridge.io/migrate-to": "a"})) == remove
    complete = [{"type": "Complete", "status": "True", "reason": "Succeeded", "message": ""}]
    assert reconciler.migrate(body({**running, "hpcbridge.io/migrate-to": "b"}, complete)) == remove
    assert reconciler.migrate(body({"hpcbridge.io/migrate-to": "b"})) == {**remove, "hpcbridge.io/cluster": "b"}
    assert reconciler.migrate(body({**running, "hpcbridge.io/migrate-to": "b"}, suspend=True)) == \
        {**remove, "hpcbridge.io/cluster": "b"}
    # no checkpoint directory declared: refused before anything is stopped
    assert reconciler.migrate(body({**running, "hpcbridge.io/migrate-to": "b"})) == remove
    assert reconciler.api.events == [("t", "MigrationRefused", True)]


def test_a_bridgecluster_created_after_the_cached_listing_is_found_not_called_unknown(tmp_path) -> None:
    """The operator caches the BridgeCluster listing for a few seconds; a TrainJob naming a cluster created
    meanwhile must find it (a fresh listing on a miss), not be refused for good as naming no such cluster."""
    from kubernetes import client

    from bridge.operator.kube import KubeApi

    def bridgecluster(name: str) -> dict:
        return {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": name},
                "spec": {"type": "slurm", "slurm": {"transport": "local"}}}

    api = KubeApi(client.ApiClient(), cluster_ttl=3600, credentials_namespace="ops", secret_dir=str(tmp_path))
    listed = [bridgecluster("old")]
    lists: list[int] = []

    def list_cluster_custom_object(*_args):
        lists.append(1)
        return {"items": list(listed)}

    api.custom.list_cluster_custom_object = list_cluster_custom_object
    assert sorted(api.clusters()) == ["old"]
    listed.append(bridgecluster("new"))  # created after the listing was cached
    clusters = api.clusters()
    assert "new" in clusters and clusters["new"].name == "new"
    assert "nosuch" not in clusters  # a name nobody created stays unknown, after one fresh listing, not one each
    assert len(lists) == 2


def test_a_bridgecluster_whose_credentials_cannot_be_read_still_gets_its_virtual_node_and_spoils_no_other(
        tmp_path) -> None:
    """The virtual nodes read the BridgeClusters' listing without credentials: one whose Secret the operator may
    not read (another namespace's) fails only its TrainJobs, and every cluster keeps its Node."""
    import pytest
    from kubernetes import client

    from bridge.errors import InvalidSpec
    from bridge.operator.kube import KubeApi
    from bridge.operator.virtual_node import wants_node

    def bridgecluster(name: str, slurm: dict) -> dict:
        return {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": name},
                "spec": {"type": "slurm", "slurm": slurm}}

    elsewhere = {"name": "creds", "namespace": "default", "key": "id"}
    listed = [bridgecluster("hpc", {"transport": "local"}),
              bridgecluster("elsewhere", {"transport": "ssh", "host": "login", "keySecretRef": elsewhere,
                                          "knownHostsSecretRef": {**elsewhere, "key": "known_hosts"}})]
    api = KubeApi(client.ApiClient(), credentials_namespace="ops", secret_dir=str(tmp_path))
    api.custom.list_cluster_custom_object = lambda *_args: {"items": listed}
    with pytest.raises(InvalidSpec, match="only from Secrets in its own namespace"):
        dict(api.clusters().items())  # what the virtual nodes once read: one bad cluster failed the whole pass
    specs = api.cluster_specs()
    assert sorted(specs) == ["elsewhere", "hpc"] and all(wants_node(c) for c in specs.values())
