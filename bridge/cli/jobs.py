"""The commands about submitted jobs (status, list, cancel, logs, migrate) and the clusters."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from bridge.cli.output import move_line, print_document, print_statuses, report, retry
from bridge.errors import BridgeError

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, JobStatus


#: the reasons an adapter gives a job it has no record of (Slurm, Flux, local: NoRecord; Kubernetes: NotFound)
NOT_FOUND_REASONS = ("NoRecord", "NotFound")


def job_adapter(args: argparse.Namespace) -> Adapter:
    """The adapter of the cluster a job command names; without --cluster the default one, as submit's:
    $HPCBRIDGE_CLUSTER, else local."""
    from bridge import service

    return service.cluster_adapter(args.cluster or os.environ.get("HPCBRIDGE_CLUSTER") or "local")


def unknown(statuses: Iterable[JobStatus]) -> list[JobStatus]:
    """The jobs of *statuses* their cluster has no record of, each said in one line on stderr."""
    missing = [s for s in statuses if s.state.value == "Unknown" and s.reason in NOT_FOUND_REASONS]
    for status in missing:
        cluster = status.ref.cluster
        print(f"hpcbridge: error: no job {status.ref.job_id!r} on cluster {cluster!r} "
              f"(`hpcbridge list --cluster {cluster}` lists its jobs)", file=sys.stderr)
    return missing


def cmd_status(args: argparse.Namespace) -> int:
    from bridge import service

    statuses = service.status(job_adapter(args), args.jobs, retry=retry())
    missing = unknown(statuses)
    known = [s for s in statuses if s not in missing]
    if known or not missing:
        print_statuses(known, args.output)
    return 1 if missing else 0


def cmd_list(args: argparse.Namespace) -> int:
    from bridge import service

    print_statuses(service.list_jobs(job_adapter(args), retry=retry()), args.output)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancels the jobs its cluster knows; one it has no record of is an error (exit 1), not a silent no-op."""
    from bridge import service

    adapter = job_adapter(args)
    missing = {s.ref.job_id for s in unknown(service.status(adapter, args.jobs, retry=retry()))}
    known = [job_id for job_id in args.jobs if job_id not in missing]
    if known:
        service.cancel(adapter, known, signal=args.signal, grace_seconds=args.grace, retry=retry())
    return 1 if missing else 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from bridge import service

    signal, grace = service.parse_stop_signal(args.signal)
    moved = service.migrate(job_adapter(args), args.job, args.to, signal=signal,
                            grace_seconds=grace, reason=args.reason, retry=retry())
    report(moved.prepared.notes)
    print(f"hpcbridge: {move_line(moved.move)}", file=sys.stderr)
    print(moved.submitted.ref.job_id)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from bridge import service

    adapter = job_adapter(args)
    printed = False
    for chunk in service.logs(adapter, args.job, follow=args.follow):
        printed = printed or bool(chunk)
        print(chunk, end="", flush=True)
    # a job without output and a job the cluster never had read the same in the logs: ask which
    return 1 if not printed and unknown(service.status(adapter, [args.job], retry=retry())) else 0


def cmd_clusters(args: argparse.Namespace) -> int:
    from bridge import service

    found = service.clusters()
    if args.check:
        failures = 0
        for name, obj in sorted(found.items()):
            try:
                detail = "ok: " + service.check(obj)
            except BridgeError as exc:
                failures += 1
                detail = f"unreachable: {exc}"
            print(f"{name}\t{obj.spec.type}\t{detail}")
        return 1 if failures else 0
    if args.output in ("text", "wide"):
        for name, obj in sorted(found.items()):
            print(f"{name}\t{obj.spec.type}" + (f"\t{obj.spec.staging_dir or '-'}" if args.output == "wide" else ""))
    else:
        print_document([obj.to_wire() for obj in found.values()], args.output)
    return 0
