"""Benchmark bridge.mpi.hostlist: expand and compress 100,000-host lists, in process and as whole processes.

Run from anywhere: ``python bench/hostlist.py [--runs N]``. Prints absolute times against the target
(<= 50 ms per call, in process), the whole-process time of ``python -c 'expand(...)'`` against
``scontrol show hostnames`` (Slurm 22.05), and python-hostlist / ClusterShell as baselines when installed.
Nothing here passes or fails; it only reports.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, this directory leads sys.path and this file would shadow python-hostlist's "hostlist".
sys.path[:] = [str(ROOT)] + [entry for entry in sys.path if Path(entry or ".").resolve() != HERE]

from bridge.mpi.hostlist import compress, expand  # noqa: E402

TARGET_MS = 50.0
HOSTS = 100_000


def cases() -> dict[str, str]:
    """name -> hostlist text, each expanding to exactly 100,000 hosts."""
    rng = random.Random(2205)
    numbers: list[int] = []
    start = 1
    while len(numbers) < HOSTS:  # allocation-like: runs of 1-32 nodes with gaps of 1-4
        run = rng.randint(1, 32)
        numbers += range(start, start + run)
        start += run + rng.randint(1, 4)
    fragmented = compress(f"node{n:06d}" for n in numbers[:HOSTS])
    return {
        # Slurm 22.05 (and expand) reject one range of more than 65,536 hosts, so the contiguous case is two.
        "contiguous": "node[000001-050000,050001-100000]",
        "fragmented": fragmented,
        "every-other": "node[" + ",".join(f"{n:06d}" for n in range(0, 2 * HOSTS, 2)) + "]",
        "racks": "rack[001-100]node[0001-1000]",
        "plain-list": ",".join(f"node{n:06d}" for n in range(HOSTS)),
    }


def timed(function: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median, min) wall time in ms."""
    function()  # warm up
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), min(samples)


def mark(ms: float) -> str:
    return "ok  " if ms <= TARGET_MS else "OVER"


def in_process(texts: dict[str, str], runs: int) -> None:
    print(f"In process, median (min) of {runs} runs; target <= {TARGET_MS:.0f} ms per call")
    print(f"  {'case':<12} {'text':>9}  {'expand ms':>16}       {'compress ms':>16}")
    for name, text in texts.items():
        hosts = expand(text)
        assert len(hosts) == HOSTS, (name, len(hosts))
        exp_med, exp_min = timed(lambda text=text: expand(text), runs)
        com_med, com_min = timed(lambda hosts=hosts: compress(hosts), runs)
        print(
            f"  {name:<12} {len(text):>8}B  {exp_med:8.1f} ({exp_min:5.1f}) {mark(exp_med)}"
            f"  {com_med:8.1f} ({com_min:5.1f}) {mark(com_med)}"
        )


def baselines(texts: dict[str, str], runs: int) -> None:
    try:
        import hostlist as python_hostlist  # python-hostlist
    except ImportError:
        print("python-hostlist: not installed (pip install python-hostlist), no baseline")
    else:
        version = getattr(python_hostlist, "__version__", "?")
        print(f"python-hostlist {version}: its time / ours (it de-duplicates and sorts; same hosts here)")
        for name, text in texts.items():
            hosts = expand(text)
            try:
                theirs_expand = timed(lambda text=text: python_hostlist.expand_hostlist(text), runs)[0]
                theirs_compress = timed(lambda hosts=hosts: python_hostlist.collect_hostlist(hosts), runs)[0]
            except python_hostlist.BadHostlist as error:
                print(f"  {name:<12} python-hostlist refuses it: {error}")
                continue
            ours_expand = timed(lambda text=text: expand(text), runs)[0]
            ours_compress = timed(lambda hosts=hosts: compress(hosts), runs)[0]
            print(
                f"  {name:<12} expand {theirs_expand:8.1f} ms = {theirs_expand / ours_expand:5.1f}x ours"
                f"   compress {theirs_compress:8.1f} ms = {theirs_compress / ours_compress:5.1f}x ours"
            )
    try:
        from ClusterShell.NodeSet import NodeSet
    except ImportError:
        print("ClusterShell: not installed, no baseline")
    else:
        print("ClusterShell NodeSet: its time / ours (a set: sorted, de-duplicated)")
        for name, text in texts.items():
            hosts = expand(text)
            theirs_expand = timed(lambda text=text: list(NodeSet(text)), max(3, runs // 3))[0]
            theirs_compress = timed(lambda hosts=hosts: str(NodeSet.fromlist(hosts)), max(3, runs // 3))[0]
            ours_expand = timed(lambda text=text: expand(text), runs)[0]
            ours_compress = timed(lambda hosts=hosts: compress(hosts), runs)[0]
            print(
                f"  {name:<12} expand {theirs_expand:8.1f} ms = {theirs_expand / ours_expand:5.1f}x ours"
                f"   compress {theirs_compress:8.1f} ms = {theirs_compress / ours_compress:5.1f}x ours"
            )


PYTHON_EXPAND = (
    "import sys; from bridge.mpi.hostlist import expand; "
    "sys.stdout.write('\\n'.join(expand(sys.argv[1])) + '\\n')"
)


def _run(argv: list[str], env: dict[str, str]) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, check=True)


def whole_process(texts: dict[str, str], runs: int) -> None:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        print("scontrol: not on PATH (apt-get install slurm-client), no whole-process comparison")
        return
    with tempfile.TemporaryDirectory(prefix="hostlist-bench-") as tmp:
        conf = Path(tmp) / "slurm.conf"
        conf.write_text("ClusterName=oracle\nSlurmctldHost=localhost\n", encoding="utf-8")
        env = {**os.environ, "SLURM_CONF": str(conf), "PYTHONPATH": str(ROOT)}
        print(
            f"Whole process, wall time, median of {runs}: "
            "python -c 'print(expand(...))' vs scontrol show hostnames"
        )
        startup = timed(lambda: _run([sys.executable, "-c", "pass"], env), runs)[0]
        print(f"  (python -c pass alone: {startup:.1f} ms)")
        for name, text in texts.items():
            if len(text.encode()) >= 128 * 1024:
                # The kernel caps one argument (and one environment string) at 128 KiB, and scontrol
                # takes a hostlist nowhere else but its interactive readline prompt, which is no fair race.
                print(f"  {name:<12} {len(text):,} bytes: too long for one argument; not compared")
                continue
            ours = [sys.executable, "-c", PYTHON_EXPAND, text]
            theirs = [scontrol, "show", "hostnames", text]
            check = subprocess.run(ours, capture_output=True, text=True, env=env, check=True)
            slurm = subprocess.run(theirs, capture_output=True, text=True, env=env, check=True)
            same = check.stdout == slurm.stdout
            ours_ms = timed(lambda argv=ours: _run(argv, env), runs)[0]
            theirs_ms = timed(lambda argv=theirs: _run(argv, env), runs)[0]
            print(
                f"  {name:<12} python {ours_ms:7.1f} ms   scontrol {theirs_ms:7.1f} ms"
                f"   python/scontrol = {ours_ms / theirs_ms:4.2f}   same hosts: {'yes' if same else 'NO'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per measurement (median reported)")
    args = parser.parse_args()
    texts = cases()
    print(
        f"bridge.mpi.hostlist, {HOSTS:,} hosts per case, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n"
    )
    in_process(texts, args.runs)
    print()
    whole_process(texts, max(3, args.runs // 3))
    print()
    baselines(texts, max(3, args.runs // 3))


if __name__ == "__main__":
    main()
