"""One sync cycle over 5,000 tracked jobs: parse + map the real squeue output, and count backend calls.

Submits N held jobs to a real test cluster (tests/harness/slurm.py; needs root), then polls them all with
the adapter, against the bare `squeue` call it makes (baseline, same run). Target: ≤ 0.7 s per cycle and
exactly 1 backend call. Run: .venv/bin/python bench/slurm_sync.py [--jobs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bridge.adapters.base import JobRef  # noqa: E402
from bridge.adapters.slurm import SlurmAdapter  # noqa: E402
from bridge.adapters.slurm.state import SQUEUE_FORMAT, parse_squeue  # noqa: E402
from bridge.adapters.transport import LocalTransport  # noqa: E402
from bridge.api.cluster import BridgeCluster  # noqa: E402
from tests.harness.slurm import SlurmCluster  # noqa: E402


class CountingTransport(LocalTransport):
    def __init__(self, env):
        super().__init__(env)
        self.calls = 0

    def run(self, argv, stdin=None, timeout=60.0):
        self.calls += 1
        return super().run(argv, stdin, timeout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    count = parser.parse_args().jobs
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-bench-sync-"))
    slurm = SlurmCluster(base)
    slurm.write_config()
    slurm.conf.write_text(slurm.conf.read_text() + f"MaxJobCount={count * 2}\n")
    slurm.write_config = lambda: None  # keep the edited config
    slurm.start()
    try:
        script = "#!/bin/sh\n#SBATCH --hold\n#SBATCH --output=/dev/null\n#SBATCH --comment=hpcbridge.io/uid=bench\ntrue\n"
        batch = "".join(f"sbatch --parsable --job-name=sync-{i} <<'EOS' || exit 1\n{script}EOS\n" for i in range(count))
        out = subprocess.run(["bash"], input=batch, env=slurm.env, capture_output=True, text=True, check=True)
        ids = out.stdout.split()
        assert len(ids) == count
        transport = CountingTransport({"SLURM_CONF": str(slurm.conf)})
        cluster = BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                                "metadata": {"name": "bench"}, "spec": {"type": "slurm"}})
        adapter = SlurmAdapter(cluster, transport=transport)
        refs = [JobRef("bench", "slurm", job_id, "bench", f"sync-{i}") for i, job_id in enumerate(ids)]
        cycles, bare, parse_only = [], [], []
        argv = ["squeue", "--noheader", "--states=all", f"--jobs={','.join(ids)}", f"--Format={SQUEUE_FORMAT}"]
        for _ in range(5):
            start = time.perf_counter()
            raw = subprocess.run(argv, env=slurm.env, capture_output=True, text=True, check=True).stdout
            bare.append(time.perf_counter() - start)
            start = time.perf_counter()
            parse_squeue(raw)
            parse_only.append(time.perf_counter() - start)
            transport.calls = 0
            start = time.perf_counter()
            statuses = adapter.poll(refs)
            cycles.append(time.perf_counter() - start)
            calls = transport.calls
        assert len(statuses) == count and all(s.state.value == "Pending" for s in statuses.values())
        cycle, squeue, parse = statistics.median(cycles), statistics.median(bare), statistics.median(parse_only)
        print(f"{count} jobs, bare squeue call:        {squeue * 1000:7.0f} ms")
        print(f"parse + map alone:                  {parse * 1000:7.0f} ms")
        print(f"one adapter sync cycle:             {cycle * 1000:7.0f} ms   (target <= 700 ms)")
        print(f"ratio cycle / bare squeue:          {cycle / squeue:7.2f}x")
        print(f"backend calls per cycle:            {calls:7d}   (target 1)")
    finally:
        slurm.stop()


if __name__ == "__main__":
    main()
