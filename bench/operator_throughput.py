"""The operator's submit throughput and status latency against a raw sbatch loop, in the same run.

The baseline is N plain `sbatch --wrap true`, one after another. Against it, two figures for N TrainJobs for
the real Slurm cluster on the real API server (the test control plane), each the time until every one
carries its Slurm job id (annotation operator.hpcbridge.io/job-id), target ratio <= 1.10:
1. backlog: N TrainJobs already applied, then the operator starts (a restart, a deploy); its start-up counts;
2. live: N TrainJobs applied at once by 8 clients to the running operator; the API server's own cost of
   creating them counts, and is printed on its own, since on a small machine it alone can exceed the loop.
Then status latency: for each job, the time from Slurm's end of the job (its EndTime) to the TrainJob's
Complete condition (its lastTransitionTime), p50/p99 (target p99 <= 2 s); both clocks are this machine's,
at one-second resolution.

Run: .venv/bin/python bench/operator_throughput.py [--jobs 500]. Starts the control plane
(tests/harness/kube.py) and Slurm (tests/harness/slurm.py), and the operator as a process.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.harness.kube import KubeCluster  # noqa: E402
from tests.harness.slurm import SlurmCluster  # noqa: E402

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Setup:
    """The control plane with hpc-bridge's CRDs, a Slurm cluster, a BridgeCluster `slurm` for it, runtime
    `plain`, namespace `bench`; ``operator()`` starts `hpcbridge operator` as a process."""

    def __init__(self, base: Path) -> None:
        from kubernetes import client

        self.base = base
        self.kube, self.slurm = KubeCluster(base / "kube", nodes=1), SlurmCluster(base / "slurm", min_job_age=3600)
        self.kube.start()
        self.slurm.start()
        api = self.kube.api_client()
        ext, self.custom = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)
        for path in sorted((ROOT / "manifests" / "crds").glob("*_*.yaml")):
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        time.sleep(3)
        self.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", {
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "slurm"},
            "spec": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(self.slurm.conf)},
                     "allowedNamespaces": ["bench"],
                     "defaults": {"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]}}})
        self.custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterTrainingRuntime", "metadata": {"name": "plain"},
            "spec": {"mlPolicy": {"numNodes": 1}}})
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
        self.env = {**os.environ, "SLURM_CONF": str(self.slurm.conf), "KUBECONFIG": str(self.kube.kubeconfig),
                    "XDG_STATE_HOME": str(base / "state"), "HPCBRIDGE_CONFIG": str(base / "none.yaml")}
        (base / "none.yaml").write_text("")
        self.workdir = base / "work"
        self.workdir.mkdir()
        self.proc: subprocess.Popen | None = None
        #: how many Slurm jobs with a TrainJob uid there are to be once this phase's are in
        self.expected = 0

    def operator(self) -> subprocess.Popen:
        self.proc = subprocess.Popen([sys.executable, "-m", "bridge", "operator", "--namespace", "bench"],
                                     env=self.env, cwd=self.workdir, stdout=open(self.base / "operator.log", "a"),
                                     stderr=subprocess.STDOUT)
        return self.proc

    def apply(self, index: int, prefix: str = "job") -> str:
        created = self.custom.create_namespaced_custom_object(GROUP, VERSION, "bench", "trainjobs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": f"{prefix}-{index}", "annotations": {"hpcbridge.io/cluster": "slurm",
                                                                  "hpcbridge.io/workdir": str(self.workdir)}},
            "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "plain"},
                     "trainer": {"command": ["true"]}}})
        return created["metadata"]["uid"]

    def trainjobs(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, "bench", "trainjobs")["items"]

    def slurm_jobs_by_uid(self) -> dict[str, list[str]]:
        out = subprocess.run(["squeue", "--noheader", "--states=all", "--Format=JobID:20,Comment:400"],
                             capture_output=True, text=True, env=self.env).stdout
        found: dict[str, list[str]] = {}
        for line in out.splitlines():
            match = re.search(r"hpcbridge\.io/uid=([0-9a-f-]{36})", line)
            if match:
                found.setdefault(match.group(1), []).append(line.split()[0])
        return found

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.slurm.stop()
        self.kube.stop()


def _until_all_have_ids(setup: Setup, prefix: str, jobs: int, started: float) -> tuple[float, float]:
    """Seconds from *started* until every TrainJob named *prefix*-N has its Slurm job id, and until Slurm
    holds a job for each."""
    in_slurm = None
    while True:
        items = [i for i in setup.trainjobs() if i["metadata"]["name"].startswith(prefix)]
        ids = [(i["metadata"].get("annotations") or {}).get("operator.hpcbridge.io/job-id") for i in items]
        if in_slurm is None and sum(len(v) for v in setup.slurm_jobs_by_uid().values()) >= setup.expected:
            in_slurm = time.perf_counter() - started
        if len(ids) == jobs and all(ids):
            done = time.perf_counter() - started
            return done, in_slurm if in_slurm is not None else done
        if time.perf_counter() - started > 60 + jobs:
            raise SystemExit(f"only {sum(map(bool, ids))}/{jobs} TrainJobs have a job id; see {setup.base}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=500)
    jobs = parser.parse_args().jobs
    setup = Setup(Path(tempfile.mkdtemp(prefix="hpcbridge-bench-operator-")))
    try:
        env = setup.env
        # baseline: the same number of jobs through sbatch, one after another
        started = time.perf_counter()
        for _ in range(jobs):
            subprocess.run(["sbatch", "--parsable", "--wrap", "true", "-o", "/dev/null"], check=True, env=env,
                           cwd=setup.workdir, capture_output=True)
        raw = time.perf_counter() - started
        subprocess.run(["scancel", "--user=root"], env=env)
        print(f"raw sbatch loop of {jobs}:  {raw:.1f} s")

        # 1. a backlog: N TrainJobs already applied when the operator starts (a restart, a deploy); the clock
        # runs from the operator's start, its start-up included
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: setup.apply(i, "backlog"), range(jobs)))
        setup.expected = jobs
        started = time.perf_counter()
        setup.operator()
        through, in_slurm = _until_all_have_ids(setup, "backlog-", jobs, started)
        print(f"backlog of {jobs} TrainJobs, operator started: all in Slurm after {in_slurm:.1f} s, all with a "
              f"job id after {through:.1f} s; ratio to raw sbatch {through / raw:.2f}  (target <= 1.10)")

        # 2. live: N TrainJobs applied at once (8 clients) to the running operator; the clock runs from the
        # first apply, so the API server's own cost of creating them is in it
        setup.expected = 2 * jobs
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(setup.apply, range(jobs)))
        applied = time.perf_counter() - started
        through, in_slurm = _until_all_have_ids(setup, "job-", jobs, started)
        print(f"{jobs} TrainJobs applied to the running operator in {applied:.1f} s (the API server alone, "
              f"{applied / raw:.2f}x the raw loop); all in Slurm after {in_slurm:.1f} s, all with a job id after "
              f"{through:.1f} s; ratio to raw sbatch {through / raw:.2f}")

        # status latency: Slurm's EndTime -> the TrainJob's Complete condition
        deadline = time.perf_counter() + 120 + jobs
        while True:
            done = [i for i in setup.trainjobs() if any(c["type"] == "Complete" and c["status"] == "True"
                                                        for c in (i.get("status") or {}).get("conditions") or [])]
            if len(done) == 2 * jobs or time.perf_counter() > deadline:
                break
            time.sleep(1)
        ends = {}
        out = subprocess.run(["squeue", "--noheader", "--states=all", "--Format=JobID:12,EndTime:24"],
                             capture_output=True, text=True, env=env).stdout
        for line in out.splitlines():
            job_id, end = line.split()[:2]
            if end not in ("N/A", "Unknown"):
                ends[job_id] = datetime.datetime.fromisoformat(end).timestamp()
        latencies = []
        for item in done:
            job_id = item["metadata"]["annotations"]["operator.hpcbridge.io/job-id"]
            complete = next(c for c in item["status"]["conditions"] if c["type"] == "Complete")
            if job_id in ends:
                latencies.append(_stamp(complete["lastTransitionTime"]) - ends[job_id])
        latencies.sort()
        if latencies:
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(f"status latency over {len(latencies)} jobs (1 s clock resolution): p50 "
                  f"{statistics.median(latencies):.1f} s, p99 {p99:.1f} s  (target p99 <= 2 s)")
        print(f"{len(done)}/{2 * jobs} TrainJobs Complete")
    finally:
        setup.stop()


if __name__ == "__main__":
    main()
