"""Plans rendered per second for each backend, against resolving the plan alone (the baseline, same run).

Run: .venv/bin/python bench/render.py [--seconds S].
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridge.adapters import adapter_class  # noqa: E402
from bridge.api.catalog import builtin_runtimes  # noqa: E402
from bridge.api.cluster import BridgeCluster  # noqa: E402
from bridge.api.loader import load_file  # noqa: E402
from bridge.plan import find_runtime, resolve  # noqa: E402

CASES = Path(__file__).resolve().parent.parent / "tests" / "cases"


def rate(fn, seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        count += 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    seconds = parser.parse_args().seconds
    for case in ("mpi-4x2-openmpi", "torch-cpu-2nodes"):
        trainjob = load_file(CASES / f"{case}.yaml")[0]
        runtime = find_runtime(trainjob, builtin_runtimes())
        print(f"{case}:")
        for backend in ("slurm", "flux", "kubernetes", "local"):
            cluster = BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                                    "metadata": {"name": backend}, "spec": {"type": backend}})
            adapter = adapter_class(backend)(cluster)
            plan = resolve(trainjob, runtime, cluster)
            resolve_rate = rate(lambda t=trainjob, r=runtime, c=cluster: resolve(t, r, c), seconds)
            render_rate = rate(lambda a=adapter, p=plan: a.render(p), seconds)
            print(f"  {backend:<11} render {render_rate:9.0f} plans/s   resolve {resolve_rate:8.0f}/s   "
                  f"render/resolve {render_rate / resolve_rate:5.2f}x")


if __name__ == "__main__":
    main()
