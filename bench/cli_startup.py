"""Cold start of `hpcbridge render --to slurm` against `python -c pass`, measured in the same run.

Run: .venv/bin/python bench/cli_startup.py [--runs N]. Prints medians and the ratios; target ≤ 150 ms absolute.

Also measured in the same run: the floor no hpc-bridge code can go under (Python importing pydantic and PyYAML,
nothing else), and the render with the schema cache off (HPCBRIDGE_SCHEMA_CACHE=0: every process builds the
models' core schemas, as before the cache).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"


def median_seconds(argv: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    hpcbridge = str(Path(sys.executable).with_name("hpcbridge"))
    # An installed package has its bytecode cached; measure that, even where PYTHONDONTWRITEBYTECODE is set.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "bridge")], check=True)
    argv = [hpcbridge, "render", str(EXAMPLE), "--to", "slurm"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)  # the first run writes the schema cache
    uncached = {**os.environ, "HPCBRIDGE_SCHEMA_CACHE": "0"}
    baseline = median_seconds([sys.executable, "-c", "pass"], runs)
    floor = median_seconds([sys.executable, "-c", "from pydantic import BaseModel, Field; import yaml"], runs)
    render = median_seconds(argv, runs)
    render_uncached = median_seconds(argv, runs, env=uncached)
    print(f"python -c pass:                       {baseline * 1000:7.1f} ms (median of {runs})")
    print(f"python importing pydantic and yaml:   {floor * 1000:7.1f} ms (the floor)")
    print(f"hpcbridge render --to slurm:          {render * 1000:7.1f} ms")
    print(f"  the same, schema cache off:         {render_uncached * 1000:7.1f} ms")
    print(f"ratio render / python startup:        {render / baseline:7.2f}x")
    print(f"hpc-bridge's own share (render-floor):{(render - floor) * 1000:7.1f} ms")
    print(f"ratio cache off / on:                 {render_uncached / render:7.2f}x")
    print(f"target ≤ 150 ms absolute:             {'met' if render <= 0.150 else 'NOT met'}")


if __name__ == "__main__":
    main()
