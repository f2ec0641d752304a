"""A TrainJob whose command runs torchrun itself (the Kubeflow SDK's ``bash -c "torchrun …"``), on the built-in
local cluster with the real torchrun: its workers' lines come out whole, each after its node and rank, as those of
the torchrun the launch starts do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.local]

ROOT = Path(__file__).resolve().parents[3]


def test_workers_of_a_torchrun_the_command_runs_come_out_whole_and_tagged(tmp_path: Path) -> None:
    """2 nodes x 2 workers under an unbuffered Python, torchrun started by ``bash -c`` with the PET_* variables
    the launch sets: before, the workers' halves of lines were glued on torchrun's one pipe, untagged."""
    import yaml

    pytest.importorskip("torch")
    (doc,) = yaml.safe_load_all((ROOT / "examples" / "torch-ddp.yaml").read_text())
    doc["metadata"]["annotations"]["hpcbridge.io/workdir"] = str(ROOT / "examples")
    doc["spec"]["trainer"].update(numProcPerNode=2, command=["bash", "-c", "torchrun torch_ddp.py"],
                                  env=[{"name": "PYTHONUNBUFFERED", "value": "1"}])
    path = tmp_path / "torchrun-itself.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = subprocess.run([sys.executable, "-m", "bridge", "submit", str(path)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()[1:]  # after the job's id
    assert sorted(line for line in lines if "grad=" in line) == [
        f"[node-{rank // 2} rank-{rank}] worker {rank}/4 (node {rank // 2}): grad=2.500 expected=2.500"
        for rank in range(4)], lines
    assert "[node-0 rank-0] ddp allreduce result: 10.000 OK" in lines and len(lines) == 5, lines
    assert all(re.match(r"\[node-[01]( rank-[0-3])?\] ", line) for line in result.stderr.splitlines()[:-1]), (
        result.stderr)
