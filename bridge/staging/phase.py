"""How far a job's stage step got, as its adapter reads it for ``status``: ``<stagingDir>/jobs/<uid>/
initializer.json`` (a tenant's job: ``<stagingDir>/tenants/<tenant>/jobs/<uid>/…``), one JSON line the stage
step replaces as it goes (bridge.staging.stage). Kept apart from the stage step so adapters read it without
importing the sources.

The file is in a folder the job itself can write, so its content is the job's word about itself only: which
job a document is about comes from the path it was read from, never from what it says."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, ClassVar, Protocol, TypeVar

PHASE_FILE = "initializer.json"
#: the most of a phase file read: a stage step writes one short line
MAX_PHASE_BYTES = 16384
#: the most of a URI or reason a status message repeats from it
MAX_FIELD = 1024
#: prints, per path given, one line: the path, a tab, and the file's first bytes with line breaks removed, so
#: nothing a file holds can start a line that seems to be another path's; a plain file only (not a link to
#: another file, not a FIFO that would hold up every job's status)
READ_EACH = (f'for f do printf "%s\\t" "$f"; if [ -f "$f" ] && [ ! -h "$f" ]; then head -c {MAX_PHASE_BYTES} '
             '-- "$f" 2>/dev/null | tr -d "\\n\\r"; fi; echo; done')


class _Ref(Protocol):
    """What is read of a job's reference (an adapter's JobRef, a layer above)."""

    @property
    def uid(self) -> str: ...


class _Status(Protocol):
    """What is read of a job's status (an adapter's JobStatus, a layer above): a dataclass with a state."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def state(self) -> Enum: ...


_R = TypeVar("_R", bound=_Ref)
_S = TypeVar("_S", bound=_Status)

#: the phase documents someone follows (watch_phase) by path, as with_stage_phases last read them through the
#: backend's transport: a job's poll reads its phase file anyway, so a live status line of a job whose
#: stagingDir only the cluster sees costs no call of its own; only watched paths are kept (a long-running
#: poller keeps nothing)
_WATCHED: dict[str, dict[str, Any] | None] = {}


def job_root(staging_dir: str, tenant: str | None = None) -> str:
    """The folder of a job's links and phase file: a tenant's under ``tenants/<tenant>``, the CLI's at the top."""
    root = staging_dir.rstrip("/")
    return root if tenant is None else f"{root}/tenants/{tenant}"


def phase_path(staging_dir: str, uid: str, tenant: str | None = None) -> str:
    return f"{job_root(staging_dir, tenant)}/jobs/{uid}/{PHASE_FILE}"


def read_phase(staging_dir: str, uid: str, tenant: str | None = None) -> dict[str, Any] | None:
    try:
        fd = os.open(phase_path(staging_dir, uid, tenant), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            doc = json.loads(handle.read(MAX_PHASE_BYTES))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def watch_phase(staging_dir: str, uid: str, tenant: str | None = None) -> Callable[[], dict[str, Any] | None]:
    """A reader of job *uid*'s phase document as the backend's polls last read it (None before the first, and
    while the job has none): for a cluster whose stagingDir this machine does not see."""
    path = phase_path(staging_dir, uid, tenant)
    _WATCHED.setdefault(path, None)
    return lambda: _WATCHED.get(path)


def read_each_argv(paths: list[str]) -> list[str]:
    """One command that prints every file of *paths* as :func:`parse_each` reads it back."""
    return ["sh", "-c", READ_EACH, "sh", *paths]


def parse_each(paths: list[str], text: str) -> dict[str, dict[str, Any]]:
    """Phase documents by the path they were read from: line *i* of *text* belongs to ``paths[i]``."""
    found: dict[str, dict[str, Any]] = {}
    for path, line in zip(paths, text.split("\n"), strict=False):
        if not line.startswith(path + "\t"):
            break  # out of step: trust none of the rest
        try:
            doc = json.loads(line[len(path) + 1:])
        except ValueError:
            continue
        if isinstance(doc, dict):
            found[path] = doc
    return found


def phase_status(doc: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) a job's status shows for its stage step: while it fetches, and when it failed."""
    if not doc:
        return None
    phase = doc.get("phase")
    uri = str(doc.get("uri", ""))[:MAX_FIELD]
    if phase in ("dataset", "model"):
        return "Initializing", f"Initializing ({phase}): {uri}"
    if phase == "failed":
        role = doc.get("role") if doc.get("role") in ("dataset", "model") else "an"
        return "InitializerFailed", f"the {role} initializer failed for {uri}: {str(doc.get('reason'))[:MAX_FIELD]}"
    return None


def with_phase(status: _S, doc: Mapping[str, Any] | None) -> _S:
    """*status* (a JobStatus) as its stage step explains it: a running job still fetching shows
    "Initializing (dataset)", a failed one whose stage step failed names the initializer, URI and reason."""
    from dataclasses import replace

    said = phase_status(doc)
    if said is None:
        return status
    reason, message = said
    if (reason == "Initializing" and status.state.value == "Running") or \
            (reason == "InitializerFailed" and status.state.value == "Failed"):
        return replace(status, reason=reason, message=message)
    return status


def with_stage_phases(statuses: dict[_R, _S], staging_dir: str | None, run: Callable[[list[str]], str],
                      tenant: str | None = None) -> dict[_R, _S]:
    """Running and failed jobs as their stage steps left them: *run(argv)* runs one command through the
    backend's transport (the stagingDir is on the cluster's storage), which prints each job's own phase file
    (:func:`read_each_argv`); *tenant*: the jobs are that tenant's (its folder, read as its user)."""
    wanted = {ref: phase_path(staging_dir, ref.uid, tenant) for ref, status in statuses.items()
              if staging_dir and status.state.value in ("Running", "Failed")
              and ref.uid and all(c.isalnum() or c == "-" for c in ref.uid)}
    if staging_dir and _WATCHED:  # a watched job that is not running stages nothing now
        for ref in statuses.keys() - wanted.keys():
            if phase_path(staging_dir, ref.uid, tenant) in _WATCHED:
                _WATCHED[phase_path(staging_dir, ref.uid, tenant)] = None
    if not wanted:
        return statuses
    paths = sorted(set(wanted.values()))
    docs = parse_each(paths, run(read_each_argv(paths)))
    for path in paths:
        if path in _WATCHED:
            _WATCHED[path] = docs.get(path)
    return {ref: with_phase(status, docs.get(wanted[ref])) if ref in wanted else status
            for ref, status in statuses.items()}
