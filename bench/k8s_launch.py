"""The 2-node x 2-rank MPI allreduce (examples/mpi-allreduce.yaml) on real kubelet pods, beside the same job on
the local cluster and on the test Slurm cluster, in the same run: time from submit to every rank running (the
first rank's line in the output, read from the job's log afterwards with its timestamp) is not observable the
same way everywhere, so each backend reports what all three share: submit to Succeeded, end to end, through
`hpcbridge submit --wait` as a user runs it. Kubernetes also reports submit to both pods Running.

Run: .venv/bin/python bench/k8s_launch.py [--runs N]. Starts the real-node cluster (tests/harness/kubelet.py)
and the Slurm cluster (tests/harness/slurm.py); prints each backend's median and its ratio to local.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.harness.kubelet import RealNodeCluster  # noqa: E402
from tests.harness.slurm import SlurmCluster  # noqa: E402

EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-bench-launch-"))
    real, slurm = RealNodeCluster(base / "kube"), SlurmCluster(base / "slurm")
    started = time.perf_counter()
    real.start()
    print(f"real-node cluster start:       {time.perf_counter() - started:6.1f} s")
    slurm.start()
    try:
        config = base / "clusters.yaml"
        image = real.images["node"].ref
        config.write_text(yaml.safe_dump_all([
            {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "real"},
             "spec": {"type": "kubernetes", "kubernetes": {
                 "kubeconfig": str(real.kube.kubeconfig), "namespace": "default", "imagePullPolicy": "Never",
                 "images": {"ghcr.io/kubeflow/trainer/deepspeed-runtime": image}}}},
            {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "slurm"},
             "spec": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm.conf)},
                      "defaults": {"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]}}}]))
        env = {**os.environ, "HPCBRIDGE_CONFIG": str(config), "XDG_STATE_HOME": str(base / "state"),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "OMPI_MCA_btl": "self,tcp"}
        from kubernetes import client

        core = client.CoreV1Api(real.api_client())
        times: dict[str, list[float]] = {"local": [], "slurm": [], "real": []}
        running: list[float] = []
        for _ in range(runs):
            for cluster in times:
                begin = time.perf_counter()
                proc = subprocess.Popen([sys.executable, "-m", "bridge", "submit", str(EXAMPLE), "--cluster", cluster,
                                         "--wait", "--rerun"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        env=env, cwd=ROOT, text=True)
                seen_running = None
                while proc.poll() is None:
                    if cluster == "real" and seen_running is None:
                        pods = core.list_namespaced_pod("default", label_selector="jobset.sigs.k8s.io/jobset-name="
                                                                                 "mpi-allreduce").items
                        if len(pods) == 2 and all(p.status.phase == "Running" for p in pods):
                            seen_running = time.perf_counter() - begin
                    time.sleep(0.05)
                if proc.returncode != 0:
                    raise SystemExit(f"{cluster}: exit {proc.returncode}: {proc.stderr.read()[-2000:]}")
                times[cluster].append(time.perf_counter() - begin)
                if seen_running is not None:
                    running.append(seen_running)
        local = statistics.median(times["local"])
        for cluster, values in times.items():
            median = statistics.median(values)
            print(f"{cluster:6s} submit -> Succeeded: median {median:6.2f} s over {len(values)} runs "
                  f"({median / local:5.2f}x local)")
        if running:
            print(f"real   submit -> both pods Running: median {statistics.median(running):6.2f} s")
    finally:
        slurm.stop()
        real.stop()


if __name__ == "__main__":
    main()
