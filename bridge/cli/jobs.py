"""The commands about submitted jobs (status, list, cancel, logs, migrate) and the clusters."""

from __future__ import annotations

import argparse
import sys

from bridge.cli.output import move_line, print_document, print_statuses, report, retry
from bridge.errors import BridgeError


def cmd_status(args: argparse.Namespace) -> int:
    from bridge import service

    print_statuses(service.status(service.cluster_adapter(args.cluster), args.jobs, retry=retry()), args.output)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from bridge import service

    print_statuses(service.list_jobs(service.cluster_adapter(args.cluster), retry=retry()), args.output)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from bridge import service

    service.cancel(service.cluster_adapter(args.cluster), args.jobs, signal=args.signal, grace_seconds=args.grace,
                   retry=retry())
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from bridge import service

    signal, grace = service.parse_stop_signal(args.signal)
    moved = service.migrate(service.cluster_adapter(args.cluster), args.job, args.to, signal=signal,
                            grace_seconds=grace, reason=args.reason, retry=retry())
    report(moved.prepared.notes)
    print(f"hpcbridge: {move_line(moved.move)}", file=sys.stderr)
    print(moved.submitted.ref.job_id)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from bridge import service

    for chunk in service.logs(service.cluster_adapter(args.cluster), args.job, follow=args.follow):
        print(chunk, end="", flush=True)
    return 0


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
    if args.output == "text":
        for name, obj in sorted(found.items()):
            print(f"{name}\t{obj.spec.type}")
    else:
        print_document([obj.to_wire() for obj in found.values()], args.output)
    return 0
