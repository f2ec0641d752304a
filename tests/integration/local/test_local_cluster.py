"""The built-in local cluster runs real processes: Open MPI, torchrun and plain commands on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import builders

pytestmark = [pytest.mark.integration, pytest.mark.local]

ROOT = Path(__file__).resolve().parents[3]


def submit(path: Path, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", "submit", str(path), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


PLAIN_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: plain}
spec:
  mlPolicy: {numNodes: 1}
---
"""


def trainjob(tmp_path: Path, name: str, command: list[str], nodes: int = 1, env: dict | None = None,
             runtime: str = "plain") -> Path:
    import yaml

    doc = builders.trainjob_doc(name, runtime=runtime, annotations={"hpcbridge.io/workdir": str(tmp_path)}, trainer={
        "numNodes": nodes, "command": command, "env": [{"name": k, "value": v} for k, v in (env or {}).items()]})
    path = tmp_path / f"{name}.yaml"
    path.write_text(PLAIN_RUNTIME + yaml.safe_dump(doc))
    return path


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_mpi_example_allreduce() -> None:
    result = submit(ROOT / "examples" / "mpi-allreduce.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "allreduce result: 10 OK" in result.stdout
    assert result.stdout.count("allreduce sum=10") == 4  # 2 nodes x 2 ranks
    assert "Succeeded (exit code 0)" in result.stderr


def test_mpi_ranks_lines_come_whole_and_tagged_under_an_unbuffered_python() -> None:
    """An unbuffered print writes its text and its newline apart: without tags mpirun glued two ranks' halves
    (``…hello from hpc-bridgerank 1/4 …``). Each line carries its node and rank; the job's stderr is ours."""
    import re

    result = submit(ROOT / "examples" / "mpi-allreduce.yaml", env={"PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()[1:]  # after the job's id
    assert all(re.fullmatch(r"\[node-[01] rank-[0-3]\] \S.*", line) for line in lines), lines
    sums = sorted(line.split("]")[0] for line in lines if re.search(r"allreduce sum=10 .* hello from hpc-bridge$", line))
    assert sums == [f"[node-{rank // 2} rank-{rank}" for rank in range(4)], lines
    assert "[node-0 rank-0] allreduce result: 10 OK" in lines
    assert "Succeeded (exit code 0)" in result.stderr and "rank-" not in result.stderr


def test_stderr_goes_to_stderr_and_a_last_line_stays_apart(tmp_path: Path) -> None:
    command = ["sh", "-c", 'echo "out $HPCBRIDGE_NODE_RANK"; echo "err $HPCBRIDGE_NODE_RANK" >&2; printf end']
    result = submit(trainjob(tmp_path, "streams", command, nodes=2))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.splitlines()[1:]) == ["[node-0] end", "[node-0] out 0", "[node-1] end", "[node-1] out 1"]
    assert "[node-0] err 0\n" in result.stderr and "[node-1] err 1\n" in result.stderr
    assert "out" not in result.stderr


def test_torch_example_ddp() -> None:
    result = submit(ROOT / "examples" / "torch-ddp.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ddp allreduce result: 3.000 OK" in result.stdout
    assert "[node-0]" in result.stdout and "[node-1]" in result.stdout


def test_torchruns_workers_on_one_node_come_out_whole_and_tagged(tmp_path: Path) -> None:
    """2 nodes x 2 workers under an unbuffered Python: a node's workers share torchrun's pipe, and their lines
    come out whole, each after its node and torchrun's global rank; torchrun's own lines after its node."""
    import re

    import yaml

    pytest.importorskip("torch")
    (doc,) = yaml.safe_load_all((ROOT / "examples" / "torch-ddp.yaml").read_text())
    doc["metadata"]["annotations"]["hpcbridge.io/workdir"] = str(ROOT / "examples")
    doc["spec"]["trainer"].update(numProcPerNode=2, env=[{"name": "PYTHONUNBUFFERED", "value": "1"}])
    path = tmp_path / "torch-ddp-2x2.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = submit(path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()[1:]  # after the job's id
    assert sorted(line for line in lines if "grad=" in line) == [
        f"[node-{rank // 2} rank-{rank}] worker {rank}/4 (node {rank // 2}): grad=2.500 expected=2.500"
        for rank in range(4)]
    assert "[node-0 rank-0] ddp allreduce result: 10.000 OK" in lines and len(lines) == 5, lines
    assert all(re.match(r"\[node-[01]\] ", line) for line in result.stderr.splitlines()[:-1]), result.stderr


def test_exit_code_is_the_jobs(tmp_path: Path) -> None:
    result = submit(trainjob(tmp_path, "fails", ["sh", "-c", "echo before; exit 3"]))
    assert result.returncode == 3
    assert "before" in result.stdout
    assert "Failed (exit code 3)" in result.stderr


def test_failing_node_stops_the_others(tmp_path: Path) -> None:
    marker = tmp_path / "survivor"
    command = ["sh", "-c", f'if [ "$HPCBRIDGE_NODE_RANK" = 1 ]; then exit 5; fi; sleep 60; touch {marker}']
    result = submit(trainjob(tmp_path, "one-fails", command, nodes=3))
    assert result.returncode == 5, result.stdout + result.stderr
    assert not marker.exists()  # the sleeping nodes were stopped, not waited for


def test_hostile_values_arrive_literal(tmp_path: Path) -> None:
    evil = "$(touch pwned) `id` ${HOME} 'single' \"double\"\nsecond line"
    result = submit(trainjob(tmp_path, "hostile", [sys.executable, "-c", "import os, sys; print(repr(os.environ['EVIL'])); "
                                                   "print(repr(sys.argv[1:]))", "$(id)", "a b", ""],
                             env={"EVIL": evil}))
    assert result.returncode == 0, result.stderr
    assert repr(evil) in result.stdout
    assert repr(["$(id)", "a b", ""]) in result.stdout
    assert not (tmp_path / "pwned").exists()


def test_sigterm_cancels_every_node(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    command = ["sh", "-c", f"echo $$ >> {pids}; sleep 120"]
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "submit", str(trainjob(tmp_path, "cancel-me", command,
                                                                                     nodes=2))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
        time.sleep(0.1)
    assert pids.exists() and len(pids.read_text().split()) == 2
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "Cancelled" in err
    assert proc.returncode != 0
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_status_logs_and_cancel_from_another_process(tmp_path: Path) -> None:
    """`hpcbridge cancel --cluster local ID` from another terminal stops a running local job; status, list
    and logs see it there too."""
    import json

    path = trainjob(tmp_path, "elsewhere", ["sh", "-c", "echo started-here; sleep 300"], nodes=2)
    env = {**os.environ}
    owner = subprocess.Popen([sys.executable, "-m", "bridge", "submit", str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bridge", *args, "--cluster", "local"], capture_output=True,
                              text=True, env=env, timeout=120)

    deadline = time.monotonic() + 60
    rows: list = []
    while time.monotonic() < deadline:
        rows = json.loads(cli("list", "-o", "json").stdout or "[]")
        if rows and "started-here" in cli("logs", rows[0]["job"]).stdout:
            break
        time.sleep(0.2)
    assert len(rows) == 1 and rows[0]["name"] == "elsewhere" and rows[0]["uid"] == rows[0]["job"]
    job = rows[0]["job"]
    assert json.loads(cli("status", job, "-o", "json").stdout)[0]["state"] == "Running"
    assert cli("logs", job).stdout.count("started-here") == 2  # both nodes
    cancelled = cli("cancel", job, "--grace", "5")
    assert cancelled.returncode == 0, cancelled.stderr
    out, err = owner.communicate(timeout=60)
    assert owner.returncode != 0 and "Cancelled" in err
    assert json.loads(cli("status", job, "-o", "json").stdout)[0]["state"] == "Cancelled"
    # a second run of the same file is a new run (the local cluster runs in the foreground)
    again = subprocess.run([sys.executable, "-m", "bridge", "submit", str(trainjob(tmp_path, "elsewhere", ["true"]))],
                           capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(cli("status", job, "-o", "json").stdout)[0]["state"] == "Succeeded"


@pytest.mark.parametrize("example, expected", [
    ("pytorchjob.yaml", ["ddp allreduce result: 3.000 OK", "[node-0]", "[node-1]"]),
    ("mpijob.yaml", ["allreduce result: 10 OK"]),
    ("tfjob.yaml", ['[node-0] chief 0 of cluster {"chief": ["localhost:2223"], "worker": ["localhost:2224", '
                    '"localhost:2225"]}', "[node-1] worker 0 of", "[node-2] worker 1 of"]),
])
def test_training_operator_v1_jobs_run_as_the_trainjobs_they_convert_to(example: str, expected: list[str]) -> None:
    """`hpcbridge submit` takes a PyTorchJob, MPIJob or TFJob as it is: converted (notes on stderr), then run."""
    result = submit(ROOT / "examples" / example)
    assert result.returncode == 0, result.stdout + result.stderr
    for text in expected:
        assert text in result.stdout, (text, result.stdout)
    assert "Succeeded (exit code 0)" in result.stderr
    if example == "mpijob.yaml":
        assert result.stdout.count("allreduce sum=10") == 4  # 2 workers x slotsPerWorker 2
        assert result.stdout.count("hello from an MPIJob") == 4  # mpirun -x reached every rank


def test_a_batch_scripts_steps_run_with_the_mpi_launcher_and_its_environment(tmp_path: Path) -> None:
    """`hpcbridge submit job.sbatch` on the local cluster, as a user types it: srun --mpi=pmi2 starts the tasks
    with Hydra (each finds PMI_RANK = SLURM_PROCID), --mpi=pmix with Open MPI (OMPI_COMM_WORLD_RANK), and the
    script's own variables reach every task."""
    script = tmp_path / "mpi-steps.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=2\n#SBATCH --chdir=" + str(tmp_path) + "\nset -eo pipefail\n"
        "export GREETING=\"it's a 'test'\"\n"
        "srun --mpi=pmi2 -l sh -c 'echo hydra $PMI_RANK $SLURM_PROCID \"$GREETING\"' | sort\n"
        "srun --mpi=pmix sh -c 'echo ompi $OMPI_COMM_WORLD_RANK $SLURM_PROCID $SLURM_NODEID' | sort\n")
    result = submit(script, "--wait")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(("0:", "1:", "2:", "3:", "ompi"))]
    assert lines == [f"{rank}: hydra {rank} {rank} it's a 'test'" for rank in range(4)] + [
        f"ompi {rank} {rank} {rank // 2}" for rank in range(4)]


def test_each_emulated_node_gets_its_own_gpus_and_a_job_needing_more_is_refused(tmp_path: Path) -> None:
    """On a machine with GPUs (a fake nvidia-smi listing 4 here), 2 nodes x 2 GPUs get 0,1 and 2,3, as Slurm's
    gres gives nodes their devices; a job asking none sees none; 3 x 2 is refused before anything starts."""
    import yaml

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\n[ \"$1\" = -L ] || exit 1\n"
                                     "for i in 0 1 2 3; do echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; done\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    env_without = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    show = ["sh", "-c", 'echo "node $HPCBRIDGE_NODE_RANK sees [$CUDA_VISIBLE_DEVICES]"']
    path = trainjob(tmp_path, "gpus", show, nodes=2)
    doc = list(yaml.safe_load_all(path.read_text()))
    doc[1]["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 2}}
    path.write_text(yaml.safe_dump_all(doc))
    ran = subprocess.run([sys.executable, "-m", "bridge", "submit", str(path)], capture_output=True, text=True,
                         timeout=120, env={**env_without, **env})
    assert ran.returncode == 0, ran.stderr
    assert sorted(line.split("] ", 1)[1] for line in ran.stdout.splitlines() if "sees" in line) == [
        "node 0 sees [0,1]", "node 1 sees [2,3]"]
    refused = subprocess.run([sys.executable, "-m", "bridge", "submit", str(path), "-N", "3", "--rerun"],
                             capture_output=True, text=True, timeout=120, env={**env_without, **env})
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == ("hpcbridge: error: spec.trainer.resourcesPerNode: needs 6 GPUs; this machine has 4 "
                              "(nvidia-smi -L) (got '3 nodes x 2 GPUs')\n")
    cpu = subprocess.run([sys.executable, "-m", "bridge", "submit", str(trainjob(tmp_path, "cpu", show))],
                         capture_output=True, text=True, timeout=120, env={**env_without, **env})
    assert cpu.returncode == 0 and "node 0 sees []" in cpu.stdout


def test_a_batch_script_submitted_again_is_a_new_job_with_its_own_record_and_logs(tmp_path: Path) -> None:
    """As with sbatch, each submit of a script is a job of its own: a second run no longer replaces the first
    one's record and logs, and `list` shows both."""
    import json

    script = tmp_path / "sweep.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N 1\n#SBATCH --chdir=" + str(tmp_path) + "\necho run $RUN\n")
    for run in ("one", "two"):
        result = submit(script, env={"RUN": run})
        assert result.returncode == 0, result.stderr
    listed = subprocess.run([sys.executable, "-m", "bridge", "list", "--cluster", "local", "-o", "json"],
                            capture_output=True, text=True, timeout=120)
    rows = json.loads(listed.stdout)
    assert len(rows) == 2 and len({row["uid"] for row in rows}) == 2
    assert all(row["name"] == "sweep-sbatch" and row["state"] == "Succeeded" for row in rows)
    logs = sorted(subprocess.run([sys.executable, "-m", "bridge", "logs", row["job"], "--cluster", "local"],
                                 capture_output=True, text=True, timeout=120).stdout.strip().split()[-1]
                  for row in rows)
    assert logs == ["one", "two"]
