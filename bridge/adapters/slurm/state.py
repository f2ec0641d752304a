"""Slurm's job states → JobState, and parsing of the text squeue/sacct prints (no asserts, typed errors)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from bridge.adapters.base import JobState
from bridge.errors import BackendUnavailable

#: every state Slurm 22.05 to 26.05 reports (squeue %T / sacct State), with the reason we add when the state
#: alone folds several causes into one of ours; any other is Unknown, reported by its name
STATE_MAP: dict[str, tuple[JobState, str | None]] = {
    "PENDING": (JobState.PENDING, None),
    "CONFIGURING": (JobState.PENDING, "Configuring"),
    "REQUEUED": (JobState.PENDING, "Requeued"),
    "EXPEDITING": (JobState.PENDING, "ExpeditedRequeue"),  # 26.05: requeued to start again first
    "REQUEUE_FED": (JobState.PENDING, "Requeued"),
    "REQUEUE_HOLD": (JobState.PENDING, "RequeueHold"),
    "RESV_DEL_HOLD": (JobState.PENDING, "ReservationDeleted"),
    "RUNNING": (JobState.RUNNING, None),
    "RESIZING": (JobState.RUNNING, "Resizing"),
    "SIGNALING": (JobState.RUNNING, "Signaling"),
    "COMPLETING": (JobState.COMPLETING, None),
    "STAGE_OUT": (JobState.COMPLETING, "StageOut"),
    "COMPLETED": (JobState.SUCCEEDED, None),
    "FAILED": (JobState.FAILED, None),
    "BOOT_FAIL": (JobState.FAILED, "BootFail"),
    "NODE_FAIL": (JobState.FAILED, "NodeFail"),
    "OUT_OF_MEMORY": (JobState.FAILED, "OutOfMemory"),
    "PREEMPTED": (JobState.FAILED, "Preempted"),
    "SPECIAL_EXIT": (JobState.FAILED, "SpecialExit"),
    "CANCELLED": (JobState.CANCELLED, None),
    "REVOKED": (JobState.CANCELLED, "Revoked"),
    "TIMEOUT": (JobState.TIMEOUT, None),
    "DEADLINE": (JobState.TIMEOUT, "Deadline"),
    "SUSPENDED": (JobState.SUSPENDED, None),
    "STOPPED": (JobState.SUSPENDED, "Stopped"),
}

#: squeue --Format fields; the free-text comment goes last so a '|' inside it cannot shift the others
SQUEUE_FIELDS = ("JobID", "HetJobID", "State", "Reason", "exit_code", "NodeList", "Name", "Comment")
SQUEUE_FORMAT = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "NodeList", "JobName", "Reason")


@dataclass(frozen=True)
class SlurmRecord:
    job_id: str
    state: JobState
    slurm_state: str
    reason: str | None
    exit_code: int | None
    nodes: str
    name: str
    comment: str = ""


def map_state(slurm_state: str) -> tuple[JobState, str | None]:
    # sacct prints "CANCELLED by 0"; squeue may add "+" flags
    base = slurm_state.split()[0].rstrip("+") if slurm_state.strip() else ""
    return STATE_MAP.get(base, (JobState.UNKNOWN, f"UnknownSlurmState:{base or '?'}"))


def decode_wait_status(raw: int) -> int:
    """squeue's exit_code is the raw wait(2) status: exit code in the high byte, signal in the low bits."""
    signal = raw & 0x7F
    return 128 + signal if signal else (raw >> 8) & 0xFF


def decode_exit_pair(text: str) -> int | None:
    """sacct/scontrol's ``code:signal`` (and squeue's exit_code from Slurm 23.02 on)."""
    code, _, signal = text.partition(":")
    if not code.isdigit() or (signal and not signal.isdigit()):
        return None
    return 128 + int(signal) if signal and int(signal) else int(code)


def decode_squeue_exit(text: str) -> int | None:
    """squeue's exit_code: the raw wait status up to Slurm 22.05 (``768``), ``code:signal`` after (``3:0``)."""
    text = text.strip()
    if text.isdigit():
        return decode_wait_status(int(text))
    return decode_exit_pair(text) if ":" in text else None


def _reason(slurm_reason: str, mapped: str | None) -> str | None:
    reason = slurm_reason.strip()
    if reason in ("", "None", "(null)"):
        return mapped
    return f"{mapped}: {reason}" if mapped else reason


def parse_squeue(text: str, only: Collection[str] | None = None) -> list[SlurmRecord]:
    """squeue's rows as records, a heterogeneous job's components folded into one; with *only*, just the jobs
    with those ids (the rows of a whole cluster's listing that are not followed are never built)."""
    records = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(parts) != len(SQUEUE_FIELDS):
            raise BackendUnavailable("slurm", f"unexpected squeue output on line {line_no}: {line[:120]!r}")
        job_id, het_id, slurm_state, reason, raw_exit, nodes, name, comment = parts
        # a heterogeneous job's components are separate jobs to squeue; hpc-bridge knows them by the leader's id
        leader = het_id.strip() if het_id.strip().isdigit() else job_id.strip()
        if only is not None and leader not in only:
            continue
        state, mapped_reason = map_state(slurm_state)
        exit_code = decode_squeue_exit(raw_exit) if state.finished else None
        records.append(SlurmRecord(leader, state, slurm_state.strip(), _reason(reason, mapped_reason),
                                   exit_code, nodes.strip(), name.strip(), comment.removesuffix("|").strip()))
    return combine_components(records)


#: a heterogeneous job is as far along as its least advanced component, and ends as its worst one
_UNFINISHED_ORDER = (JobState.PENDING, JobState.SUSPENDED, JobState.RUNNING, JobState.COMPLETING)
_FINISHED_ORDER = (JobState.UNKNOWN, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED, JobState.SUCCEEDED)


def combine_components(records: list[SlurmRecord]) -> list[SlurmRecord]:
    """One record per job id: a heterogeneous job's components folded into one, in squeue's order."""
    groups: dict[str, list[SlurmRecord]] = {}
    for record in records:
        groups.setdefault(record.job_id, []).append(record)
    combined = []
    for parts in groups.values():
        if len(parts) == 1:
            combined.append(parts[0])
            continue
        unfinished = [p for p in parts if not p.state.finished]
        order = _UNFINISHED_ORDER if unfinished else _FINISHED_ORDER
        pool = unfinished or parts
        chosen = min(pool, key=lambda p: order.index(p.state) if p.state in order else len(order))
        codes = [p.exit_code for p in parts if p.exit_code is not None]
        nodes = ",".join(dict.fromkeys(p.nodes for p in parts if p.nodes and p.nodes not in ("(null)", "None assigned")))
        lead = parts[0]
        combined.append(SlurmRecord(lead.job_id, chosen.state, chosen.slurm_state, chosen.reason,
                                    max(codes) if codes and not unfinished else None, nodes or lead.nodes,
                                    lead.name, lead.comment))
    return combined


def parse_sacct(text: str) -> list[SlurmRecord]:
    """``sacct -X -n -P -o JobIDRaw,State,ExitCode,NodeList,JobName,Reason`` (also ``sacct -c``)."""
    records = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or not parts[0].strip():
            continue
        job_id, slurm_state, exit_pair = parts[0], parts[1], parts[2]
        nodes = parts[3] if len(parts) > 3 else ""
        name = parts[4] if len(parts) > 4 else ""
        reason = parts[5] if len(parts) > 5 else ""
        state, mapped = map_state(slurm_state)
        records.append(SlurmRecord(job_id.strip(), state, slurm_state.strip(), _reason(reason, mapped),
                                   decode_exit_pair(exit_pair.strip()), nodes.strip(), name.strip()))
    return records
