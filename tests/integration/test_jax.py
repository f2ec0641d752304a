"""examples/jax-allgather.yaml on the built-in jax-distributed runtime, unchanged, on the local cluster, real
Slurm across network-namespace hosts and Flux (when flux-core is on PATH): two processes, one per node, join
through the coordinates hpcbridge launch gives them and allgather their ids (CPU jax from PyPI)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from bridge import service
from bridge.adapters.base import JobState
from tests.integration.engines import LAUNCH, cluster_entry, finished

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def example(workdir: Path) -> str:
    """The example with this checkout's Python (it has jax) and its directory as the working directory."""
    doc = yaml.safe_load((ROOT / "examples" / "jax-allgather.yaml").read_text())
    doc["metadata"]["annotations"]["hpcbridge.io/workdir"] = str(ROOT / "examples")
    doc["spec"]["trainer"]["command"][0] = sys.executable
    return yaml.safe_dump(doc)


def run(cluster) -> tuple[JobState, str]:
    source = service.read_input("-", stdin=example(ROOT))
    prepared = service.prepare(source, cluster=cluster.name, configured={cluster.name: cluster})
    ref = service.submit(prepared, if_finished="rerun").ref
    status = finished(prepared.adapter, ref, timeout=240)
    return status.state, "".join(service.logs(prepared.adapter, ref.job_id))


def check(state: JobState, text: str) -> None:
    assert state == JobState.SUCCEEDED, text
    assert "allgather result: OK" in text, text
    assert sorted(re.findall(r"process \d/\d: allgather \[[\d, ]*\]", text)) == [
        "process 0/2: allgather [0, 1]", "process 1/2: allgather [0, 1]"]


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("flux-cli", marks=pytest.mark.flux)], indirect=True)
def test_jax_allgather_on_local_and_flux(engine) -> None:
    pytest.importorskip("jax", reason="jax is not installed (scripts/setup.sh --all installs it)")
    check(*run(engine.cluster))


@pytest.mark.slurm
@pytest.mark.mpi
def test_jax_allgather_across_slurm_hosts(netns_slurm, tmp_path, monkeypatch) -> None:
    pytest.importorskip("jax", reason="jax is not installed (scripts/setup.sh --all installs it)")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    cluster = cluster_entry("jax-slurm", {"type": "slurm", "slurm": {"slurmConf": str(netns_slurm.conf)},
                                          "defaults": {"launchCommand": LAUNCH}})
    state, text = run(cluster)
    check(state, text)
