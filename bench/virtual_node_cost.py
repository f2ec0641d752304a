"""What a BridgeCluster's virtual node and stand-in pods cost the operator, against the same cluster opted out
(``hpcbridge.io/virtual-node: "false"``), in the same run.

N TrainJobs (`true`) for the real Slurm cluster on the real API server (the test control plane), twice: first
with the cluster opted out (the baseline), then with its virtual node and a stand-in pod per TrainJob. Each phase
starts a fresh `hpcbridge operator` process and counts, from the first TrainJob applied until every one is
Complete (and, with pods, every stand-in pod Succeeded): the operator's CPU time (its own and its reaped
children's: squeue, sacct) and its requests to the API server (every HTTP request its kubernetes client and kopf
make, counted inside the process). Printed per TrainJob, and with pods over without as a ratio. No target: the
figures say what the opt-out saves on a very large cluster.

Run: .venv/bin/python bench/virtual_node_cost.py [--jobs 50]. Starts the control plane (tests/harness/kube.py)
and Slurm (tests/harness/slurm.py).

Results (2 AMD EPYC cores, 23 GiB, otherwise idle; one-node TrainJobs running `true` on the test Slurm cluster
over the local transport; each block one run):

    --jobs 50
    opted out (no node, no pods)  : 50 TrainJobs in 11.3 s; operator CPU 1.13 s (23 ms per TrainJob), 387 API requests (7.7 per TrainJob)
    virtual node + stand-in pods  : 50 TrainJobs in 12.1 s; operator CPU 1.45 s (29 ms per TrainJob), 746 API requests (14.9 per TrainJob)
    with pods / without: CPU 1.28x, API requests 1.93x

    --jobs 200
    opted out (no node, no pods)  : 200 TrainJobs in 49.4 s; operator CPU 4.54 s (23 ms per TrainJob), 1579 API requests (7.9 per TrainJob)
    virtual node + stand-in pods  : 200 TrainJobs in 47.9 s; operator CPU 5.74 s (29 ms per TrainJob), 2864 API requests (14.3 per TrainJob)
    with pods / without: CPU 1.26x, API requests 1.81x

What the pods add is per TrainJob and does not grow with their number: ~6.5 API requests (the pod's create and
its status writes as the job goes Pending -> Running -> Succeeded, the node's share of heartbeats) and ~6 ms of
CPU. Wall time is the Slurm jobs' own (both phases end when Slurm has run them). On a cluster of 10,000 queued
jobs the opt-out saves ~65,000 API requests over their lives and 10,000 pod objects in etcd.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.harness.kube import KubeCluster  # noqa: E402
from tests.harness.slurm import SlurmCluster  # noqa: E402

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
NAMESPACE = "bench"

#: runs `hpcbridge operator` in this process after wrapping the two HTTP clients it talks to the API server
#: with (the kubernetes client's urllib3, kopf's aiohttp) so that every request is counted; the count is
#: written to $BENCH_REQUEST_COUNT every 0.1 s
COUNTING_OPERATOR = '''
import os, runpy, sys, threading, time
import aiohttp
import urllib3.connectionpool

count, lock = [0], threading.Lock()

def counted():
    with lock:
        count[0] += 1

plain = urllib3.connectionpool.HTTPConnectionPool.urlopen
def urlopen(self, *args, **kwargs):
    counted()
    return plain(self, *args, **kwargs)
urllib3.connectionpool.HTTPConnectionPool.urlopen = urlopen

request = aiohttp.ClientSession._request
async def _request(self, *args, **kwargs):
    counted()
    return await request(self, *args, **kwargs)
aiohttp.ClientSession._request = _request

path = os.environ["BENCH_REQUEST_COUNT"]
def write():
    while True:
        with open(path + ".tmp", "w") as handle:
            handle.write(str(count[0]))
        os.replace(path + ".tmp", path)
        time.sleep(0.1)
threading.Thread(target=write, daemon=True).start()
sys.argv = ["hpcbridge", *sys.argv[1:]]
runpy.run_module("bridge", run_name="__main__", alter_sys=True)
'''


@dataclass(frozen=True)
class Reading:
    cpu_seconds: float
    requests: int


class Setup:
    """The control plane with hpc-bridge's CRDs, a Slurm cluster, a BridgeCluster `slurm` for it, runtime `plain`
    and namespace `bench`."""

    def __init__(self, base: Path) -> None:
        from kubernetes import client

        self.base = base
        self.kube, self.slurm = KubeCluster(base / "kube", nodes=1), SlurmCluster(base / "slurm", min_job_age=3600)
        self.kube.start()
        self.slurm.start()
        api = self.kube.api_client()
        ext, self.custom, self.core = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api), client.CoreV1Api(api)
        for path in sorted((ROOT / "manifests" / "crds").glob("*_*.yaml")):
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        time.sleep(3)
        self.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", {
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "slurm"},
            "spec": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(self.slurm.conf)},
                     "allowedNamespaces": [NAMESPACE],
                     "defaults": {"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]}}})
        self.custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterTrainingRuntime", "metadata": {"name": "plain"},
            "spec": {"mlPolicy": {"numNodes": 1}}})
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        (base / "none.yaml").write_text("")
        (base / "counting_operator.py").write_text(COUNTING_OPERATOR)
        self.workdir = base / "work"
        self.workdir.mkdir()
        self.proc: subprocess.Popen | None = None

    def virtual_node(self, wanted: bool) -> None:
        value = None if wanted else "false"
        self.custom.patch_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", "slurm", {
            "metadata": {"annotations": {"hpcbridge.io/virtual-node": value}}})

    def operator(self, phase: str) -> Path:
        counts = self.base / f"requests-{phase}"
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "SLURM_CONF": str(self.slurm.conf), "KUBECONFIG": str(self.kube.kubeconfig),
               "XDG_STATE_HOME": str(self.base / "state"), "HPCBRIDGE_CONFIG": str(self.base / "none.yaml"),
               "BENCH_REQUEST_COUNT": str(counts), "HPCBRIDGE_KUBELET_ADDRESS": "127.0.0.1",
               "HPCBRIDGE_KUBELET_PORT": str(port)}
        self.proc = subprocess.Popen([sys.executable, str(self.base / "counting_operator.py"), "operator",
                                      "--namespace", NAMESPACE], env=env, cwd=self.workdir,
                                     stdout=open(self.base / f"operator-{phase}.log", "w"), stderr=subprocess.STDOUT)
        return counts

    def reading(self, counts: Path) -> Reading:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime, stime, cutime, cstime: fields 14 to 17 of stat(5), here counted from the state field (3)
        ticks = sum(int(value) for value in fields[11:15])
        return Reading(ticks / os.sysconf("SC_CLK_TCK"), int(counts.read_text() or 0))

    def apply(self, name: str) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainjobs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": name, "annotations": {"hpcbridge.io/cluster": "slurm",
                                                       "hpcbridge.io/workdir": str(self.workdir)}},
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain"},
                     "trainer": {"command": ["true"]}}})

    def settled(self, prefix: str, jobs: int, pods: bool) -> bool:
        items = [item for item in self.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE,
                                                                            "trainjobs")["items"]
                 if item["metadata"]["name"].startswith(prefix)]
        complete = sum(any(c["type"] == "Complete" and c["status"] == "True"
                           for c in (item.get("status") or {}).get("conditions") or []) for item in items)
        if complete < jobs:
            return False
        if not pods:
            return True
        shown = self.core.list_namespaced_pod(NAMESPACE, label_selector="hpcbridge.io/managed-by=virtual-node").items
        return sum(pod.status.phase == "Succeeded" and pod.metadata.name.startswith(prefix) for pod in shown) >= jobs

    def stop_operator(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)

    def stop(self) -> None:
        self.stop_operator()
        self.slurm.stop()
        self.kube.stop()


def phase(setup: Setup, name: str, jobs: int, pods: bool) -> tuple[Reading, float]:
    """A fresh operator; once it is up (with pods: its virtual node registered), N TrainJobs applied and followed
    to their end. The operator's CPU time and API requests over that window, and the window's length."""
    setup.virtual_node(pods)
    counts = setup.operator(name)
    deadline = time.monotonic() + 120
    while not counts.exists() or (pods and not any(
            node.metadata.name == "hpcbridge-slurm" for node in setup.core.list_node().items)):
        if time.monotonic() > deadline:
            raise SystemExit(f"the operator did not come up; see {setup.base}/operator-{name}.log")
        time.sleep(0.2)
    time.sleep(2)  # its start-up done (the first listing, the node's first status): not part of the window
    before, started = setup.reading(counts), time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda index: setup.apply(f"{name}-{index}"), range(jobs)))
    deadline = time.monotonic() + 120 + 2 * jobs
    while not setup.settled(f"{name}-", jobs, pods):
        if time.monotonic() > deadline:
            raise SystemExit(f"phase {name}: not every TrainJob ended; see {setup.base}")
        time.sleep(0.5)
    time.sleep(0.3)  # the counter file is written every 0.1 s
    after, seconds = setup.reading(counts), time.perf_counter() - started
    setup.stop_operator()
    return Reading(after.cpu_seconds - before.cpu_seconds, after.requests - before.requests), seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50)
    jobs = parser.parse_args().jobs
    setup = Setup(Path(tempfile.mkdtemp(prefix="hpcbridge-bench-virtual-node-")))
    try:
        without, without_s = phase(setup, "without", jobs, pods=False)
        with_pods, with_s = phase(setup, "with", jobs, pods=True)
        for label, reading, seconds in (("opted out (no node, no pods)", without, without_s),
                                        ("virtual node + stand-in pods", with_pods, with_s)):
            print(f"{label:30s}: {jobs} TrainJobs in {seconds:.1f} s; operator CPU {reading.cpu_seconds:.2f} s "
                  f"({1000 * reading.cpu_seconds / jobs:.0f} ms per TrainJob), {reading.requests} API requests "
                  f"({reading.requests / jobs:.1f} per TrainJob)")
        print(f"with pods / without: CPU {with_pods.cpu_seconds / max(without.cpu_seconds, 1e-9):.2f}x, "
              f"API requests {with_pods.requests / max(without.requests, 1):.2f}x")
    finally:
        setup.stop()


if __name__ == "__main__":
    main()
