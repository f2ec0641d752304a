"""Cold start of `hpcbridge render --to slurm` against `python -c pass`, measured in the same run.

Run: .venv/bin/python bench/cli_startup.py [--runs N]. Prints medians and the ratio; target ≤ 150 ms absolute.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"


def median_seconds(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    hpcbridge = str(Path(sys.executable).with_name("hpcbridge"))
    # An installed package has its bytecode cached; measure that, even where PYTHONDONTWRITEBYTECODE is set.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "bridge")], check=True)
    baseline = median_seconds([sys.executable, "-c", "pass"], runs)
    render = median_seconds([hpcbridge, "render", str(EXAMPLE), "--to", "slurm"], runs)
    print(f"python -c pass:                     {baseline * 1000:7.1f} ms (median of {runs})")
    print(f"hpcbridge render --to slurm:        {render * 1000:7.1f} ms (median of {runs})")
    print(f"ratio render / python startup:      {render / baseline:7.2f}x")
    print(f"target ≤ 150 ms absolute:           {'met' if render <= 0.150 else 'NOT met'}")


if __name__ == "__main__":
    main()
