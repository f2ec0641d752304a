"""TrainJob applied -> backend job created: hpc-bridge's operator beside Kubeflow Trainer v2.3's own controller,
on the same control plane, in one run.

One control plane (tests/harness/kube.py: kwok nodes, JobSet) with Trainer's controller manager
(``KubeCluster.start_trainer``: its CRDs, webhooks and shipped runtimes, the TrainJob CRD widened by
manifests/upstream-trainer/managed-by.json so it admits hpc-bridge's managedBy), a real Slurm test cluster
(tests/harness/slurm.py; partition DOWN, so jobs stay queued) and `hpcbridge operator` as a process watching
namespace `bench`. Three paths, each with runtime torch-distributed:
- trainer: TrainJob in namespace `kf` (no managedBy) -> Trainer's JobSet;
- ours/kubernetes: TrainJob in `bench` for BridgeCluster `kwok` (this control plane) -> our JobSet;
- ours/slurm: TrainJob in `bench` for BridgeCluster `slurm` -> its Slurm job id on the TrainJob
  (annotation operator.hpcbridge.io/job-id; a little later than sbatch's answer, by one patch).
Latency per TrainJob: from just before its create call to the moment a watch here sees the JobSet (or the
annotation). At 1 (--singles sequential single applies, p50/p99 over them) and at --jobs (default 500) applied
at once by 8 clients (p50/p99, and the time until the last one's backend job exists). Throughput ratio: that
time against a raw creation loop of the same number in the same run (JobSets created one after another by one
client; `sbatch --wrap` one after another).

Run: .venv/bin/python bench/operator_vs_trainer.py [--jobs 500] [--singles 10]. Needs root (Slurm's netns
hosts) and the harness's Trainer build.

Results (2 AMD EPYC cores shared with six other workers' builds and tests; one run, the operator with this
change's cost fixes; kwok nodes, Trainer v2.3 built by the harness):

    applied -> backend job        1 at a time (10): p50 / p99     500 at once: p50 / p99, all in; ratio to raw loop
    trainer (JobSet)              18 / 61 ms                      6.4 / 10.2 s, 12.6 s; 2.34x JobSet create loop (5.4 s)
    ours, Kubernetes (JobSet)     77 / 150 ms                     11.1 / 22.2 s, 27.8 s; 5.17x JobSet create loop
    ours, Slurm (job id on it)    53 / 129 ms                     1.8 / 3.7 s, 17.6 s; 4.41x sbatch loop (4.0 s)

One at a time, ours costs ~60 ms more than Trainer's controller: the TrainJob is parsed and planned as the CLI
does (pydantic models, the runtime merged), kopf's handler and its annotation patch. At 500 Trainer's
controller-runtime reconciles in parallel in Go; ours goes through kopf's Python workers (one process, GIL) and,
per group commit, one lookup by uid that lists every JobSet of the namespace, so the Kubernetes path is ~2.2x
Trainer's. (At 20 at once: trainer 1.33x, ours/kubernetes 1.67x, ours/slurm 5.67x of a 0.2 s sbatch loop.)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.harness.kube import KubeCluster  # noqa: E402
from tests.harness.slurm import SlurmCluster  # noqa: E402
from tests.harness.trainer_oracle import Oracle  # noqa: E402

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
JOB_ID = "operator.hpcbridge.io/job-id"
RUNTIME = "torch-distributed"
PATHS = ("trainer", "ours/kubernetes", "ours/slurm")


class Plane:
    """The control plane with Trainer, Slurm, our CRD and BridgeClusters, the operator, and watches that note
    when each backend job shows up (by TrainJob name)."""

    def __init__(self, base: Path) -> None:
        from kubernetes import client

        self.base = base
        self.kube = KubeCluster(base / "kube", nodes=2)
        self.slurm = SlurmCluster(base / "slurm", min_job_age=3600)
        self.kube.start()
        self.slurm.start()
        self.env = {**os.environ, "SLURM_CONF": str(self.slurm.conf), "KUBECONFIG": str(self.kube.kubeconfig),
                    "XDG_STATE_HOME": str(base / "state"), "HPCBRIDGE_CONFIG": str(base / "none.yaml")}
        (base / "none.yaml").write_text("")
        subprocess.run(["scontrol", "update", "PartitionName=debug", "State=DOWN"], env=self.env, check=True)
        src = self.kube.start_trainer()
        api = self.kube.api_client()
        ext, self.custom = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        patch = json.loads((ROOT / "manifests" / "upstream-trainer" / "managed-by.json").read_text())
        ext.patch_custom_resource_definition("trainjobs.trainer.kubeflow.org", patch,
                                             _content_type="application/json-patch+json")
        ext.create_custom_resource_definition(
            yaml.safe_load((ROOT / "manifests" / "crds" / "hpcbridge.io_bridgeclusters.yaml").read_text()))
        Oracle(self.kube, src, kubeflow_ns="kf", render_ns="raw").apply_shipped_runtimes()
        self.core.create_namespace({"metadata": {"name": "bench"}})
        time.sleep(3)
        for name, spec in (("slurm", {"type": "slurm", "slurm": {"transport": "local",
                                                                  "slurmConf": str(self.slurm.conf)},
                                      "defaults": {"partition": "debug"}}),
                           ("kwok", {"type": "kubernetes", "kubernetes": {"kubeconfig": str(self.kube.kubeconfig)}})):
            self.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", {
                "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": name},
                "spec": {**spec, "allowedNamespaces": ["bench"]}})
        self.workdir = base / "work"
        self.workdir.mkdir()
        self.seen: dict[str, float] = {}
        self.applied: dict[str, float] = {}
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-m", "bridge", "operator", "--namespace", "bench"],
                                     env=self.env, cwd=self.workdir, stdout=open(base / "operator.log", "a"),
                                     stderr=subprocess.STDOUT)
        self.stopping = threading.Event()
        for target in (self._watch_jobsets, self._watch_trainjobs):
            threading.Thread(target=self._watching, args=(target,), daemon=True).start()

    def _watching(self, watch: Any) -> None:
        """Run *watch* again whenever its stream ends or breaks, until the plane stops."""
        while not self.stopping.is_set():
            try:
                watch()
            except Exception:  # the API server closed the stream (its timeout, or the plane stopping)
                time.sleep(0.2)

    def _note(self, name: str) -> None:
        with self.lock:
            self.seen.setdefault(name, time.perf_counter())

    def _watch_jobsets(self) -> None:
        from kubernetes import watch

        for event in watch.Watch().stream(self.custom.list_cluster_custom_object, *JOBSET, timeout_seconds=300):
            meta = event["object"]["metadata"]
            if meta.get("namespace") in ("kf", "bench"):
                self._note((meta.get("labels") or {}).get("trainer.kubeflow.org/trainjob-name") or meta["name"])

    def _watch_trainjobs(self) -> None:
        from kubernetes import watch

        for event in watch.Watch().stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, "bench",
                                          "trainjobs", timeout_seconds=300):
            meta = event["object"]["metadata"]
            if meta["name"].startswith("sl-") and (meta.get("annotations") or {}).get(JOB_ID):
                self._note(meta["name"])

    def apply(self, path: str, name: str) -> None:
        namespace = "kf" if path == "trainer" else "bench"
        spec: dict[str, Any] = {"runtimeRef": {"name": RUNTIME}, "trainer": {"numNodes": 1, "command": ["true"]}}
        annotations = {}
        if path != "trainer":
            spec["managedBy"] = "hpcbridge.io/bridge"
            annotations = {"hpcbridge.io/cluster": "kwok" if path == "ours/kubernetes" else "slurm",
                           "hpcbridge.io/workdir": str(self.workdir)}
        with self.lock:
            self.applied[name] = time.perf_counter()
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": name, "annotations": annotations}, "spec": spec})

    def wait(self, names: list[str], limit: float) -> list[float]:
        """Latencies of *names* (seconds from apply to backend job seen), once all are seen."""
        deadline = time.perf_counter() + limit
        while time.perf_counter() < deadline:
            with self.lock:
                if all(n in self.seen for n in names):
                    return [self.seen[n] - self.applied[n] for n in names]
            time.sleep(0.05)
        with self.lock:
            missing = [n for n in names if n not in self.seen]
        raise SystemExit(f"{len(missing)} backend jobs never showed up (e.g. {missing[:3]}); see {self.base}")

    def raw_jobsets(self, count: int) -> float:
        started = time.perf_counter()
        for index in range(count):
            self.custom.create_namespaced_custom_object(*JOBSET[:2], "raw", JOBSET[2], {
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": f"raw-{index}"},
                "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"template": {
                    "spec": {"restartPolicy": "Never",
                             "containers": [{"name": "node", "image": "busybox", "command": ["true"]}]}}}}}]}})
        return time.perf_counter() - started

    def raw_sbatch(self, count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            subprocess.run(["sbatch", "--parsable", "--wrap", "true", "-o", "/dev/null"], check=True, env=self.env,
                           cwd=self.workdir, capture_output=True)
        return time.perf_counter() - started

    def stop(self) -> None:
        self.stopping.set()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.slurm.stop()
        self.kube.stop()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _prefix(path: str) -> str:
    return {"trainer": "tr", "ours/kubernetes": "ks", "ours/slurm": "sl"}[path]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--singles", type=int, default=10)
    args = parser.parse_args()
    plane = Plane(Path(tempfile.mkdtemp(prefix="hpcbridge-bench-vs-trainer-")))
    try:
        # warm: one of each, not counted (the operator's and Trainer's first reads of runtimes and clusters)
        for path in PATHS:
            plane.apply(path, f"{_prefix(path)}-warm")
            plane.wait([f"{_prefix(path)}-warm"], 120)
        print(f"1 TrainJob at a time ({args.singles} each, sequential): applied -> backend job created")
        for path in PATHS:
            names = []
            for index in range(args.singles):
                name = f"{_prefix(path)}-one-{index}"
                plane.apply(path, name)
                plane.wait([name], 60)
                names.append(name)
            latencies = plane.wait(names, 1)
            print(f"  {path:16s} p50 {statistics.median(latencies) * 1000:6.0f} ms  p99 "
                  f"{_pct(latencies, 0.99) * 1000:6.0f} ms")
        raw = {"jobset": plane.raw_jobsets(args.jobs), "sbatch": plane.raw_sbatch(args.jobs)}
        print(f"raw loops of {args.jobs}: JobSet create {raw['jobset']:.1f} s, sbatch {raw['sbatch']:.1f} s")
        print(f"{args.jobs} TrainJobs applied at once (8 clients): applied -> backend job created")
        for path in PATHS:
            names = [f"{_prefix(path)}-many-{index}" for index in range(args.jobs)]
            started = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(functools.partial(plane.apply, path), names))
            latencies = plane.wait(names, 120 + args.jobs)
            last = max(plane.seen[n] for n in names) - started
            baseline = raw["sbatch" if path == "ours/slurm" else "jobset"]
            print(f"  {path:16s} p50 {statistics.median(latencies):6.2f} s  p99 {_pct(latencies, 0.99):6.2f} s  "
                  f"all in {last:6.1f} s; ratio to the raw {'sbatch' if path == 'ours/slurm' else 'JobSet'} loop "
                  f"{last / baseline:.2f}")
            sys.stdout.flush()
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
