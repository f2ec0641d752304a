"""200 submissions through hpc-bridge's Slurm adapter (one process, one reused transport) against 200 raw
`sbatch` calls, in the same run, on a real test cluster (tests/harness/slurm.py). Needs root.

Run: .venv/bin/python bench/slurm_submit.py [--jobs N] [--ssh]
--ssh adds the same over SSH to an emulated login host (one paramiko connection) against a per-call
`ssh host sbatch` loop.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bridge.adapters.slurm import SlurmAdapter  # noqa: E402
from bridge.api import load_documents  # noqa: E402
from bridge.api.cluster import BridgeCluster  # noqa: E402
from bridge.plan import resolve  # noqa: E402
from tests.harness import layer  # noqa: E402
from tests.harness.slurm import SlurmCluster  # noqa: E402

RUNTIME = load_documents("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
                         "metadata: {name: plain}\nspec: {mlPolicy: {numNodes: 1}}\n")[0]


def artifacts(adapter: SlurmAdapter, count: int, tag: str, workdir: Path):
    out = []
    for i in range(count):
        job = load_documents(yaml.safe_dump({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": f"{tag}-{i}", "annotations": {"hpcbridge.io/workdir": str(workdir),
                                                               "hpcbridge.io/output": "/dev/null"}},
            "spec": {"runtimeRef": {"name": "plain"}, "suspend": True, "trainer": {"command": ["true"]}}}))[0]
        out.append(adapter.render(resolve(job, RUNTIME, adapter.cluster)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--ssh", action="store_true")
    args = parser.parse_args()
    # the layer's submission record of this run only: a fresh cluster reuses job ids
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="hpcbridge-bench-state-")
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-bench-slurm-"))
    slurm = SlurmCluster(base)
    slurm.start()
    try:
        cluster = BridgeCluster.model_validate({
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "bench"},
            "spec": {"type": "slurm", "slurm": {"slurmConf": str(slurm.conf)}}})
        adapter = SlurmAdapter(cluster)
        ours = artifacts(adapter, args.jobs, "ours", base)
        # the same scripts without hpc-bridge's uid comment, so the baseline jobs are not "ours"
        raw_scripts = ["".join(line for line in a.main.splitlines(keepends=True) if "--comment=" not in line)
                       .replace("#SBATCH --job-name=ours-", "#SBATCH --job-name=raw-") for a in ours]

        # slurmctld slows as its queue grows, so the two sides take turns by quarters (a batch each: one lookup
        # per batch is the layer's design), and which goes first alternates: whichever went second would
        # otherwise always submit into a longer queue
        raw = bridged = 0.0
        refs = []
        step = max(1, args.jobs // 4)

        def send_raw(first: int) -> float:
            start = time.perf_counter()
            for script in raw_scripts[first:first + step]:  # hand-written baseline: one sbatch per job, on stdin
                subprocess.run(["sbatch", "--parsable"], input=script, text=True, env=slurm.env, check=True,
                               capture_output=True)
            return time.perf_counter() - start

        def send_ours(first: int) -> float:
            start = time.perf_counter()
            refs.extend(layer.submit_many(adapter, ours[first:first + step]))
            return time.perf_counter() - start

        for turn, first in enumerate(range(0, args.jobs, step)):
            if turn % 2:
                bridged += send_ours(first)
                raw += send_raw(first)
            else:
                raw += send_raw(first)
                bridged += send_ours(first)
        assert len({r.job_id for r in refs}) == args.jobs
        print(f"{args.jobs} raw sbatch calls:                 {raw:6.2f} s")
        print(f"{args.jobs} submissions through hpc-bridge:   {bridged:6.2f} s")
        print(f"ratio hpc-bridge / raw:                 {bridged / raw:6.2f}x   (target <= 1.10)")
        again = time.perf_counter()
        assert layer.submit_many(adapter, ours) == refs  # resubmitting is recognised with one listing
        print(f"resubmitting all {args.jobs} (idempotent, 1 squeue): {time.perf_counter() - again:6.2f} s")
        if args.ssh:
            ssh_bench(slurm, base, args.jobs)
    finally:
        slurm.stop()


def ssh_bench(slurm: SlurmCluster, base: Path, count: int) -> None:
    from tests.harness.netns import HostCluster

    hosts = HostCluster(count=1, base_dir=base / "hosts")
    hosts.start()
    try:
        login = hosts.hosts[0]
        cluster = BridgeCluster.model_validate({
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "viassh"},
            "spec": {"type": "slurm", "slurm": {"transport": "ssh", "host": login.ip, "user": "root",
                                                "keyFile": str(hosts.client_key),
                                                "knownHostsFile": str(hosts.known_hosts),
                                                "slurmConf": str(slurm.conf)}}})
        # this cluster's slurmctld listens on loopback, which a netns host cannot reach: the transport is
        # measured with `true`, the command that costs nothing, so the figures are the transport's own
        adapter = SlurmAdapter(cluster)
        ours = artifacts(adapter, count, "viassh", base)
        start = time.perf_counter()
        for _ in range(count):
            subprocess.run([str(hosts.ssh_wrapper), login.name, "true"], check=True, capture_output=True)
        per_call = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(count):
            adapter.transport.run(["true"])
        reused = time.perf_counter() - start
        print(f"{count} `true` commands, a new ssh per call: {per_call:6.2f} s")
        print(f"{count} commands over one reused connection: {reused:6.2f} s  "
              f"(ratio {reused / per_call:.2f}x; {adapter.transport.connects} connection)")
        del ours
    finally:
        hosts.stop()


if __name__ == "__main__":
    main()
