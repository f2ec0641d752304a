"""How far a job's stage step got, as its adapter reads it for ``status``: ``<stagingDir>/jobs/<uid>/
initializer.json``, one JSON line the stage step replaces as it goes (bridge.staging.stage). Kept apart from
the stage step so adapters read it without importing the sources."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

PHASE_FILE = "initializer.json"


def phase_path(staging_dir: str, uid: str) -> str:
    return f"{staging_dir.rstrip('/')}/jobs/{uid}/{PHASE_FILE}"


def read_phase(staging_dir: str, uid: str) -> dict | None:
    try:
        return json.loads(Path(phase_path(staging_dir, uid)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def parse_phases(text: str) -> dict[str, dict]:
    """Phase documents, one JSON line each (``cat`` of several jobs' files through a transport), by uid."""
    found = {}
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("uid"), str):
            found[doc["uid"]] = doc
    return found


def phase_status(doc: Mapping | None) -> tuple[str, str] | None:
    """(reason, message) a job's status shows for its stage step: while it fetches, and when it failed."""
    if not doc:
        return None
    phase = doc.get("phase")
    if phase in ("dataset", "model"):
        return "Initializing", f"Initializing ({phase}): {doc.get('uri', '')}"
    if phase == "failed":
        return "InitializerFailed", (f"the {doc.get('role')} initializer failed for {doc.get('uri')}: "
                                     f"{doc.get('reason')}")
    return None


def with_phase(status, doc: Mapping | None):
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


def with_stage_phases(statuses: dict, staging_dir: str | None, cat: Callable[[list[str]], str]) -> dict:
    """Running and failed jobs as their stage steps left them: *cat(paths)* prints the phase files that
    exist (one call for all, through the backend's transport: the stagingDir is on the cluster's storage)."""
    wanted = [ref for ref, status in statuses.items() if status.state.value in ("Running", "Failed")
              and ref.uid and all(c.isalnum() or c == "-" for c in ref.uid)]
    if not staging_dir or not wanted:
        return statuses
    docs = parse_phases(cat([phase_path(staging_dir, ref.uid) for ref in wanted]))
    return {ref: with_phase(status, docs.get(ref.uid)) for ref, status in statuses.items()}
