"""The durable record of what hpc-bridge submitted, one file per cluster under the user's state dir.

A line is appended after the backend accepts a job and before submit returns. So a job that has left
the backend's view (Slurm drops finished jobs from squeue after MinJobAge; without slurmdbd sacct knows
nothing) is still recognised by its TrainJob uid, and the same TrainJob is never submitted twice by
accident. ``status``, ``cancel`` and ``logs`` by job id read the uid and name back from here.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def state_root() -> Path:
    """``$XDG_STATE_HOME/hpcbridge`` (default ``~/.local/state/hpcbridge``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "hpcbridge"


@dataclass(frozen=True)
class Submission:
    uid: str
    job_id: str
    name: str
    namespace: str
    #: seconds since the epoch when the backend accepted the job
    submitted: float


def _file_name(cluster: str) -> str:
    # cluster names are Kubernetes names already; this only guards the path against anything else
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", cluster)
    return f"_{safe}" if safe.startswith(".") or not safe else safe


class Records:
    """Submissions to one cluster: an append-only JSON-lines file, written under an exclusive lock."""

    def __init__(self, cluster: str, root: Path | None = None) -> None:
        self.path = (root or state_root()) / "clusters" / _file_name(cluster) / "submitted.jsonl"

    def add(self, submissions: Iterable[Submission]) -> None:
        # one line per submission, right after its send: vars(), not asdict(), whose deep copy costs more
        # than the write (the fields are plain strings and a float)
        lines = "".join(json.dumps(vars(item), sort_keys=True) + "\n" for item in submissions)
        if not lines:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except FileNotFoundError:  # the first record for this cluster
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # no fsync: the record must outlive this process (a killed CLI or operator), which the page
            # cache gives; after a machine crash, jobs still queued are found on the backend itself
            os.write(fd, lines.encode())
        finally:
            os.close(fd)

    def _all(self) -> list[Submission]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        found = []
        for line in text.splitlines():
            try:
                found.append(Submission(**json.loads(line)))
            except (ValueError, TypeError):
                continue  # a torn last line from a crash: the backend's own view covers that job
        return found

    def by_uid(self, uids: Sequence[str]) -> dict[str, Submission]:
        """The newest submission of each uid."""
        wanted = set(uids)
        newest: dict[str, Submission] = {}
        for item in self._all():
            if item.uid in wanted:
                newest[item.uid] = item  # appended in time order: the last one wins
        return newest

    def by_job_id(self, job_ids: Sequence[str]) -> dict[str, Submission]:
        wanted = set(job_ids)
        return {item.job_id: item for item in self._all() if item.job_id in wanted}


def now() -> float:
    return time.time()


class JobStore:
    """What a TrainJob needs to run again elsewhere, by uid: its definition (the TrainJob and runtime it was
    submitted with, as YAML) and its history of moves (``hpcbridge migrate``), under the user's state dir,
    readable only by the user (a definition may hold environment values)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or state_root()) / "jobs"

    def _dir(self, uid: str) -> Path:
        if not uid or not re.fullmatch(r"[A-Za-z0-9._-]+", uid) or uid in (".", ".."):
            raise ValueError(f"not a uid: {uid!r}")
        return self.root / uid

    def keep_definition(self, uid: str, text: str) -> None:
        """Written whole (a temporary file renamed over the old one): a reader never sees half of it."""
        directory = self._dir(uid)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = directory / f".definition.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(temporary, directory / "definition.yaml")

    def definition(self, uid: str) -> str | None:
        try:
            return (self._dir(uid) / "definition.yaml").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def add_move(self, uid: str, move: dict[str, Any]) -> None:
        directory = self._dir(uid)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(directory / "history.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, (json.dumps(move, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)

    def history(self, uid: str) -> list[dict[str, Any]]:
        try:
            lines = (self._dir(uid) / "history.jsonl").read_text(encoding="utf-8").splitlines()
        except (FileNotFoundError, ValueError):
            return []
        moves = []
        for line in lines:
            try:
                moves.append(json.loads(line))
            except ValueError:
                continue
        return moves
