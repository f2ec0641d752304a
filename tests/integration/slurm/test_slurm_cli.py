"""`hpcbridge` against the real Slurm cluster, as a user types it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def hpcbridge(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HPCBRIDGE_CONFIG": str(config)})


def write_job(tmp_path: Path, name: str, command: list[str], **trainer) -> Path:
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "plain"}, "spec": {"mlPolicy": {"numNodes": 1}}}
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": name, "annotations": {"hpcbridge.io/cluster": "testslurm",
                                                      "hpcbridge.io/workdir": str(tmp_path)}},
           "spec": {"runtimeRef": {"name": "plain"}, "trainer": {"command": command, **trainer}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([runtime, job]))
    return path


def test_submit_wait_returns_the_jobs_exit_code(config_file, tmp_path) -> None:
    result = hpcbridge(config_file, "submit", str(write_job(tmp_path, "cli-fails", ["sh", "-c", "echo out; exit 3"])),
                       "--wait")
    assert result.returncode == 3, result.stderr
    job_id = result.stdout.strip()
    assert job_id.isdigit()
    assert f"{job_id} Failed" in result.stderr
    logs = hpcbridge(config_file, "logs", job_id, "-c", "testslurm")
    assert logs.stdout.startswith("out\n") and "Exited with exit code 3" in logs.stdout  # srun reports the task


def test_status_list_cancel(config_file, tmp_path) -> None:
    submitted = hpcbridge(config_file, "submit", str(write_job(tmp_path, "cli-sleeps", ["sleep", "300"])))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    listing = hpcbridge(config_file, "list", "-c", "testslurm", "-o", "yaml")
    assert job_id in [row["job"] for row in yaml.safe_load(listing.stdout)]
    assert hpcbridge(config_file, "cancel", job_id, "-c", "testslurm").returncode == 0
    for _ in range(100):
        rows = yaml.safe_load(hpcbridge(config_file, "status", job_id, "-c", "testslurm", "-o", "json").stdout)
        if rows[0]["state"] == "Cancelled":
            break
        time.sleep(0.2)
    assert rows[0]["state"] == "Cancelled"
    text = hpcbridge(config_file, "status", job_id, "-c", "testslurm").stdout.splitlines()
    assert text[0].split() == ["JOB", "NAME", "STATE", "EXIT", "REASON", "NODES"]


def test_clusters_check(config_file) -> None:
    result = hpcbridge(config_file, "clusters", "check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "testslurm\tslurm\tok: Slurmctld(primary) at " in result.stdout and " is UP; slurm" in result.stdout


def test_unreachable_cluster_is_reported(tmp_path) -> None:
    config = tmp_path / "clusters.yaml"
    config.write_text("apiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\nmetadata: {name: gone}\n"
                      f"spec: {{type: slurm, slurm: {{slurmConf: {tmp_path}/missing.conf}}}}\n")
    result = hpcbridge(config, "clusters", "check")
    assert result.returncode == 1
    assert "gone\tslurm\tunreachable:" in result.stdout


def test_converted_batch_script_is_what_slurm_gets(config_file, slurm_cluster, tmp_path) -> None:
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -J conv-job -N 2 --ntasks-per-node=2 -c 1 --mem=200M\n"
                      "#SBATCH --gpus-per-node=1 -t 10 -p debug\n#SBATCH --comment='kept as written'\n"
                      f"#SBATCH -D {tmp_path} -o {tmp_path}/%x-%j.out\n"
                      "echo tasks=$SLURM_NTASKS nodes=$SLURM_JOB_NUM_NODES\nsrun hostname | wc -l\n")
    result = hpcbridge(config_file, "submit", str(script), "--cluster", "testslurm", "--wait", "-t", "5")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    info = slurm_cluster.run("scontrol", "--oneliner", "show", "job", job_id).stdout
    for expected in ("JobName=conv-job", "NumNodes=2", "NumTasks=4", "CPUs/Task=1", "MinMemoryNode=200M",
                     "TimeLimit=00:05:00", "Partition=debug"):
        assert expected in info, (expected, info)
    # the GPUs per node as the release spells them (gres:gpu:1 up to 22.05, gres/gpu:1 later)
    assert re.search(r" TresPerNode=gres[:/]gpu:1 ", info), info
    # the user's comment, then hpc-bridge's identity appended
    assert re.search(r"Comment=kept as written hpcbridge\.io/uid=[0-9a-f-]{36} ", info), info
    output = (tmp_path / f"conv-job-{job_id}.out").read_text()
    assert output.splitlines() == ["tasks=4 nodes=2", "4"]  # the body ran once, its srun used the allocation
