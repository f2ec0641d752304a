"""``--dry-run`` is the first half of ``submit`` on Slurm too: on the real cluster (tests/harness/slurm.py, four
nodes of 2 CPUs, 2000 MB and 2 GPUs), ``sbatch --test-only`` is asked what ``sbatch`` is then really asked, and
a dry run and a submit exit with the same code and error line; the artifact the dry run printed is the one
submit handed sbatch. The cases are a representative subset of the corpus the local agreement test runs
(tests/integration/test_dry_run_agreement.py), the scheduler's refusals among them (more CPUs, GPUs or nodes
than a node or the partition has, a partition that does not exist); each job submit really queues is
cancelled at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bridge.adapters.base import Artifact
from bridge.adapters.slurm import SlurmAdapter
from tests import builders
from tests.integration.test_dry_run_agreement import ROOT, configured, recording, run_cli, sent_text

pytestmark = pytest.mark.slurm

#: every example; the golden cases; every fifth batch script of the Slurm oracle's corpus (sorted, so the
#: same ones each run)
FILES = sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("examples/*.sbatch"), *ROOT.glob("tests/cases/*.yaml"),
                *sorted(ROOT.glob("tests/integration/slurm/sbatch_corpus/*.sbatch"))[::5]])
#: what only the scheduler can tell: (name, batch script); all are refused but PENDS, which sbatch queues to pend
#: until the partition grows (--test-only alone would refuse them)
SCRIPTS = {
    "no-such-partition": "#!/bin/bash\n#SBATCH --partition=nosuch\ntrue\n",
    "more-cpus-than-a-node": "#!/bin/bash\n#SBATCH --nodes=1 --ntasks=1 --cpus-per-task=3\ntrue\n",
    "more-gpus-than-a-node": "#!/bin/bash\n#SBATCH --gpus-per-node=3\ntrue\n",
    "more-memory-than-a-node": "#!/bin/bash\n#SBATCH --mem=4000\ntrue\n",
    "more-nodes-than-the-cluster": "#!/bin/bash\n#SBATCH --nodes=9\ntrue\n",
    "more-nodes-than-the-partition": "#!/bin/bash\n#SBATCH --partition=long --nodes=3\ntrue\n",
}
PENDS = ("more-nodes-than-the-cluster", "more-nodes-than-the-partition")
SUBMISSION_FAILED = "sbatch: error: Batch job submission failed: "
SUBMITTED: dict[str, int] = {"agreed": 0, "refused": 0}


@pytest.fixture
def sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm_cluster) -> list[Artifact]:
    """The artifacts SlurmAdapter.submit is handed; every job it queued is cancelled when the test ends."""
    cluster = builders.cluster("slurm", "hpc", slurm={"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                               defaults={"partition": "debug",
                                         "launchCommand": [sys.executable, "-m", "bridge", "launch"]})
    from bridge.api.loader import to_yaml

    configured(monkeypatch, tmp_path, to_yaml([cluster]), tmp_path)
    handed, queued = recording(monkeypatch, SlurmAdapter)
    yield handed
    adapter = SlurmAdapter(cluster)
    for ref in queued:
        adapter.cancel(ref)


def _agree(file: str, sent: list[Artifact]) -> None:
    # --rerun: a TrainJob another test of this session submitted (its uid is its name's) is sent again
    dry = run_cli(["submit", file, "--cluster", "hpc", "--rerun", "--dry-run"])
    real = run_cli(["submit", file, "--cluster", "hpc", "--rerun"])
    assert real.code == dry.code, (dry, real)
    if dry.code:
        SUBMITTED["refused"] += 1
        assert dry.errors in (real.errors, [_without_detail(line) for line in real.errors]), (dry.errors, real.errors)
        assert _notes(real.err) == _notes(dry.err), (dry.err, real.err)
        return
    SUBMITTED["agreed"] += 1
    assert real.err.startswith(dry.err), (dry.err, real.err)
    assert sent, "submit exited 0 and sent nothing"
    assert sent_text(sent, dry.out, fresh_uids=file.endswith(".sbatch")) == dry.out


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if not line.startswith("hpcbridge: error:")]


def _without_detail(line: str) -> str:
    """Submit's refusal without the controller's detail, which sbatch prints before its reason only when it
    submits (``sbatch: error: CPU count per node can not be satisfied``): --test-only never receives it."""
    head, failed, reason = line.rpartition(SUBMISSION_FAILED)
    return head.split("sbatch: error: ")[0] + failed + reason if failed else line


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dry_run_and_submit_agree_on_slurm(path: Path, sent: list[Artifact]) -> None:
    _agree(str(path), sent)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_scheduler_answers_a_dry_run_as_it_answers_submit(name: str, sent: list[Artifact],
                                                             tmp_path: Path) -> None:
    path = tmp_path / f"{name}.sbatch"
    path.write_text(SCRIPTS[name])
    dry = run_cli(["submit", str(path), "--cluster", "hpc", "--dry-run"])
    from tests.harness import slurm_versions

    # 22.05 and 26.05 queue a job beyond its partition (EnforcePartLimits=NO) to pend; 24.11's sbatch refuses it
    if name in PENDS and slurm_versions.requested() != "24.11":
        assert dry.code == 0 and dry.out, dry
    else:
        assert dry.code == 1 and dry.errors and SUBMISSION_FAILED in dry.errors[0], dry
        assert dry.out == "", "a refused dry run printed an artifact"
    _agree(str(path), sent)


def test_the_slurm_cases_are_counted() -> None:
    """The count in the report: files and scheduler refusals (printed with -s)."""
    print(f"\nslurm dry-run agreement: {len(FILES)} corpus files + {len(SCRIPTS)} scheduler answers; "
          f"{SUBMITTED['agreed']} ran, {SUBMITTED['refused']} refused alike")
    assert len(FILES) >= 20


TWICE = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: sent-twice
  annotations:
    hpcbridge.io/sbatch.begin: now+3600   # pends until cancelled
spec:
  runtimeRef: {name: torch-distributed}
  trainer: {numNodes: 1, command: ["true"]}
"""


def test_a_trainjob_sent_before_gets_the_answer_submit_gives(sent: list[Artifact], tmp_path: Path) -> None:
    """A TrainJob submitted once: a dry run looks its uid up as submit does, so while its job pends both say
    that job is it and send nothing, and once it ended both refuse it as already run, in the same words."""
    path = tmp_path / "twice.yaml"
    path.write_text(TWICE)
    first = run_cli(["submit", str(path), "--cluster", "hpc"])
    assert first.code == 0 and sent, first
    job_id = first.out.split()[0]
    dry = run_cli(["submit", str(path), "--cluster", "hpc", "--dry-run"])
    real = run_cli(["submit", str(path), "--cluster", "hpc"])
    assert dry.code == real.code == 0 and len(sent) == 1, (dry, real)
    said = f"is already job {job_id} (Pending); nothing was submitted"
    assert said in dry.err and said in real.err, (dry.err, real.err)
    assert run_cli(["cancel", job_id, "--cluster", "hpc"]).code == 0
    import time

    deadline = time.monotonic() + 60
    while "Cancelled" not in run_cli(["status", job_id, "--cluster", "hpc"]).out:
        assert time.monotonic() < deadline, "the job was not cancelled"
        time.sleep(0.5)
    dry = run_cli(["submit", str(path), "--cluster", "hpc", "--dry-run"])
    real = run_cli(["submit", str(path), "--cluster", "hpc"])
    assert dry.code == real.code == 2 and dry.err == real.err and len(sent) == 1, (dry, real)
    assert f"already ran on cluster hpc as job {job_id}, Cancelled" in dry.errors[0], dry.errors
    assert dry.out == "", "a refused dry run printed an artifact"
