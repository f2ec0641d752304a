"""XGBoost on the built-in xgboost-distributed runtime, the same on the local cluster, real Slurm across
network-namespace hosts and Flux (when flux-core is on PATH): workers train on their own shards through
XGBoost's collective and end with the identical model (xgboost-cpu from PyPI).

- examples/xgboost-train.yaml unchanged: Kubeflow's way, task 0's script runs the tracker;
- HPCBRIDGE_XGBOOST_TRACKER=launch with 2 workers per node: node 0's launch runs the tracker, the script has
  no tracker code, every counted worker starts (task ids node*G+local) and the collective ranks follow them;
- a worker that dies before it joins fails the job with its exit code instead of leaving the others waiting
  on the tracker.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from bridge import service
from bridge.adapters.base import JobState
from tests import builders
from tests.integration.engines import LAUNCH, cluster_entry, finished

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

#: no tracker code: node 0's launch runs it
NO_TRACKER = """\
import hashlib, os
import numpy as np
import xgboost as xgb
from xgboost import collective as coll

task = os.environ["DMLC_TASK_ID"]
if os.environ.get("FAIL_TASK") == task:
    raise SystemExit(int(os.environ["FAIL_CODE"]))
rng = np.random.default_rng(11)
x = rng.normal(size=(2000, 5)); y = (x[:, 0] - x[:, 3] > 0).astype(int)
n = int(os.environ["DMLC_NUM_WORKER"])
with coll.CommunicatorContext(dmlc_tracker_uri=os.environ["DMLC_TRACKER_URI"],
                              dmlc_tracker_port=int(os.environ["DMLC_TRACKER_PORT"]), dmlc_task_id=task,
                              dmlc_retry=30):
    part = slice(int(task), None, n)
    booster = xgb.train({"tree_method": "hist", "objective": "binary:logistic", "nthread": 1},
                        xgb.DMatrix(x[part], label=y[part]), num_boost_round=5)
    digest = hashlib.sha256("".join(booster.get_dump(dump_format="json")).encode()).hexdigest()[:16]
    print(f"worker {coll.get_rank()}/{coll.get_world_size()} task {task}: model {digest}", flush=True)
"""


def trainjob(name: str, command: list[str], workdir: Path, procs: int | None = None,
             env: dict[str, str] | None = None) -> str:
    trainer: dict = {"numNodes": 2, "command": command,
                     "env": [{"name": key, "value": value} for key, value in (env or {}).items()]}
    if procs:
        trainer["numProcPerNode"] = procs
    return yaml.safe_dump(builders.trainjob_doc(name, runtime="xgboost-distributed",
                                                annotations={"hpcbridge.io/workdir": str(workdir)}, trainer=trainer))


def example() -> str:
    doc = yaml.safe_load((ROOT / "examples" / "xgboost-train.yaml").read_text())
    doc["metadata"]["annotations"]["hpcbridge.io/workdir"] = str(ROOT / "examples")
    doc["spec"]["trainer"]["command"][0] = sys.executable  # this checkout's Python has xgboost
    return yaml.safe_dump(doc)


def run(cluster, text: str) -> tuple[JobState, int | None, str]:
    prepared = service.prepare(service.read_input("-", stdin=text), cluster=cluster.name,
                               configured={cluster.name: cluster})
    ref = service.submit(prepared, if_finished="rerun").ref
    status = finished(prepared.adapter, ref, timeout=240)
    return status.state, status.exit_code, "".join(service.logs(prepared.adapter, ref.job_id))


def models(text: str) -> dict[str, str]:
    """task id → model digest, from every worker's line."""
    found = re.findall(r"worker (\d+)/(\d+) task (\d+): model ([0-9a-f]{16})", text)
    for rank, _size, task, _digest in found:
        assert int(rank) == int(task), text  # the tracker ranks them by task id
    return {task: digest for _rank, _size, task, digest in found}


def check_example(state: JobState, text: str) -> None:
    assert state == JobState.SUCCEEDED, text
    trained = models(text)
    assert sorted(trained) == ["0", "1"], text
    assert len(set(trained.values())) == 1, text  # both workers hold the same model


def check_launch_tracker(cluster, workdir: Path) -> None:
    (workdir / "train.py").write_text(NO_TRACKER)
    state, _code, text = run(cluster, trainjob("xgb-launch", [sys.executable, "train.py"], workdir, procs=2,
                                               env={"HPCBRIDGE_XGBOOST_TRACKER": "launch"}))
    assert state == JobState.SUCCEEDED, text
    trained = models(text)
    assert sorted(trained) == ["0", "1", "2", "3"], text
    assert len(set(trained.values())) == 1, text


def check_dead_worker(cluster, workdir: Path, codes: tuple[int, ...] = (7,)) -> None:
    (workdir / "train.py").write_text(NO_TRACKER)
    state, code, text = run(cluster, trainjob("xgb-dies", [sys.executable, "train.py"], workdir,
                                              env={"HPCBRIDGE_XGBOOST_TRACKER": "launch", "FAIL_TASK": "1",
                                                   "FAIL_CODE": "7"}))
    assert state == JobState.FAILED, text
    assert code in codes, text
    assert "model" not in text, text  # nobody trained alone


@pytest.fixture(autouse=True)
def _xgboost() -> None:
    pytest.importorskip("xgboost", reason="xgboost is not installed (scripts/setup.sh --all installs xgboost-cpu)")


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("flux-cli", marks=pytest.mark.flux)], indirect=True)
def test_the_example_trains_one_model_on_local_and_flux(engine) -> None:
    state, _code, text = run(engine.cluster, example())
    check_example(state, text)


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("flux-cli", marks=pytest.mark.flux)], indirect=True)
def test_the_launch_runs_the_tracker_and_every_worker_on_local_and_flux(engine, tmp_path) -> None:
    check_launch_tracker(engine.cluster, tmp_path)


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("flux-cli", marks=pytest.mark.flux)], indirect=True)
def test_a_dead_worker_fails_the_job_on_local_and_flux(engine, tmp_path) -> None:
    check_dead_worker(engine.cluster, tmp_path)


@pytest.fixture
def netns_cluster(netns_slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return cluster_entry("xgb-slurm", {"type": "slurm", "slurm": {"slurmConf": str(netns_slurm.conf)},
                                       "defaults": {"launchCommand": LAUNCH}})


@pytest.mark.slurm
@pytest.mark.mpi
def test_xgboost_across_slurm_hosts(netns_cluster, tmp_path) -> None:
    state, _code, text = run(netns_cluster, example())
    check_example(state, text)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "xgboost_train.py", work)
    check_launch_tracker(netns_cluster, work)
    # srun ends with its highest task code: the worker's 7, or 143 of a worker it stopped (SIGTERM)
    check_dead_worker(netns_cluster, work, codes=(7, 143))
