"""What the command line prints: notes on stderr, artifacts and documents as text, YAML or JSON, job tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from bridge.errors import BridgeError, InvalidSpec

if TYPE_CHECKING:
    from bridge.adapters.base import Artifact, JobStatus
    from bridge.service import Retry


def report(lines: Iterable[str]) -> None:
    for line in lines:
        note(line)


def note(line: str) -> None:
    print(f"hpcbridge: note: {line}", file=sys.stderr, flush=True)


def retry() -> Retry:
    """Transient backend errors are retried a few times, each retry said on stderr."""
    from bridge.service import Retry

    def told(exc: BridgeError, attempt: int, delay: float) -> None:
        print(f"hpcbridge: note: {exc}; retrying in {delay:g}s (attempt {attempt + 1})", file=sys.stderr)

    return Retry(on_retry=told)


def print_artifact(artifact: Artifact, output: str) -> None:
    if output == "text":
        sys.stdout.write(artifact.text())
    else:
        print_document(artifact.document(), output)


def print_document(document: object, output: str) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    elif output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(document, sort_keys=False, width=1_000_000))
    else:
        raise InvalidSpec("--output", output, "use text, yaml or json")


#: how a command prints: text for people, yaml and json for programs
OUTPUTS = ("text", "yaml", "json")
#: a command that prints a table also has wide, the table with more columns
TABLE_OUTPUTS = ("text", "wide", "yaml", "json")


def show_change(status: JobStatus) -> None:
    detail = f" ({status.reason})" if status.reason else ""
    where = f" on {','.join(status.nodes)}" if status.nodes and not status.state.finished else ""
    print(f"{status.ref.job_id} {status.state.value}{detail}{where}", file=sys.stderr, flush=True)


def move_line(move: dict[str, Any]) -> str:
    source, target = move["from"], move["to"]
    how = f" after {move['signal']}" if move.get("signal") else ""
    why = f": {move['reason']}" if move.get("reason") else ""
    return (f"moved from {source['cluster']} job {source['job']} ({source['state']}{how}) to {target['cluster']} "
            f"job {target['job']}{why}")


def print_table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell, two spaces apart."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def print_statuses(statuses: Iterable[JobStatus], output: str) -> None:
    from bridge.service import status_documents

    rows = status_documents(statuses)
    if output not in ("text", "wide"):
        print_document(rows, output)
        return
    wide = output == "wide"
    header = ("JOB", "NAME", "STATE", "EXIT", "REASON", "NODES") + (("UID", "MESSAGE") if wide else ())
    print_table(header, [(r["job"], r["name"] or "-", r["state"], "-" if r["exitCode"] is None else str(r["exitCode"]),
                          r["reason"] or "-", r["nodes"] or "-")
                         + ((r["uid"] or "-", r.get("message") or "-") if wide else ()) for r in rows])
    for row in rows:
        # why it waits (a queue, the scheduler), what it is fetching first, why its initializer failed
        if not wide and row.get("message") and (row["state"] in ("Pending", "Suspended")
                                                or row["reason"] in ("Initializing", "InitializerFailed")):
            print(f"{row['job']}: {row['state']}: {row['message']}")
        for move in row.get("history", ()):
            print(f"{row['job']}: {move_line(move)}")
