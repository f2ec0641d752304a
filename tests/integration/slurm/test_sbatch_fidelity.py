"""sbatch fidelity, with real Slurm as the oracle (tests/harness/sbatch_oracle.py).

Every script of ``sbatch_corpus/`` is submitted natively (``sbatch --hold``) and through hpc-bridge
(``hpcbridge submit FILE --hold``); slurmctld's record of the two jobs — every ``scontrol show job`` field, the
stored script and the stored environment — must be identical but for ids, times and the uid hpc-bridge appends
to the comment. A script sbatch refuses must be refused by hpc-bridge too, in one line, with no job left behind.

The round trip through a TrainJob is held to the same record, both ways back to Slurm: the TrainJob submitted
(``convert --to trainjob``, ``hpcbridge submit``) and the batch script it converts back to, submitted with plain
sbatch (``convert --to trainjob | convert - --to sbatch``). Both run hpc-bridge's batch script, whose ``exec``
line must run the script's body unchanged; nothing else may differ (the first way sends that script on stdin,
so Slurm records no Command).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.sbatch_oracle import Oracle, Outcome, flags_of

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

CORPUS = Path(__file__).parent / "sbatch_corpus"
SCRIPTS = sorted(CORPUS.glob("*.sbatch"))
def _how_it_was_submitted(way: str, flags: list[str], difference: str) -> bool:
    """Whether *difference* is only in how sbatch was called, which the round trip cannot keep: a TrainJob that
    hpc-bridge submits goes to sbatch on stdin (no Command; Slurm 23.02 on record the SubmitLine
    ``sbatch --parsable``), and the script that comes back carries the corpus script's flags (given to
    ``convert``) inside it, so its SubmitLine is the native one without them. Nothing about the job itself."""
    stdin = re.fullmatch(r"(Command|SubmitLine): '([^']*)' natively, '(\(null\)|sbatch --parsable)' through "
                         r"hpc-bridge", difference)
    if way == "trainjob":
        return bool(stdin) and stdin.group(3) == {"Command": "(null)", "SubmitLine": "sbatch --parsable"}[
            stdin.group(1)]
    line = re.fullmatch(r"SubmitLine: '([^']*)' natively, '([^']*)' through hpc-bridge", difference)
    return bool(line and flags) and line.group(1).replace(" ".join(flags) + " ", "", 1) == line.group(2)
#: corpus scripts with no TrainJob form, refused at conversion in one line: heterogeneous jobs, and a value no
#: annotation can carry (quotes and backslashes inside a --comment)
NO_TRAINJOB_FORM = ("het-", "escaped-")


def _until(read, done, timeout: float = 60.0) -> str:
    """Read until *done* says so or *timeout* passes (bounds a hung test; the caller asserts)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def _cluster_config(tmp_path: Path, slurm_cluster) -> Path:
    path = tmp_path / "clusters.yaml"
    # no defaults: a batch script gets what sbatch would give it, and nothing a platform team configured
    path.write_text("apiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\nmetadata: {name: fidelity}\n"
                    f"spec:\n  type: slurm\n  slurm: {{transport: local, slurmConf: '{slurm_cluster.conf}'}}\n")
    return path


@pytest.fixture
def oracle(tmp_path, slurm_cluster) -> Oracle:
    workdir = tmp_path / "work"
    workdir.mkdir()
    return Oracle(slurm_cluster.conf, slurm_cluster.base / "state", _cluster_config(tmp_path, slurm_cluster),
                  "fidelity", workdir, dict(os.environ))


def _report(outcomes: list[Outcome], title: str, refusals: bool = True) -> str:
    rejected = sum(o.verdict == "rejected by both" for o in outcomes)
    identical = sum(o.verdict == "identical" for o in outcomes)
    refused = f"; {rejected} scripts sbatch refuses were refused by hpc-bridge too" if refusals else ""
    lines = [f"{title}: {identical}/{len(outcomes) - rejected} scripts sbatch accepts gave identical jobs{refused}"]
    for outcome in outcomes:
        if outcome.verdict not in ("identical", "rejected by both"):
            lines.append(f"  {outcome.script}: {outcome.verdict}")
            lines.extend(f"    {d}" for d in outcome.differences)
    return "\n".join(lines)


def test_corpus_is_large_enough() -> None:
    accepted = [p for p in SCRIPTS if not p.name.startswith("rejected-")]
    assert len(accepted) >= 40 and len(SCRIPTS) - len(accepted) >= 10


#: scripts a later Slurm reads differently than 22.05 did, and hpc-bridge (which reads directives as 22.05 to
#: 23.11 do) refuses in one line rather than guess the release: release -> scripts its sbatch accepts
ACCEPTED_FROM = {(24, 5): ("rejected-backslash-blank.sbatch",)}  # "\ " in a directive is a space from 24.05


def _release(slurm_cluster) -> tuple[int, int]:
    version = slurm_cluster.run("sbatch", "--version").stdout.split()[-1]
    return tuple(int(part) for part in version.split(".")[:2])  # type: ignore[return-value]


def test_every_script_makes_the_job_sbatch_makes(oracle: Oracle, slurm_cluster, capsys) -> None:
    outcomes = [oracle.check(path) for path in SCRIPTS]
    summary = _report(outcomes, "sbatch fidelity")
    with capsys.disabled():
        sys.stdout.write(f"\n{summary}\n")
    release = _release(slurm_cluster)
    newer = {script for since, scripts in ACCEPTED_FROM.items() if release >= since for script in scripts}
    bad = [o for o in outcomes if o.verdict not in ("identical", "rejected by both")
           and not (o.script in newer and o.verdict == "refused by hpc-bridge though sbatch accepts it")]
    assert not bad, summary
    # the corpus's names say which scripts sbatch refuses: the oracle agreed with every one
    for outcome in outcomes:
        refused = outcome.verdict == "rejected by both" or outcome.script in newer
        assert refused == outcome.script.startswith("rejected-"), outcome.script


@pytest.mark.parametrize("way", ["trainjob", "sbatch-back"])
def test_through_a_trainjob_the_same_job(way, tmp_path, slurm_cluster, capsys) -> None:
    # sbatch → TrainJob → Slurm (submitted, or converted back to a script and given to sbatch) is the job the
    # script is: node counts Slurm picks stay Slurm's, task and GPU totals stay totals, the environment is
    # sbatch's; a script with no TrainJob form is refused at conversion, in one line
    workdir = tmp_path / "work"
    workdir.mkdir()
    oracle = Oracle(slurm_cluster.conf, slurm_cluster.base / "state", _cluster_config(tmp_path, slurm_cluster),
                    "fidelity", workdir, dict(os.environ), way=way)
    outcomes, refused = [], []
    for path in SCRIPTS:
        if path.name.startswith("rejected-"):
            continue  # sbatch refuses them: test_every_script_makes_the_job_sbatch_makes
        outcome = oracle.check(path)
        if path.name.startswith(NO_TRAINJOB_FORM):
            errors = outcome.differences[0].splitlines() if outcome.differences else []
            assert outcome.verdict == "refused by hpc-bridge though sbatch accepts it" and len(errors) == 1, outcome
            assert errors[0].startswith("hpcbridge: error: ") and "no TrainJob form" in errors[0], errors
            refused.append(path.name)
            continue
        flags = flags_of(path.read_text())
        outcome.differences = [d for d in outcome.differences if not _how_it_was_submitted(way, flags, d)]
        if outcome.verdict == "different" and not outcome.differences:
            outcome.verdict = "identical"
        outcomes.append(outcome)
    summary = _report(outcomes, f"through a TrainJob ({way})", refusals=False) + \
        f"\n{len(refused)} scripts with no TrainJob form were refused at conversion: {', '.join(refused)}"
    with capsys.disabled():
        sys.stdout.write(f"\n{summary}\n")
    assert all(o.verdict == "identical" for o in outcomes), summary
    assert len(refused) == sum(p.name.startswith(NO_TRAINJOB_FORM) for p in SCRIPTS)


def test_oracle_sees_a_body_that_is_not_the_script(tmp_path) -> None:
    # the harness can fail the round trip: hpc-bridge's script must run the original body byte for byte
    from tests.harness.sbatch_oracle import runs_body

    original = b"#!/bin/bash\n#SBATCH -n 2\necho 'a  b'\n"
    good = b"#!/bin/bash\n#SBATCH --ntasks=2\nset -eu\nexec /bin/bash -c $'#!/bin/bash\\necho \\'a  b\\'\\n' job\n"
    assert runs_body(good, original) is None
    for bad in (good.replace(b"a  b", b"a b"), good.replace(b"exec ", b"")):
        assert runs_body(bad, original), bad


def test_oracle_sees_a_difference(oracle: Oracle, tmp_path) -> None:
    # the harness can fail: a flag given only to hpc-bridge is a difference it names
    path = CORPUS / "time-minutes.sbatch"
    native = oracle.native(path, [])
    bridged = oracle.bridged(path, ["--nice=5"])
    try:
        from tests.harness.sbatch_oracle import _component_ids, compare, read_job

        a, b = native.stdout.strip(), bridged.stdout.strip().splitlines()[-1]
        problems = compare(read_job(oracle.run, oracle.state_dir, a), read_job(oracle.run, oracle.state_dir, b),
                           _component_ids(oracle.run, a), _component_ids(oracle.run, b))
        assert any(p.startswith("Nice:") for p in problems), problems
    finally:
        oracle.run("scancel", native.stdout.strip(), bridged.stdout.strip().splitlines()[-1])


def test_heterogeneous_job_runs_with_status_logs_and_cancel(tmp_path, slurm_cluster) -> None:
    config = _cluster_config(tmp_path, slurm_cluster)
    env = {**os.environ, "HPCBRIDGE_CONFIG": str(config), "SLURM_CONF": str(slurm_cluster.conf)}
    script = tmp_path / "het.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -J het-e2e -c 1\n#SBATCH hetjob\n#SBATCH -N 1 --gres=gpu:1\n"
                      "echo leader $SLURM_JOB_ID components $SLURM_HET_SIZE\n"
                      "srun --het-group=1 bash -c 'echo gpu component sees $SLURM_JOB_GPUS'\n")

    def hpcbridge(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bridge", *argv], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)

    submitted = hpcbridge("submit", str(script), "--cluster", "fidelity", "--wait")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]
    status = hpcbridge("status", job_id, "--cluster", "fidelity", "-o", "json")
    assert '"Succeeded"' in status.stdout, status.stdout
    logs = hpcbridge("logs", job_id, "--cluster", "fidelity")
    assert f"leader {job_id} components 2" in logs.stdout and "gpu component sees" in logs.stdout, logs.stdout
    # refused where it cannot run as itself, in one line
    for backend in ("kubernetes", "flux"):
        refused = hpcbridge("render", str(script), "--to", backend)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert "heterogeneous job" in refused.stderr and "only on a Slurm cluster" in refused.stderr
    converted = hpcbridge("convert", str(script), "--to", "trainjob")
    assert converted.returncode == 2 and "no TrainJob form" in converted.stderr and not converted.stdout

    # a long one is cancelled whole: every component ends CANCELLED
    script.write_text("#!/bin/bash\n#SBATCH -J het-cancel\n#SBATCH hetjob\n#SBATCH -c 1\nsleep 300\n")
    running = hpcbridge("submit", str(script), "--cluster", "fidelity")
    assert running.returncode == 0, running.stderr
    job_id = running.stdout.split()[0]
    _until(lambda: hpcbridge("status", job_id, "--cluster", "fidelity", "-o", "json").stdout,
           lambda out: '"Running"' in out)
    cancelled = hpcbridge("cancel", job_id, "--cluster", "fidelity")
    assert cancelled.returncode == 0, cancelled.stderr
    final = _until(lambda: hpcbridge("status", job_id, "--cluster", "fidelity", "-o", "json").stdout,
                   lambda out: '"Cancelled"' in out)
    assert '"Cancelled"' in final, final
    states = slurm_cluster.run("squeue", "--noheader", "--states=all", "--Format=JobID:|,HetJobID:|,State:|").stdout
    components = [line.split("|") for line in states.splitlines() if line.split("|")[1].strip() == job_id]
    assert len(components) == 2 and all(c[2].strip() == "CANCELLED" for c in components), states
