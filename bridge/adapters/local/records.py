"""A local job's record, for every process of this user: where it is, how to read it, who still runs.

The job's state directory (``$XDG_STATE_HOME/hpcbridge/local/<uid>``) holds ``job.json`` (its process groups,
its owner, its coordinator port), ``stage.log`` and ``node-N.log``, a ``cancelled`` mark when a cancel came,
and at the end ``result.json``. ``status``, ``cancel``, ``logs -f`` and ``list`` from another terminal read it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bridge.adapters.base import JobRef, JobState, JobStatus
from bridge.errors import BackendRejected
from bridge.records import state_root
from bridge.staging.phase import phase_status, read_phase


def state_dir() -> Path:
    return state_root() / "local"


def job_dir(uid: str) -> Path:
    if not uid or "/" in uid or uid in (".", ".."):
        raise BackendRejected("local", f"not a local job id: {uid!r}")
    return state_dir() / uid


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] | None = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    tmp.replace(path)  # readers see the old file or the new one, never half of one


def alive(number: int, group: bool = True) -> bool:
    """Whether a process group (or with ``group=False`` a process) still exists: signal 0 probes it."""
    try:
        (os.killpg if group else os.kill)(number, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, and belongs to someone else
    return True


def killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


@contextmanager
def claiming_ports() -> Iterator[set[int]]:
    """The coordinator ports other running local jobs have claimed, while no other submit may claim one: a
    port is free until its coordinator binds it, seconds after it is chosen, so two jobs starting together
    would otherwise both take it."""
    root = state_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".ports.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            taken = set()
            for path in root.glob("*/job.json"):
                record = read_json(path)
                if record and record.get("port") and not (path.parent / "result.json").exists() \
                        and alive(int(record.get("owner", 0)) or -1, group=False):
                    taken.add(int(record["port"]))
            yield taken
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def recorded_status(ref: JobRef) -> JobStatus:
    """A job's state from its directory: for jobs another process started."""
    try:
        directory = job_dir(ref.job_id)
    except BackendRejected:
        return JobStatus(ref, JobState.UNKNOWN, reason="NoRecord")
    record = read_json(directory / "job.json")
    if record is None:
        return JobStatus(ref, JobState.UNKNOWN, reason="NoRecord", message="no local job with this id")
    ref = JobRef(ref.cluster, ref.backend, ref.job_id, record.get("uid", ref.uid), record.get("name", ref.name))
    result = read_json(directory / "result.json")
    if result is not None:
        return JobStatus(ref, JobState(result["state"]), exit_code=result.get("exitCode"),
                         reason=result.get("reason"), message=result.get("message"))
    owner = int(record.get("owner", 0)) or -1
    if any(alive(pgid) for pgid in record.get("groups", [])) or alive(owner, group=False):
        staging = phase_status(read_phase(record["stagingDir"], record.get("uid", ref.uid))) \
            if record.get("stagingDir") else None
        return JobStatus(ref, JobState.RUNNING, nodes=(socket.gethostname(),),
                         reason=staging[0] if staging else None, message=staging[1] if staging else None)
    # the owning process died before it could write the result: nobody knows the exit code
    if (directory / "cancelled").exists():
        return JobStatus(ref, JobState.CANCELLED, reason="Cancelled")
    return JobStatus(ref, JobState.FAILED, reason="Lost",
                     message="the submitting process ended before the job did; its exit code is unknown")
