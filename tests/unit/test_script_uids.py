"""A batch script is a new job each time it is submitted, as with sbatch: a fresh uid per submission on every
backend where a second job can stand beside the first (the local cluster included), while a TrainJob file
keeps the uid derived from its namespace and name, which is what makes its submit idempotent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge import service
from bridge.adapters.local import LocalAdapter
from bridge.plan import derive_uid
from tests.builders import cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"
CLUSTERS = {"local": cluster("local", "local"), "hpc": cluster("slurm", "hpc"), "flux": cluster("flux", "flux"),
            "k8s": cluster("kubernetes", "k8s")}
SCRIPT = "#!/bin/bash\n#SBATCH -N 1\n#SBATCH -J sweep\n#HPCBRIDGE --image=busybox:1.36\nhostname\n"


def prepare(path: Path, target: str, flags: tuple[str, ...] = ()) -> service.Prepared:
    return service.prepare(service.read_input(str(path), flags), cluster=target, configured=CLUSTERS)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.sbatch"
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("target", ["local", "hpc", "flux"])
def test_each_submission_of_a_script_is_a_job_of_its_own(script: Path, target: str) -> None:
    first, second = prepare(script, target), prepare(script, target)
    assert first.plan.uid != second.plan.uid
    derived = derive_uid(service.read_input(str(script)).single_trainjob())
    assert derived not in (first.plan.uid, second.plan.uid)
    # the job runs under that uid, and the definition kept for migrate says so
    assert first.objects[-1].metadata.uid == first.plan.uid


def test_a_script_run_here_gets_a_state_directory_of_its_own(script: Path) -> None:
    """The local cluster's job id is the uid: a second run no longer replaces the first one's record and logs."""
    first, second = prepare(script, "local"), prepare(script, "local")
    assert isinstance(first.adapter, LocalAdapter)
    assert first.plan.uid in first.artifact.text() and second.plan.uid in second.artifact.text()
    assert first.plan.uid not in second.artifact.text()


def test_on_kubernetes_a_script_keeps_the_uid_of_its_name(script: Path) -> None:
    """A JobSet is named after its TrainJob and a name exists once: a second job cannot stand beside the first,
    so the script is found again by its derived uid, as a TrainJob file is."""
    derived = derive_uid(service.read_input(str(script)).single_trainjob())
    assert prepare(script, "k8s").plan.uid == prepare(script, "k8s").plan.uid == derived


@pytest.mark.parametrize("target", ["local", "hpc", "flux", "k8s"])
def test_a_trainjob_file_keeps_one_uid_so_its_submit_stays_idempotent(target: str) -> None:
    uids = {prepare(EXAMPLE, target).plan.uid for _ in range(2)}
    assert uids == {derive_uid(service.read_input(str(EXAMPLE)).single_trainjob())}


def test_a_script_array_here_has_elements_of_this_submission(script: Path) -> None:
    first, second = prepare(script, "local", ("--array=0-2",)), prepare(script, "local", ("--array=0-2",))
    assert len(first.elements) == 3 and len({e.plan.uid for e in first.elements}) == 3
    assert not {e.plan.uid for e in first.elements} & {e.plan.uid for e in second.elements}
    env = dict((entry.name, entry.value) for entry in first.elements[0].plan.env)
    assert env["SLURM_ARRAY_JOB_ID"] == first.plan.uid


def test_a_script_dependency_here_is_still_waited_for(script: Path) -> None:
    first, second = (prepare(script, "local", ("--dependency=afterok:123",)) for _ in range(2))
    assert first.waits_for == second.waits_for == "afterok:123" and first.plan.options.dependency is None
    assert first.plan.uid != second.plan.uid
