"""Leader election's state machine (bridge.operator.leader) with a fake clock and an in-memory Lease API that
keeps resourceVersions as the API server does; and the CRD version check the operator runs at start."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.operator.leader import (
    ACTIVE,
    STANDBY,
    STOPPED,
    Conflict,
    Elector,
    LeaderElection,
    LeaseRecord,
    LeaseTiming,
    lease_name,
)
from bridge.operator.versions import UnsupportedCrd, check


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeLeases:
    """One Lease: create refuses when it exists, replace refuses a stale resourceVersion (409, as the API
    server does); *down* makes every call fail as an unreachable API server."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.down = False
        self.writes: list[str | None] = []

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("API server unreachable")

    def read(self) -> LeaseRecord | None:
        self._check()
        return self.record

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = replace(record, resource_version=str(self.version))
        self.writes.append(record.holder)
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.record is not None:
            raise Conflict("exists")
        return self._store(record)

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.record is None or record.resource_version != self.record.resource_version:
            raise Conflict("stale")
        return self._store(record)


TIMING = LeaseTiming(duration=15, renew_deadline=10, retry=2)


def pair(leases: FakeLeases | None = None) -> tuple[FakeLeases, Clock, Elector, Elector]:
    leases, clock = leases or FakeLeases(), Clock()
    return leases, clock, Elector(leases, "a", TIMING, clock), Elector(leases, "b", TIMING, clock)


def test_the_first_candidate_takes_the_lease_and_the_second_stands_by() -> None:
    leases, _, a, b = pair()
    assert a.step() and a.state == ACTIVE
    assert not b.step() and b.state == STANDBY and b.reached
    assert leases.record is not None and leases.record.holder == "a"


def test_a_renewed_lease_is_never_taken_over() -> None:
    leases, clock, a, b = pair()
    a.step()
    for _ in range(50):
        clock.advance(TIMING.retry)
        assert a.step()
        assert not b.step()
    assert set(leases.writes) == {"a"}


def test_a_standby_takes_over_only_after_seeing_the_lease_unchanged_for_its_duration() -> None:
    leases, clock, a, b = pair()
    a.step()
    b.step()  # b sees a's record now; a is killed (no more renewals)
    clock.advance(TIMING.duration)
    assert not b.step()  # exactly the duration: still a's
    clock.advance(0.5)
    assert b.step() and leases.record is not None and leases.record.holder == "b"
    assert leases.record.transitions == 1


def test_the_duration_counts_from_when_the_standby_saw_the_record_not_from_the_holders_clock() -> None:
    leases, clock, a, _ = pair()
    a.step()
    clock.advance(100)  # a died long ago, but a standby started only now
    late = Elector(leases, "c", TIMING, clock)
    assert not late.step()
    clock.advance(TIMING.duration + 1)
    assert late.step()


def test_a_released_lease_is_taken_at_the_next_read() -> None:
    leases, _, a, b = pair()
    a.step()
    b.step()
    a.release()
    assert a.state == STOPPED and leases.record is not None and leases.record.holder is None
    assert b.step() and leases.record.holder == "b"
    assert not a.step()  # a stopped replica never competes again


def test_a_holder_that_cannot_renew_stops_before_a_standby_may_take_over() -> None:
    leases, clock, a, b = pair()
    a.step()
    b.step()
    leases.down = True
    stopped_at = None
    for tick in range(1, 20):
        clock.advance(1)
        a.step()
        if a.lost() and stopped_at is None:
            stopped_at = tick
    assert stopped_at is not None and stopped_at <= TIMING.renew_deadline + 1
    assert stopped_at < TIMING.duration  # strictly before anyone else may hold it
    leases.down = False
    assert b.step() and not a.step()


def test_a_holder_that_reads_another_holder_stops_at_once() -> None:
    leases, clock, a, b = pair()
    a.step()
    assert leases.record is not None
    leases.replace(replace(leases.record, holder="b"))  # another writer took it (a paused process)
    assert not a.step() and a.lost()


def test_two_standbys_racing_for_an_expired_lease_elect_one() -> None:
    leases, clock, a, b = pair()

    class ReadsBeforeTheOtherWrites(FakeLeases):
        """c's view: its read returns the record as it was before b's write landed."""

        def read(self) -> LeaseRecord | None:
            return stale

        def replace(self, record: LeaseRecord) -> LeaseRecord:
            return leases.replace(record)

    c = Elector(ReadsBeforeTheOtherWrites(), "c", TIMING, clock)
    a.step()
    stale = leases.read()
    b.step()
    c.step()
    clock.advance(TIMING.duration + 1)
    assert b.step()  # b replaces the expired record first
    assert not c.step()  # c replaces the same record, at its old resourceVersion: refused
    assert [e.state for e in (b, c)] == [ACTIVE, STANDBY]
    assert leases.record is not None and leases.record.holder == "b"


def test_a_failed_renewal_within_the_deadline_keeps_the_lease() -> None:
    leases, clock, a, b = pair()
    a.step()
    leases.down = True
    clock.advance(TIMING.renew_deadline - 1)
    assert a.step() and a.state == ACTIVE
    leases.down = False
    clock.advance(1)
    assert a.step()


def test_a_lost_lease_calls_on_lost_from_the_renewing_thread() -> None:
    import threading

    leases, clock, a, _ = pair()
    lost = threading.Event()
    election = LeaderElection(a, on_lost=lost.set, sleep=lambda s: None)
    election.elector.timing = LeaseTiming(duration=15, renew_deadline=10, retry=0.01)
    election.wait_until_active()
    leases.down = True
    clock.advance(TIMING.renew_deadline + 1)
    assert lost.wait(5)
    election.release()  # nothing written: it no longer holds the Lease
    assert leases.writes == ["a"]


def test_the_probes_say_standby_or_active() -> None:
    import urllib.request

    leases, clock, a, b = pair()
    a.step()
    election = LeaderElection(b)
    server = election.serve_probes("127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError):  # never read the Lease yet: not ready
            urllib.request.urlopen(f"{url}/readyz")
        b.step()
        assert urllib.request.urlopen(f"{url}/readyz").read() == b"standby\n"
        clock.advance(TIMING.duration + 1)
        b.step()
        assert urllib.request.urlopen(f"{url}/readyz").read() == b"active\n"
        assert urllib.request.urlopen(f"{url}/healthz").status == 200
    finally:
        server.shutdown()


def test_the_lease_flag_names_namespace_and_name() -> None:
    assert lease_name("hpcbridge-system/hpcbridge-operator") == ("hpcbridge-system", "hpcbridge-operator")
    for bad in ("nolease", "/x", "x/", "a/b/c"):
        with pytest.raises(Exception, match="--leader-elect"):
            lease_name(bad)
    with pytest.raises(Exception, match="--lease-duration"):
        LeaseTiming.from_duration(1)
    timing = LeaseTiming.from_duration(6)
    assert timing.retry < timing.renew_deadline < timing.duration == 6


def crd(name: str, *versions: tuple[str, bool, bool]) -> dict:
    return {"metadata": {"name": name},
            "spec": {"versions": [{"name": v, "served": served, "storage": storage} for v, served, storage in versions]}}


def test_crds_of_the_versions_the_operator_speaks_pass() -> None:
    check([crd("trainjobs.trainer.kubeflow.org", ("v1alpha1", True, True)),
           crd("bridgeclusters.hpcbridge.io", ("v1alpha1", True, True)),
           crd("jobsets.jobset.x-k8s.io", ("v9", True, True))])  # not one it uses


def test_a_crd_that_no_longer_serves_the_operators_version_is_refused() -> None:
    with pytest.raises(UnsupportedCrd, match="CRD trainjobs.trainer.kubeflow.org serves v1; this operator reads "
                                             "v1alpha1"):
        check([crd("trainjobs.trainer.kubeflow.org", ("v1alpha1", False, False), ("v1", True, True))])


def test_a_crd_that_stores_a_version_the_operator_does_not_know_is_refused() -> None:
    with pytest.raises(UnsupportedCrd, match="bridgeclusters.hpcbridge.io stores version v1beta1"):
        check([crd("bridgeclusters.hpcbridge.io", ("v1alpha1", True, False), ("v1beta1", True, True))])


def test_the_operator_refuses_to_start_with_one_line_and_exit_1(monkeypatch, caplog) -> None:
    from bridge.operator import main

    class Api:
        api_client = object()

    def no_kopf(**_: object) -> None:
        raise AssertionError("kopf started")

    def installed(api_client: object) -> None:
        check([crd("trainjobs.trainer.kubeflow.org", ("v1", True, True))])

    monkeypatch.setattr(main, "KubeApi", Api)
    monkeypatch.setattr(main.kopf, "configure", lambda **_: None)
    monkeypatch.setattr(main.kopf, "run", no_kopf)
    monkeypatch.setattr(main.leader, "start", no_kopf)
    monkeypatch.setattr(main.versions, "check_installed", installed)
    with caplog.at_level("ERROR", logger="hpcbridge.operator"):
        assert main.run(leader_elect="hpcbridge-system/hpcbridge-operator") == 1
    assert [r.getMessage() for r in caplog.records] == [
        "refusing to start: CRD trainjobs.trainer.kubeflow.org serves v1; this operator reads v1alpha1: install the "
        "operator release that matches the CRDs"]


def test_probes_without_leader_election_are_refused() -> None:
    from bridge.operator import main

    with pytest.raises(Exception, match="--probes"):
        main.run(probes="8080")
