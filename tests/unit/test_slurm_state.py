"""Parsing what squeue prints, and reading hpc-bridge's identity back from a job's comment."""

from __future__ import annotations

import pytest

from bridge.adapters.base import JobState
from bridge.adapters.slurm.render import comment_uid, identity_comment
from bridge.adapters.slurm.state import SQUEUE_FIELDS, parse_squeue

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def line(job: str, het: str, state: str, exit_code: str = "0", nodes: str = "node1", name: str = "j",
         comment: str = f"hpcbridge.io/uid={UID}") -> str:
    values = {"JobID": job, "HetJobID": het, "State": state, "Reason": "None", "exit_code": exit_code,
              "NodeList": nodes, "Name": name, "Comment": comment}
    return "|".join(values[field] for field in SQUEUE_FIELDS) + "|"


def test_plain_jobs_are_one_record_each() -> None:
    records = parse_squeue("\n".join([line("7", "N/A", "RUNNING"), line("8", "N/A", "PENDING")]))
    assert [(r.job_id, r.state) for r in records] == [("7", JobState.RUNNING), ("8", JobState.PENDING)]


@pytest.mark.parametrize(("states", "exits", "expected", "code"), [
    (("RUNNING", "RUNNING"), ("0", "0"), JobState.RUNNING, None),
    (("RUNNING", "PENDING"), ("0", "0"), JobState.PENDING, None),      # as far as the least advanced
    (("COMPLETED", "RUNNING"), ("0", "0"), JobState.RUNNING, None),    # not over while one runs
    (("COMPLETED", "COMPLETED"), ("0", "0"), JobState.SUCCEEDED, 0),
    (("COMPLETED", "FAILED"), ("0", "768"), JobState.FAILED, 3),       # ends as the worst
    (("CANCELLED", "COMPLETED"), ("0", "0"), JobState.CANCELLED, 0),
    (("TIMEOUT", "FAILED"), ("0", "256"), JobState.FAILED, 1),
])
def test_heterogeneous_components_fold_into_the_leader(states, exits, expected, code) -> None:
    text = "\n".join([line("12", "12", states[0], exits[0], "node1"), line("13", "12", states[1], exits[1], "node2"),
                      line("14", "N/A", "PENDING")])
    records = parse_squeue(text)
    assert [r.job_id for r in records] == ["12", "14"]
    het = records[0]
    assert (het.state, het.exit_code) == (expected, code)
    assert het.nodes == "node1,node2" and comment_uid(het.comment) == UID


def test_a_listing_read_for_some_jobs_builds_only_theirs_a_het_job_by_its_leaders_id() -> None:
    text = "\n".join([line("12", "12", "RUNNING"), line("13", "12", "PENDING"), line("14", "N/A", "PENDING"),
                      line("15", "N/A", "RUNNING")])
    assert [(r.job_id, r.state) for r in parse_squeue(text, only={"12", "15"})] == [
        ("12", JobState.PENDING), ("15", JobState.RUNNING)]
    assert parse_squeue(text, only=set()) == []


def test_identity_is_appended_to_the_users_comment_and_read_from_the_end() -> None:
    assert identity_comment(UID, None) == f"hpcbridge.io/uid={UID}"
    assert identity_comment(UID, "nightly run #4") == f"nightly run #4 hpcbridge.io/uid={UID}"
    assert comment_uid(identity_comment(UID, "nightly run #4")) == UID
    # a user's comment that mentions another uid does not hide (or fake) the one hpc-bridge appended
    assert comment_uid(identity_comment(UID, "copy of hpcbridge.io/uid=other")) == UID
    # a job submitted by an earlier release carries the uid first
    assert comment_uid(f"hpcbridge.io/uid={UID} nightly run") == UID
    assert comment_uid("(null)") is None and comment_uid("") is None


@pytest.mark.parametrize(("printed", "state", "code"), [
    ("768", "FAILED", 3),        # Slurm 22.05: the raw wait status
    ("3:0", "FAILED", 3),        # Slurm 23.02 on: code:signal
    ("0:9", "CANCELLED", 137),   # killed by SIGKILL
    ("0:0", "COMPLETED", 0),
    ("0", "COMPLETED", 0),
    ("0:0", "RUNNING", None),    # not finished: no exit code yet
    ("N/A", "FAILED", None),     # nothing readable is no code, never a guess
])
def test_exit_code_in_both_forms_squeue_prints(printed, state, code) -> None:
    (record,) = parse_squeue(line("7", "N/A", state, printed))
    assert record.exit_code == code


class ListingTransport:
    """squeue as it answers: --jobs=LIST those jobs, else every job; each argv kept."""

    def __init__(self, jobs: list[str]) -> None:
        self.jobs, self.argvs = jobs, []

    def run(self, argv, stdin=None, timeout=None, resend=True):  # type: ignore[no-untyped-def]
        from bridge.adapters.transport import CommandResult

        self.argvs.append(list(argv))
        asked = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--jobs=")), None)
        shown = [job for job in self.jobs if asked is None or job in asked]
        return CommandResult(tuple(argv), 0, "\n".join(line(job, "N/A", "PENDING") for job in shown) + "\n", "")


@pytest.mark.parametrize("followed", [3, 257, 1000])
def test_a_poll_of_many_jobs_reads_one_listing_not_a_list_squeue_matches_one_by_one(followed: int) -> None:
    """Up to SQUEUE_IDS_MAX jobs are asked for by id; more are read from one listing of every job (squeue
    matches each job against its --jobs list one by one: quadratic), and the same statuses come back."""
    from bridge.adapters.base import JobRef
    from bridge.adapters.slurm import SQUEUE_IDS_MAX, SlurmAdapter
    from tests import builders

    others = [str(job) for job in range(5000, 5100)]  # other jobs of the cluster: listed, not followed
    mine = [str(job) for job in range(1, followed + 1)]
    transport = ListingTransport(others + mine)
    adapter = SlurmAdapter(builders.cluster("slurm", "hpc"), transport=transport)  # type: ignore[arg-type]
    adapter._with_stage_phases = lambda statuses: statuses  # type: ignore[method-assign]  # no phase files here
    refs = [JobRef("hpc", "slurm", job, UID, "j") for job in mine]
    statuses = adapter.poll(refs)
    assert {ref.job_id: status.state for ref, status in statuses.items()} == {job: JobState.PENDING for job in mine}
    (argv,) = transport.argvs
    assert any(a.startswith("--jobs=") for a in argv) == (followed <= SQUEUE_IDS_MAX), argv


class QueueTransport:
    """squeue over a queue of (job id, uid, user, state): --jobs=LIST and --me (user "me") honoured."""

    def __init__(self, jobs: list[tuple[str, str, str, str]]) -> None:
        self.jobs, self.argvs = jobs, []

    def run(self, argv, stdin=None, timeout=None, resend=True):  # type: ignore[no-untyped-def]
        from bridge.adapters.transport import CommandResult

        self.argvs.append(list(argv))
        asked = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--jobs=")), None)
        shown = [line(job, "N/A", state, comment=f"hpcbridge.io/uid={uid}") for job, uid, user, state in self.jobs
                 if (asked is None or job in asked) and ("--me" not in argv or user == "me")]
        return CommandResult(tuple(argv), 0, "\n".join(shown) + "\n", "")


@pytest.mark.parametrize(("recorded", "answer", "listing_read"), [
    ("10", "10", False),   # its own live job: asked for by id, the queue not read
    ("11", "10", True),    # another TrainJob's job (the annotation is the tenant's to write)
    ("20", "10", True),    # another user's job that carries this uid: squeue --me never shows it
    ("9", "10", True),     # a finished job of this uid: a newer one (a rerun) may be live
    ("1,2", "10", True),   # not a job id at all: never put on squeue's command line
    (None, "10", True),
])
def test_a_recorded_job_id_is_a_hint_checked_against_the_job_it_names(recorded, answer, listing_read) -> None:
    from bridge.adapters.base import Identity
    from bridge.adapters.slurm import SlurmAdapter
    from tests import builders

    transport = QueueTransport([("9", UID, "me", "CANCELLED"), ("10", UID, "me", "PENDING"),
                                ("11", "other-uid", "me", "RUNNING"), ("20", UID, "mallory", "RUNNING")])
    adapter = SlurmAdapter(builders.cluster("slurm", "hpc"), transport=transport)  # type: ignore[arg-type]
    found = adapter.find([Identity(UID, "j", "ns", recorded)])
    assert {uid: status.ref.job_id for uid, status in found.items()} == {UID: answer}
    assert found[UID].state == JobState.PENDING
    assert all("--me" in argv for argv in transport.argvs)
    by_id = [argv for argv in transport.argvs if any(arg.startswith("--jobs=") for arg in argv)]
    assert [argv for argv in by_id] == ([] if recorded in (None, "1,2") else [by_id[0]])
    assert by_id == [] or f"--jobs={recorded}" in by_id[0]
    assert (len(transport.argvs) > len(by_id)) == listing_read, transport.argvs
