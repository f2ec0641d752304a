"""`hpcbridge launch` end to end on 3 real hosts (netns + sshd) against bare `mpirun` with a hand-written
hostfile, in the same run. Needs root (it builds the hosts); run: .venv/bin/python bench/launch.py [--runs N].

Both sides run the same Open MPI C allreduce from host node-0 over ssh; hpcbridge's side includes starting
the per-job sshd on the peers, waiting for them, and releasing them at the end.
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

from bridge.mpi.ssh import create_job_keys  # noqa: E402
from tests.harness.mpi_programs import build_allreduce  # noqa: E402
from tests.harness.netns import HostCluster  # noqa: E402

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "HYDRA_"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-bench-launch-"))
    cluster = HostCluster(count=3, base_dir=base)
    cluster.start()
    try:
        program = build_allreduce(base, "mpicc.openmpi")
        hostfile = base / "hostfile"
        hostfile.write_text("".join(f"{h.name} slots=1\n" for h in cluster.hosts))
        keys = create_job_keys(base / "keys", "bench")
        node0 = cluster.host("node-0")
        env = {**CLEAN, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

        def bare() -> float:
            start = time.perf_counter()
            out = cluster.exec_in_host(node0, ["mpirun", "--hostfile", str(hostfile), "-np", "3", "--mca", "plm",
                                               "rsh", "--mca", "plm_rsh_args", f"-F {cluster.ssh_config}",
                                               str(program)], env=env)
            assert "allreduce result: 6 OK" in out.stdout, out.stdout + out.stderr
            return time.perf_counter() - start

        def bridged(index: int) -> float:
            argv = [sys.executable, "-m", "bridge", "launch", "--launcher", "openmpi", "--discovery", "explicit",
                    "--job-id", f"bench-{index}", "--ssh-dir", str(keys)]
            for host in cluster.hosts:
                argv += ["--host", host.name]
            argv += ["--", str(program)]
            start = time.perf_counter()
            peers = [cluster.run_in_host(h, argv, env=CLEAN, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for h in cluster.hosts[1:]]
            out = cluster.exec_in_host(node0, argv, env=CLEAN)
            for peer in peers:
                peer.wait(timeout=60)
            assert "allreduce result: 6 OK" in out.stdout, out.stdout + out.stderr
            return time.perf_counter() - start

        bare()
        bridged(-1)  # warm caches on both sides
        baseline, ours = [], []
        for index in range(runs):  # interleaved, so machine noise hits both sides alike
            baseline.append(bare())
            ours.append(bridged(index))
        b, o = statistics.median(baseline), statistics.median(ours)
        print(f"bare mpirun (hand-written hostfile):  {b * 1000:7.0f} ms (median of {runs})")
        print(f"hpcbridge launch on every host:       {o * 1000:7.0f} ms (median of {runs})")
        print(f"ratio hpcbridge / bare:               {o / b:7.2f}x   (target <= 1.10)")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
