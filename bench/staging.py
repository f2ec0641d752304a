"""Staging 1 GiB from a real S3 server: the stage step's throughput against a bare boto3 download of the same
objects in the same run, and the time of a cache hit.

Run: .venv/bin/python bench/staging.py [--mib 1024] [--objects 8]. Starts SeaweedFS (tests/harness/s3.py, built
from its Go module), uploads the dataset as N objects, then alternates, twice each:
  - baselines: boto3's ``download_file`` of every object, one after another (boto3's own multipart threads),
    and every object in a thread of its own;
  - staged: ``bridge.staging.stage`` into an empty cache (list, download, rename into the cache, link).
The best of each is compared with the faster baseline. Then a second job stages the same URI: a cache hit, timed in-process (the step's
own work: one LIST request, the lookup and the link) and as a whole ``hpcbridge stage`` process (Python and
boto3 start-up included). Targets: staged/baseline >= 0.9x; cache hit <= 50 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024, help="dataset size in MiB")
    parser.add_argument("--objects", type=int, default=8, help="objects it is split into")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench stops the server (finally)

    from bridge.api.storage import StageSource
    from bridge.staging.stage import Stager
    from tests.harness.s3 import ACCESS_KEY, SECRET_KEY, S3Server

    base = Path(tempfile.mkdtemp(prefix="hpcbridge-bench-staging-"))
    server = S3Server(base / "s3")
    (base / "s3").mkdir()
    try:
        server.start()
        client = server.client()
        client.create_bucket(Bucket="bench")
        size = args.mib * 2**20 // args.objects
        chunk = base / "chunk"
        with open(chunk, "wb") as handle:
            handle.write(os.urandom(size))
        started = time.monotonic()
        for index in range(args.objects):
            client.upload_file(str(chunk), "bench", f"data/shard-{index:03d}.bin")
        chunk.unlink()
        total = size * args.objects
        print(f"uploaded {total / 2**20:.0f} MiB as {args.objects} objects in {time.monotonic() - started:.1f} s")

        secrets = base / "secrets"
        secrets.mkdir(mode=0o700)
        (secrets / "s3").write_text(f"ACCESS_KEY_ID={ACCESS_KEY}\nSECRET_ACCESS_KEY={SECRET_KEY}\n")
        (secrets / "s3").chmod(0o600)
        source = StageSource("dataset", "s3://bench/data", (("ENDPOINT", server.endpoint),), "s3")

        def baseline(parallel: bool) -> float:
            into = base / "bare"
            into.mkdir()
            began = time.monotonic()

            def fetch(index: int) -> None:
                client.download_file("bench", f"data/shard-{index:03d}.bin", str(into / f"shard-{index:03d}.bin"))

            if parallel:
                with ThreadPoolExecutor(max_workers=args.objects) as pool:
                    list(pool.map(fetch, range(args.objects)))
            else:
                for index in range(args.objects):
                    fetch(index)
            took = time.monotonic() - began
            shutil.rmtree(into)
            return took

        def staged(quiet: bool = True) -> float:
            staging = base / "staging"
            began = time.monotonic()
            Stager("bench-job", staging, str(secrets), say=lambda _line: None).stage([source])
            took = time.monotonic() - began
            return took

        serial_times, parallel_times, staged_times = [], [], []
        for _ in range(2):
            serial_times.append(baseline(parallel=False))
            parallel_times.append(baseline(parallel=True))
            shutil.rmtree(base / "staging", ignore_errors=True)
            staged_times.append(staged())
        rate = lambda seconds: total / 2**20 / seconds  # noqa: E731
        serial, parallel, stage = min(serial_times), min(parallel_times), min(staged_times)
        for label, best, times in (("baseline: boto3 download_file, one object after another", serial, serial_times),
                                   ("baseline: boto3 download_file, every object in its thread", parallel,
                                    parallel_times),
                                   ("the stage step, into an empty cache", stage, staged_times)):
            print(f"{label:58} {rate(best):5.0f} MiB/s (best of {', '.join(f'{t:.2f}' for t in times)} s)")
        print(f"ratio staged / the faster baseline: {min(serial, parallel) / stage:.2f}x (target >= 0.9x)")

        hits = []
        for attempt in range(5):
            began = time.monotonic()
            Stager(f"hit-{attempt}", base / "staging", str(secrets), say=lambda _line: None).stage([source])
            hits.append(time.monotonic() - began)
        print(f"cache hit, in the stage step: median {sorted(hits)[2] * 1000:.1f} ms, best {min(hits) * 1000:.1f} ms "
              f"(target <= 50 ms)")
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "bridge", "stage", "--job-id", "hit-process", "--staging-dir",
                        str(base / "staging"), "--secrets-dir", str(secrets), "--dataset", source.uri,
                        "--dataset-env", f"ENDPOINT={server.endpoint}", "--dataset-secret", "s3"], check=True,
                       cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"cache hit, a whole `hpcbridge stage` process (Python and boto3 start-up included): "
              f"{(time.monotonic() - began) * 1000:.0f} ms")
        return 0
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
