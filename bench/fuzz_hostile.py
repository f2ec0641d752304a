"""The full hostile-input run of issue #24: every generated input through every command, every oracle.

Prints the counts — inputs run, accepted, refused (exit 2), injections, tracebacks, runs over the bound,
API-server refusals (all four failure counts must be 0) — then one line per distinct problem.

Run: nice -n 10 .venv/bin/python bench/fuzz_hostile.py [--seed 24] [--every N] [--kind trainjob,...]
         [--no-kube] [--findings FILE] [--subprocess-every 25]
The Kubernetes part starts the test control plane (tests/harness/kube.py, built on first use; needs root);
--no-kube skips it. The fast deterministic subset of the same run is tests/integration/test_fuzz_hostile_input.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz.generator import SEED, generate, subset  # noqa: E402
from tests.fuzz.oracles import FAILURE_KINDS, Sandbox, Summary, append_findings, check_kubernetes, run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--every", type=int, default=1, help="run every N-th case of each kind (1: all)")
    parser.add_argument("--kind", default="", help="only these case kinds, comma-separated")
    parser.add_argument("--no-kube", action="store_true", help="skip the API-server dry-run")
    parser.add_argument("--findings", help="append one line per new distinct problem to this file")
    parser.add_argument("--subprocess-every", type=int, default=25,
                        help="run every N-th case through `python -m bridge` instead of a forked main()")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    # hpc-bridge loaded once here: each forked run then starts in milliseconds
    import bridge.adapters.flux  # noqa: F401
    import bridge.adapters.kubernetes  # noqa: F401
    import bridge.adapters.local  # noqa: F401
    import bridge.adapters.slurm  # noqa: F401
    import bridge.cli  # noqa: F401
    import bridge.service  # noqa: F401

    started = time.perf_counter()
    cases = generate(args.seed)
    if args.every > 1:
        cases = subset(cases, args.every)
    if args.kind:
        kinds = set(args.kind.split(","))
        cases = [c for c in cases if c.kind in kinds]
    print(f"generated {len(cases)} inputs (seed {args.seed}) in {time.perf_counter() - started:.1f} s", flush=True)

    summary = Summary()
    results = []
    per_kind: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="hpcbridge-fuzz-") as tmp:
        base = Path(tmp)
        sandbox = Sandbox(base)
        last = time.perf_counter()
        for number, case in enumerate(cases, start=1):
            case_started = time.perf_counter()
            result = run_case(case, base, sandbox, subprocess_every=args.subprocess_every)
            per_kind[case.kind] = per_kind.get(case.kind, 0.0) + time.perf_counter() - case_started
            summary.add(result)
            if result.kube_objects:
                results.append(result)
            if not args.quiet and time.perf_counter() - last > 15:
                last = time.perf_counter()
                print(f"  {number}/{len(cases)} inputs, {summary.runs} runs, {len(summary.findings)} findings, "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
        summary.scripts_executed = sandbox.executed
    cli_seconds = time.perf_counter() - started

    if not args.no_kube:
        from tests.harness.kube import KubeCluster

        kube = KubeCluster(Path(tempfile.mkdtemp(prefix="hpcbridge-fuzz-k8s-")))
        kube_started = time.perf_counter()
        kube.start()
        print(f"control plane start: {time.perf_counter() - kube_started:.1f} s", flush=True)
        try:
            api = kube.api_client()
            try:
                findings, checked = check_kubernetes(results, api, log=print)
            finally:
                api.close()
        finally:
            kube.stop()
        summary.findings.extend(findings)
        summary.kube_objects_checked = checked

    print()
    print(f"hostile-input fuzz, seed {args.seed}: {time.perf_counter() - started:.0f} s "
          f"({cli_seconds:.0f} s of CLI runs and sandboxed scripts)")
    for line in summary.lines():
        print("  " + line)
    problems = summary.problem_lines()
    if problems:
        print("\ndistinct problems (one example each):")
        for line in problems:
            print("  " + line)
    print("\nseconds per input kind: " + ", ".join(f"{kind} {seconds:.0f}" for kind, seconds in per_kind.items()))
    if args.findings:
        added = append_findings(summary.findings, args.findings)
        print(f"\n{added} new problem line(s) appended to {args.findings}")
    return 1 if any(summary.count(kind) for kind in FAILURE_KINDS) else 0


if __name__ == "__main__":
    sys.exit(main())
