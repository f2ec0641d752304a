"""Operator fail-over and rolling upgrade with TrainJobs in flight, on the real API server and real Slurm.

Two `hpcbridge operator` replicas with leader election (a Lease), each with its own state directory, as pods on
two nodes. N TrainJobs (a `sleep` each) are applied, then:
1. kill: the active replica is killed (SIGKILL) K times, mid-load, and a new replica started in its place (what
   the Deployment does); time to fail-over = from the kill until another replica holds the Lease;
2. rolling upgrade: N more TrainJobs, and K times a new replica started first, then the active one stopped
   gracefully (SIGTERM: it releases the Lease); time to fail-over = from the SIGTERM until another holds it.
After each phase every TrainJob must end as its Slurm job ended. Printed per phase: duplicates (TrainJobs with
more than one Slurm job), lost (TrainJobs with none, or whose status does not match their Slurm job), time to
fail-over p50/p99, and its ratio to the Lease duration measured in the same run (the bound a kill waits for).

Run: .venv/bin/python bench/operator_failover.py [--jobs 200] [--kills 10] [--lease-duration 5]
[--job-seconds 20]. Starts the control plane (tests/harness/kube.py) and Slurm (tests/harness/slurm.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from operator_throughput import GROUP, VERSION, Setup  # noqa: E402

LEASE = "hpcbridge-operator"


class Replicas:
    """Elected operator processes in namespace `bench`, each named and with its own state directory."""

    def __init__(self, setup: Setup, lease_seconds: float) -> None:
        self.setup, self.lease_seconds = setup, lease_seconds
        self.procs: dict[str, subprocess.Popen] = {}
        self.count = 0

    def start(self) -> str:
        self.count += 1
        name = f"replica-{self.count}"
        state = self.setup.base / name
        state.mkdir()
        env = {**self.setup.env, "POD_NAME": name, "XDG_STATE_HOME": str(state),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "bridge", "operator", "--namespace", "bench", "--leader-elect", f"bench/{LEASE}",
             "--lease-duration", str(self.lease_seconds)],
            env=env, cwd=self.setup.workdir, stdout=open(self.setup.base / f"{name}.log", "w"), stderr=subprocess.STDOUT)
        return name

    def holder(self) -> str | None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            lease = client.CoordinationV1Api(self.setup.custom.api_client).read_namespaced_lease(LEASE, "bench")
        except ApiException:
            return None
        return lease.spec.holder_identity

    def active(self, timeout: float = 120) -> str:
        """The live replica holding the Lease (waits for one)."""
        deadline = time.monotonic() + timeout
        while True:
            name = self.holder()
            if name in self.procs and self.procs[name].poll() is None:
                return name
            if time.monotonic() > deadline:
                raise SystemExit(f"no live replica holds the Lease; see {self.setup.base}")
            time.sleep(0.05)

    def stop(self, name: str, sig: int) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(timeout=60)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name, signal.SIGKILL)


def _apply(setup: Setup, prefix: str, jobs: int, seconds: int) -> None:
    def one(index: int) -> None:
        setup.custom.create_namespaced_custom_object(GROUP, VERSION, "bench", "trainjobs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": f"{prefix}-{index}", "annotations": {"hpcbridge.io/cluster": "slurm",
                                                                  "hpcbridge.io/workdir": str(setup.workdir)}},
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain"},
                     "trainer": {"command": ["sleep", str(seconds)]}}})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(jobs)))


def _fail_over(replicas: Replicas, graceful: bool) -> float:
    """Stop the active replica (SIGTERM after starting its successor, or SIGKILL and then start one); seconds
    until another replica holds the Lease."""
    old = replicas.active()
    if graceful:
        replicas.start()  # maxSurge 1: the new pod first
        time.sleep(1)
    started = time.monotonic()
    replicas.stop(old, signal.SIGTERM if graceful else signal.SIGKILL)
    if not graceful:
        replicas.start()  # the Deployment replaces the pod
    while replicas.holder() in (old, None):
        time.sleep(0.05)
    return time.monotonic() - started


def _outcome(setup: Setup, prefix: str, jobs: int, timeout: float) -> tuple[int, int, int]:
    """Once every TrainJob named *prefix*-N has ended (or *timeout*): (duplicates, lost, finished)."""
    deadline = time.monotonic() + timeout
    while True:
        items = [i for i in setup.trainjobs() if i["metadata"]["name"].startswith(f"{prefix}-")]
        ended = [i for i in items if _final(i)]
        if len(ended) == jobs or time.monotonic() > deadline:
            break
        time.sleep(1)
    by_uid = setup.slurm_jobs_by_uid()
    states = _slurm_states(setup)
    duplicates = sum(1 for i in items if len(by_uid.get(i["metadata"]["uid"], [])) > 1)
    lost = 0
    for item in items:
        found = by_uid.get(item["metadata"]["uid"], [])
        final = _final(item)
        expected = {"COMPLETED": "Complete"}.get(states.get(found[0], "") if found else "", "Failed")
        if len(found) != 1 or final != expected:
            lost += 1
    return duplicates, lost + (jobs - len(items)), len(ended)


def _final(item: dict) -> str | None:
    for condition in (item.get("status") or {}).get("conditions") or []:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return str(condition["type"])
    return None


def _slurm_states(setup: Setup) -> dict[str, str]:
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--Format=JobID:20,State:20"],
                         capture_output=True, text=True, env=setup.env).stdout
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if len(line.split()) >= 2}


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _phase(setup: Setup, replicas: Replicas, args: argparse.Namespace, prefix: str, graceful: bool) -> None:
    _apply(setup, prefix, args.jobs, args.job_seconds)
    times = []
    for _ in range(args.kills):
        time.sleep(args.interval)  # jobs being submitted and followed when the active replica goes
        times.append(_fail_over(replicas, graceful))
    duplicates, lost, ended = _outcome(setup, prefix, args.jobs, timeout=120 + args.jobs + args.job_seconds * 4)
    p50, p99 = _percentiles(times)
    what = "rolling upgrade (new replica first, SIGTERM to the active)" if graceful else "kill -9 of the active"
    print(f"{what}, {args.kills} times, {args.jobs} TrainJobs: {ended}/{args.jobs} ended, duplicates {duplicates}, "
          f"lost {lost}; time to fail-over p50 {p50:.2f} s, p99 {p99:.2f} s "
          f"({p50 / args.lease_duration:.2f} / {p99 / args.lease_duration:.2f} of the {args.lease_duration:g} s Lease)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease-duration", type=float, default=5.0)
    parser.add_argument("--job-seconds", type=int, default=20, help="how long each TrainJob's job runs")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between two fail-overs")
    args = parser.parse_args()
    setup = Setup(Path(tempfile.mkdtemp(prefix="hpcbridge-bench-failover-")))
    replicas = Replicas(setup, args.lease_duration)
    try:
        replicas.start()
        replicas.active()
        replicas.start()
        _phase(setup, replicas, args, "kill", graceful=False)
        _phase(setup, replicas, args, "upgrade", graceful=True)
    finally:
        replicas.stop_all()
        setup.stop()


if __name__ == "__main__":
    main()
