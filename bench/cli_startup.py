"""Cold start of the commands an HPC user types against `python -c pass`, measured in the same run.

Run: .venv/bin/python bench/cli_startup.py [--runs N]. Prints medians and ratios; the target is
`hpcbridge render` <= 100 ms.

Also measured in the same run: the floors no hpc-bridge code can go under (Python importing PyYAML,
pydantic, both), `hpcbridge launch` (what every node of an allocation starts at once) around a bare
`python -c pass`, and the render with the schema cache off (HPCBRIDGE_SCHEMA_CACHE=0: every process builds
the models' core schemas). Each line also shows the median CPU time (user + system) of the process: on a
shared machine it moves far less than the wall clock.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"
TARGET = 0.100


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(arms: dict[str, tuple[list[str], dict[str, str] | None]], runs: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each arm, the arms interleaved so machine noise hits them alike."""
    wall: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(runs):
        for name, (argv, env) in arms.items():
            cpu_before, start = child_cpu(), time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(child_cpu() - cpu_before)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in arms}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    python = sys.executable
    hpcbridge = str(Path(python).with_name("hpcbridge"))
    # An installed package has its bytecode cached; measure that, even where PYTHONDONTWRITEBYTECODE is set.
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "bridge")], check=True)
    render = [hpcbridge, "render", str(EXAMPLE), "--to", "slurm"]
    subprocess.run(render, check=True, stdout=subprocess.DEVNULL)  # the first run writes the schema cache
    uncached = {**os.environ, "HPCBRIDGE_SCHEMA_CACHE": "0"}
    arms: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "python -c pass": ([python, "-c", "pass"], None),
        "python importing yaml": ([python, "-c", "import yaml"], None),
        "python importing pydantic": ([python, "-c", "from pydantic import BaseModel, Field"], None),
        "python importing pydantic and yaml": ([python, "-c", "from pydantic import BaseModel, Field; import yaml"],
                                               None),
        "hpcbridge render --to slurm": (render, None),
        "  the same, schema cache off": (render, uncached),
        "hpcbridge launch -- python -c pass": ([hpcbridge, "launch", "--launcher", "plain", "--", python, "-c",
                                                "pass"], None),
    }
    result = measure(arms, runs)
    print(f"medians of {runs}, interleaved:           wall        cpu")
    for name, (wall, cpu) in result.items():
        print(f"{name + ':':40s} {wall * 1000:7.1f} ms {cpu * 1000:7.1f} ms")
    baseline = result["python -c pass"][0]
    floor = result["python importing pydantic and yaml"][0]
    rendered = result["hpcbridge render --to slurm"][0]
    launch = result["hpcbridge launch -- python -c pass"][0]
    print(f"ratio render / python startup:           {rendered / baseline:7.2f}x")
    print(f"hpc-bridge's own share (render - floor): {(rendered - floor) * 1000:7.1f} ms")
    print(f"launch's own share (launch - 2 pythons): {(launch - 2 * baseline) * 1000:7.1f} ms")
    print(f"ratio cache off / on:                    {result['  the same, schema cache off'][0] / rendered:7.2f}x")
    print(f"target render <= {TARGET * 1000:.0f} ms:                   {'met' if rendered <= TARGET else 'NOT met'}"
          + ("" if floor <= TARGET else f" (the pydantic+yaml floor alone is {floor * 1000:.0f} ms)"))


if __name__ == "__main__":
    main()
