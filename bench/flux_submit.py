"""200 submissions through hpc-bridge's Flux adapter against 200 `flux submit` calls, on one live instance
(`flux start --test-size=2`), plus the state latency of an event-driven wait. Needs flux on PATH
(e.g. PATH=/opt/flux-core/bin:$PATH .venv/bin/python bench/flux_submit.py [--jobs N]).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bridge.adapters.flux import FluxAdapter  # noqa: E402
from bridge.api import load_documents  # noqa: E402
from bridge.api.catalog import builtin_runtimes  # noqa: E402
from bridge.api.cluster import BridgeCluster  # noqa: E402
from bridge.plan import find_runtime, resolve  # noqa: E402
from tests.harness import layer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    count = parser.parse_args().jobs
    flux = shutil.which("flux")
    if flux is None:
        sys.exit("flux is not on PATH")
    # the layer's submission record of this run only: a fresh cluster reuses job ids
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="hpcbridge-bench-state-")
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-bench-flux-"))
    uri_file = base / "uri"
    broker = subprocess.Popen([flux, "start", "--test-size=2", "bash", "-c", f'echo "$FLUX_URI" > {uri_file}; '
                               "exec sleep infinity"], start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        while not (uri_file.exists() and uri_file.read_text().strip()):
            time.sleep(0.05)
        uri = uri_file.read_text().strip()
        env = {**os.environ, "FLUX_URI": uri}
        cluster = BridgeCluster.model_validate({
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "flux"},
            "spec": {"type": "flux", "flux": {"uri": uri, "fluxCommand": flux}}})
        adapter = FluxAdapter(cluster)
        artifacts = []
        for i in range(count):
            job = load_documents(yaml.safe_dump({
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": f"job-{i}", "annotations": {"hpcbridge.io/workdir": str(base)}},
                "spec": {"runtimeRef": {"name": "sbatch-script"}, "suspend": True,
                         "trainer": {"command": ["true"]}}}))[0]
            artifacts.append(adapter.render(resolve(job, find_runtime(job, builtin_runtimes()), cluster)))
        # held jobs on both sides (urgency 0; the TrainJobs are suspended), so this measures submission
        start = time.perf_counter()
        for i in range(count):
            subprocess.run([flux, "submit", "--urgency=0", f"--job-name=raw-{i}", "true"], env=env, check=True,
                           capture_output=True)
        raw = time.perf_counter() - start
        start = time.perf_counter()
        refs = layer.submit_many(adapter, artifacts)
        ours = time.perf_counter() - start
        assert len({r.job_id for r in refs}) == count
        print(f"{count} `flux submit` calls:               {raw:6.2f} s")
        print(f"{count} submissions through hpc-bridge:    {ours:6.2f} s")
        print(f"ratio hpc-bridge / flux submit:        {ours / raw:6.2f}x   (target <= 1.10)")
        for ref in refs:
            adapter.client.run(["cancel", ref.job_id], "flux cancel", check=False)
        latencies = []
        for i in range(5):
            job = load_documents(yaml.safe_dump({
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": f"latency-{i}", "annotations": {"hpcbridge.io/workdir": str(base)}},
                "spec": {"runtimeRef": {"name": "sbatch-script"}, "trainer": {"command": ["sleep", "1"]}}}))[0]
            ref = adapter.submit(adapter.render(resolve(job, find_runtime(job, builtin_runtimes()), cluster)))
            status = adapter.wait(ref, timeout=120)
            seen = time.time()
            info = json.loads(adapter.client.run(["jobs", "--json", ref.job_id], "flux jobs").stdout)
            assert status.state.value == "Succeeded"
            latencies.append(seen - info["t_inactive"])
        print(f"state latency (job inactive -> wait returns): {statistics.median(latencies) * 1000:5.0f} ms median "
              f"(target <= 500 ms)")
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        broker.wait(timeout=30)


if __name__ == "__main__":
    main()
