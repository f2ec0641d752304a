"""`hpcbridge launch` end to end on 3 real hosts (netns + sshd) against bare `mpirun` with a hand-written
hostfile, in the same run. Needs root (it builds the hosts); run: .venv/bin/python bench/launch.py [--runs N].

Both sides run the same Open MPI C allreduce from host node-0 over ssh; hpcbridge's side includes starting
the per-job sshd on the peers, waiting for them, and releasing them at the end. The bridge package is
byte-compiled first, as an installed package is (the editable checkout may hold none: PYTHONDONTWRITEBYTECODE).
With --against DIR (the root of another checkout, e.g. `git worktree add /tmp/before HEAD~1`) the same launch
from that checkout's bridge package runs in the same loop: what a change of ours moved, beside the noise.
With HPCBRIDGE_TRACE=1 it also prints the last run's phase timings from every host (bridge/mpi/bootstrap.py).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
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
    parser.add_argument("--runs", type=int, default=15)  # the machine is shared and noisy: medians of many
    parser.add_argument("--against", type=Path, help="root of another checkout whose launch runs beside ours")
    options = parser.parse_args()
    runs, against = options.runs, options.against
    compileall.compile_dir(ROOT / "bridge", quiet=1)
    if against:
        compileall.compile_dir(against / "bridge", quiet=1)
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

        tracing = bool(os.environ.get("HPCBRIDGE_TRACE"))
        stderr = subprocess.PIPE if tracing else subprocess.DEVNULL
        traced: list[str] = []

        def bridged(index: int, checkout: Path | None = None) -> float:
            # another checkout's package first on sys.path (`-m bridge` would put the working directory first)
            start_bridge = ["-m", "bridge"] if checkout is None else [
                "-c", f"import sys; sys.path.insert(0, {str(checkout)!r}); from bridge.cli import main; "
                      "sys.exit(main())"]
            argv = [sys.executable, *start_bridge, "launch", "--launcher", "openmpi", "--discovery", "explicit",
                    "--job-id", f"bench-{index}", "--ssh-dir", str(keys)]
            for host in cluster.hosts:
                argv += ["--host", host.name]
            argv += ["--", str(program)]
            start = time.perf_counter()
            peers = [cluster.run_in_host(h, argv, env=CLEAN, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
                     for h in cluster.hosts[1:]]
            out = cluster.exec_in_host(node0, argv, env=CLEAN)
            for peer in peers:
                peer.wait(timeout=60)
            elapsed = time.perf_counter() - start
            assert "allreduce result: 6 OK" in out.stdout, out.stdout + out.stderr
            if tracing:  # every host's phase lines, in the order they happened (each carries the wall clock)
                texts = [out.stderr, *(peer.stderr.read() for peer in peers)]
                traced[:] = sorted((line for text in texts for line in text.splitlines()
                                    if line.startswith("[hpcbridge launch")), key=lambda line: line.split()[3])
            return elapsed

        bare()
        bridged(-1)  # warm caches on both sides
        baseline, ours, theirs = [], [], []
        for index in range(runs):  # interleaved, so machine noise hits both sides alike
            baseline.append(bare())
            ours.append(bridged(index))
            if against:
                theirs.append(bridged(runs + index, against))
        b, o = statistics.median(baseline), statistics.median(ours)
        print(f"bare mpirun (hand-written hostfile):  {b * 1000:7.0f} ms (median of {runs})")
        print(f"hpcbridge launch on every host:       {o * 1000:7.0f} ms (median of {runs})")
        print(f"ratio hpcbridge / bare:               {o / b:7.2f}x   (target <= 1.05)")
        if against:
            t = statistics.median(theirs)
            print(f"the same from {against}: {t * 1000:7.0f} ms, ratio {t / b:.2f}x")
        if traced:
            print("last run, every host:", *traced, sep="\n  ")
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
