"""Crash safety of the operator: TrainJobs applied while the operator is killed with SIGKILL at random moments
and restarted, round after round; then every TrainJob must have exactly one Slurm job (none twice, none lost).

Run: .venv/bin/python bench/operator_crash.py [--jobs 200] [--rounds 20] [--seed N]. Same setup as
bench/operator_throughput.py (the test control plane, Slurm, the operator as a process).
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from operator_throughput import Setup  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    setup = Setup(Path(tempfile.mkdtemp(prefix="hpcbridge-bench-crash-")))
    uids: list[str] = []
    try:
        setup.operator()
        applying_for = args.rounds * 0.8  # seconds: the kills fall while TrainJobs keep arriving

        def apply_all() -> None:
            for index in range(args.jobs):
                uids.append(setup.apply(index))
                time.sleep(applying_for / args.jobs)

        applier = threading.Thread(target=apply_all)
        applier.start()
        for _ in range(args.rounds):
            time.sleep(rng.uniform(0.2, 1.4))
            setup.proc.send_signal(signal.SIGKILL)
            setup.proc.wait()
            setup.operator()
        applier.join()
        started = time.monotonic()
        while True:
            ids = [(i["metadata"].get("annotations") or {}).get("operator.hpcbridge.io/job-id")
                   for i in setup.trainjobs()]
            if len(ids) == args.jobs and all(ids) or time.monotonic() - started > 300:
                break
            time.sleep(0.5)
        jobs = setup.slurm_jobs_by_uid()
        duplicates = sum(1 for uid in uids if len(jobs.get(uid, [])) > 1)
        lost = sum(1 for uid in uids if not jobs.get(uid))
        print(f"seed {args.seed}: {args.jobs} TrainJobs, {args.rounds} SIGKILLs of the operator while they arrived")
        print(f"Slurm jobs per TrainJob: duplicates {duplicates}, lost {lost}; "
              f"{sum(map(bool, ids))}/{args.jobs} TrainJobs record their job")
    finally:
        setup.stop()


if __name__ == "__main__":
    main()
