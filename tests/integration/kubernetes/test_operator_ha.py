"""Two `hpcbridge operator` replicas with leader election against the real API server and real Slurm: one
active writer, fail-over when the active one is killed (kill -9) and a rolling upgrade (a new replica started,
the old one stopped gracefully), with TrainJobs in flight: every TrainJob ends as its one Slurm job ended,
none has two Slurm jobs and none has none.

Each replica has its own state directory, as pods on different nodes have: what a new leader needs to
re-attach comes from the API server and Slurm only. The CRD version check runs against the real CRDs too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.kubernetes.test_operator import ROOT, Operator, is_true, operator  # noqa: F401 - fixture

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes, pytest.mark.slurm]

LEASE_NAMESPACE, LEASE = "hpcbridge-system", "hpcbridge-operator"
#: short, so the test waits little: renewal gives up after 2/3 of it, standbys read the Lease every 2/15
LEASE_SECONDS = 4


class Replica(Operator):
    """One elected operator process, named *identity* (its pod's name in a Deployment)."""

    def __init__(self, base: Operator, identity: str, directory: Path) -> None:
        directory.mkdir()
        super().__init__(base.cluster, base.slurm, directory)
        self.identity = identity
        self.env["POD_NAME"] = identity
        # the package from this checkout, whatever the interpreter's install points at
        self.env["PYTHONPATH"] = str(ROOT)

    def start(self) -> None:
        self.log = open(self.base / f"operator-{time.monotonic_ns()}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge", "operator", "--leader-elect", f"{LEASE_NAMESPACE}/{LEASE}",
             "--lease-duration", str(LEASE_SECONDS)],
            env=self.env, cwd=self.base, stdout=self.log, stderr=subprocess.STDOUT)


def final(obj: dict) -> str | None:
    """Complete or Failed, once the TrainJob has ended."""
    return next((kind for kind in ("Complete", "Failed") if is_true(kind)(obj)), None)


def holder(op: Operator) -> str | None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.CoordinationV1Api(op.api).read_namespaced_lease(LEASE, LEASE_NAMESPACE).spec.holder_identity
    except ApiException as exc:
        assert exc.status == 404
        return None


def until_holder(op: Operator, identity: str | None, *replicas: Replica, timeout: float = 60) -> float:
    """Seconds until the Lease names *identity*."""
    started = time.monotonic()
    while holder(op) != identity:
        assert time.monotonic() - started < timeout, (holder(op), [r.logs() for r in replicas])
        time.sleep(0.1)
    return time.monotonic() - started


def test_a_standby_takes_over_from_a_killed_and_an_upgraded_replica_without_duplicating_or_losing_jobs(
        operator, tmp_path) -> None:  # noqa: F811 - the fixture imported above
    operator.kill(signal.SIGTERM)  # the module's replica without election stands aside
    a, b, c = (Replica(operator, name, tmp_path / name) for name in ("replica-a", "replica-b", "replica-c"))
    try:
        a.start()
        until_holder(operator, "replica-a", a)
        b.start()
        ns = operator.namespace()
        uids = {f"ha-{i}": operator.apply(ns, f"ha-{i}", "slurm", ["sleep", "4"])["metadata"]["uid"]
                for i in range(6)}
        operator.until(ns, "ha-0", is_true("Submitted"))
        # b reads the Lease once it has started (seconds on a busy machine): then it says it stands by
        deadline = time.monotonic() + 60
        while "standing by as replica-b (replica-a holds the Lease)" not in b.logs(None):
            assert time.monotonic() < deadline and b.proc is not None and b.proc.poll() is None, b.logs(None)
            time.sleep(0.2)
        assert "ha-" not in b.logs(None)  # the standby touched no TrainJob
        a.kill(signal.SIGKILL)  # mid-flight: some submitted, some maybe not yet
        for i in range(6, 9):
            uids[f"ha-{i}"] = operator.apply(ns, f"ha-{i}", "slurm", ["sleep", "4"])["metadata"]["uid"]
        took = until_holder(operator, "replica-b", a, b)
        print(f"fail-over after kill -9: {took:.1f} s (lease {LEASE_SECONDS} s)")
        c.start()  # a rolling upgrade: the new replica first, then the old one stopped gracefully
        for i in range(9, 12):
            uids[f"ha-{i}"] = operator.apply(ns, f"ha-{i}", "slurm", ["sleep", "4"])["metadata"]["uid"]
        operator.until(ns, "ha-9", is_true("Submitted"))
        b.kill(signal.SIGTERM)
        assert b.proc is not None and b.proc.returncode == 0, b.logs()
        until_holder(operator, "replica-c", b, c)
        ended = {name: final(operator.until(ns, name, final, timeout=240)) for name in uids}
        jobs = {name: operator.slurm_jobs(uid) for name, uid in uids.items()}
        assert all(len(found) == 1 for found in jobs.values()), jobs  # none twice, none lost
        # every status is its Slurm job's end
        slurm = {name: operator.slurm_state(found[0]) for name, found in jobs.items()}
        assert ended == {name: "Complete" if state == "COMPLETED" else "Failed" for name, state in slurm.items()}, (
            ended, slurm)
    finally:
        for replica in (a, b, c):
            replica.kill(signal.SIGKILL)
        operator.start()


def test_the_operator_refuses_to_start_against_a_crd_version_it_does_not_understand(operator) -> None:  # noqa: F811
    """A copy of the BridgeCluster CRD, renamed (the real one stays), whose stored version is one the operator
    does not know: the check reads the installed CRDs and refuses with one line and exit 1. Checked on the
    real CRD list by a standalone call, since installing a foreign version of the real CRD would break the
    other tests' operator."""
    from kubernetes import client

    from bridge.operator import versions

    ext = client.ApiextensionsV1Api(operator.api)
    listed = [operator.api.sanitize_for_serialization(item) for item in ext.list_custom_resource_definition().items]
    versions.check(listed)  # what is installed passes
    bridge = next(crd for crd in listed if crd["metadata"]["name"] == "bridgeclusters.hpcbridge.io")
    newer = {**bridge, "spec": {**bridge["spec"], "versions": [
        {**bridge["spec"]["versions"][0], "storage": False},
        {**bridge["spec"]["versions"][0], "name": "v1beta1", "storage": True}]}}
    with pytest.raises(versions.UnsupportedCrd, match="stores version v1beta1"):
        versions.check([newer])
