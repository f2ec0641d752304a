"""What a cluster's keepers run: the staging cache, the operator."""

from __future__ import annotations

import argparse
import sys

from bridge.cli.output import print_document
from bridge.errors import InvalidSpec


def cmd_cache(args: argparse.Namespace) -> int:
    from bridge import service
    from bridge.staging.cache import size_text

    directory = args.dir or service.staging_dir(args.cluster)
    if args.action == "list":
        entries = service.cache_entries(directory)
        if args.output not in ("text", "wide"):
            print_document([entry for entry in entries], args.output)
            return 0
        print("KEY\tSIZE\tFILES\tLAST USED\tURI\tVERSION")
        for entry in entries:
            print(f"{entry['key']}\t{size_text(entry['bytes'])}\t{entry['files']}\t{entry['lastUsed']}\t"
                  f"{entry['uri']}\t{entry['version'] if args.output == 'wide' else entry['version'][:12]}")
        return 0
    if not args.all and args.older_than is None:
        raise InvalidSpec("--older-than", None, "say how long unused (e.g. 7d, 12h) or --all")
    removed = service.cache_prune(directory, None if args.all else args.older_than, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for entry in removed:
        print(f"{verb} {entry['key']} {entry['uri']} ({size_text(entry['bytes'])})")
    print(f"hpcbridge: {verb} {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}, "
          f"{size_text(sum(e['bytes'] for e in removed))}", file=sys.stderr)
    return 0



def cmd_operator(args: argparse.Namespace) -> int:
    from bridge.operator.main import run

    return run(namespaces=args.namespace, default_cluster=args.default_cluster, liveness=args.liveness,
               metrics=args.metrics, metrics_token_file=args.metrics_token_file, leader_elect=args.leader_elect,
               lease_duration=args.lease_duration, probes=args.probes)
