"""Staging progress on the live status line: the stage step puts the bytes it has written so far into its phase
file, and a terminal's status line shows ``staging <role> <uri> <bytes> <rate>`` from it (a fake clock and
terminal here)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bridge.cli.progress import ERASE, StagingMeter, StatusLine
from bridge.plan.model import StagingPlan
from bridge.service.staging_cache import staging_phase
from bridge.staging.phase import phase_path
from bridge.staging.stage import reporting

MIB = 2**20


def test_the_meter_shows_bytes_and_the_rate_since_its_last_look() -> None:
    docs: list[dict[str, Any] | None] = [
        {"phase": "dataset", "uri": "s3://b/d", "bytes": MIB},
        {"phase": "dataset", "uri": "s3://b/d", "bytes": 5 * MIB},
        {"phase": "dataset", "uri": "s3://b/d", "bytes": 5 * MIB},  # nothing new: the last rate stays
        {"phase": "model", "uri": "hf://org/m", "bytes": 512},  # the next source starts its own count
        {"phase": "ready"},
        None,
    ]
    now = [10.0]
    meter = StagingMeter(lambda: docs.pop(0), clock=lambda: now[0])
    seen = []
    for step in (0, 2, 1, 1, 1, 1):
        now[0] += step
        seen.append(meter.text())
    assert seen == ["staging dataset s3://b/d 1.0 MiB 0 B/s", "staging dataset s3://b/d 5.0 MiB 2.0 MiB/s",
                    "staging dataset s3://b/d 5.0 MiB 2.0 MiB/s", "staging model hf://org/m 512 B 0 B/s", None, None]


def test_the_status_line_carries_the_detail_on_a_terminal_only(capsys) -> None:
    now = [0.0]
    detail = StagingMeter(lambda: {"phase": "dataset", "uri": "file:///d", "bytes": 3 * MIB}, clock=lambda: now[0])
    with StatusLine("default/train", "Running", enabled=True, interval=60, clock=lambda: now[0],
                    detail=detail.text) as line:
        now[0] += 12
        line.draw()
        print("a job line")
    out, err = capsys.readouterr()
    assert out == "a job line\n"
    assert err == f"{ERASE}default/train Running 12s  staging dataset file:///d 3.0 MiB 0 B/s{ERASE}"
    with StatusLine("default/train", detail=detail.text) as line:  # pytest's streams are no terminal
        line.update("Running")
    assert capsys.readouterr() == ("", "")


def test_a_download_reports_what_it_has_written_while_it_runs(tmp_path: Path) -> None:
    reports: list[int] = []
    reported = threading.Event()

    def report(**doc: int) -> None:
        reports.append(doc["bytes"])
        if doc["bytes"] >= 3000:
            reported.set()

    def download(into: Path) -> None:
        (into / "sub").mkdir(parents=True)
        (into / "a").write_bytes(b"x" * 1000)
        (into / "sub" / "b").write_bytes(b"y" * 2000)
        assert reported.wait(60), reports  # the sampler saw both files before the download ended

    reporting(download, report, interval=0.01)(tmp_path / "data")
    assert reports[-1] == 3000 and reports == sorted(reports)


def test_the_cli_reads_a_jobs_phase_file_where_this_machine_sees_the_staging_dir(tmp_path: Path) -> None:
    staging = StagingPlan((), str(tmp_path))
    read = staging_phase(SimpleNamespace(staging=staging, backend="local"), "uid-1")  # type: ignore[arg-type]
    assert read is not None and read() is None  # not started yet
    path = Path(phase_path(str(tmp_path), "uid-1"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"phase": "dataset", "uri": "s3://b/d", "bytes": 42}) + "\n")
    assert read() == {"phase": "dataset", "uri": "s3://b/d", "bytes": 42}
    kubernetes = SimpleNamespace(staging=StagingPlan(()), backend="kubernetes")  # the initializer volume: no phase file here
    assert staging_phase(kubernetes, "uid-1") is None  # type: ignore[arg-type]
    assert staging_phase(SimpleNamespace(staging=None, backend="local"), "uid-1") is None  # type: ignore[arg-type]


def test_a_remote_clusters_line_shows_what_the_jobs_poll_read_through_the_transport() -> None:
    """Slurm over SSH, Flux: the stagingDir is the cluster's, so the line shows the phase document the job's
    poll read anyway (one command through the backend's transport), never a file of this machine's."""
    from bridge.adapters.base import JobRef, JobState, JobStatus
    from bridge.staging.phase import with_stage_phases

    remote = "/cluster/only/staging"
    plan = SimpleNamespace(staging=StagingPlan((), remote), backend="slurm")
    read = staging_phase(plan, "uid-r")  # type: ignore[arg-type]
    assert read is not None and read() is None  # not polled yet
    ref, other = JobRef("hpc", "slurm", "7", "uid-r", "r"), JobRef("hpc", "slurm", "8", "uid-o", "o")
    sent: list[list[str]] = []
    written = [MIB, 9 * MIB, 10 * MIB]

    def transport(argv: list[str]) -> str:  # what READ_EACH prints on the cluster, one line per path
        sent.append(argv)
        doc = {"phase": "dataset", "uri": "s3://b/d", "bytes": written.pop(0)}
        return "".join(f"{path}\t{json.dumps(doc) if 'uid-r' in path else ''}\n" for path in argv[4:])

    statuses = {ref: JobStatus(ref, JobState.RUNNING), other: JobStatus(other, JobState.RUNNING)}
    now = [0.0]
    meter = StagingMeter(read, clock=lambda: now[0])
    with_stage_phases(statuses, remote, transport)
    assert meter.text() == "staging dataset s3://b/d 1.0 MiB 0 B/s"
    now[0] = 2.0
    with_stage_phases(statuses, remote, transport)
    assert meter.text() == "staging dataset s3://b/d 9.0 MiB 4.0 MiB/s"
    assert len(sent) == 2 and phase_path(remote, "uid-r") in sent[0]  # the poll's own read, nothing more
    with_stage_phases(statuses, remote, lambda argv: "".join(f"{path}\t\n" for path in argv[4:]))
    assert read() is None and meter.text() is None  # staged: the job's phase file says nothing more
    with_stage_phases(statuses, remote, transport)
    assert read() is not None
    with_stage_phases({ref: JobStatus(ref, JobState.SUCCEEDED)}, remote, transport)
    assert read() is None and len(sent) == 3  # ended: nothing read, nothing shown
