"""``hpcbridge submit --cluster auto`` between the real Slurm cluster (4 nodes x 2 CPUs, partitions debug and
long = node[1-2]) and the real control plane with kwok nodes (4 x 8 CPUs), as a user types it: the choice
follows what each scheduler says it has free, and ``--dry-run`` explains it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.engines import LAUNCH

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.kubernetes]


@pytest.fixture
def config(slurm_cluster, kube_cluster, tmp_path) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump_all([
        {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "hpc"},
         "spec": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                  "defaults": {"launchCommand": LAUNCH}}},
        {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "k8s"},
         "spec": {"type": "kubernetes", "kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig),
                                                       "namespace": "default"}}}]))
    return path


def job(tmp_path: Path, name: str, nodes: int, procs: int, partition: str | None = None) -> Path:
    annotations = {"hpcbridge.io/workdir": str(tmp_path)}
    if partition:
        annotations["hpcbridge.io/partition"] = partition
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "placed"}, "spec": {"mlPolicy": {"numNodes": 1}}}
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": name, "annotations": annotations},
           "spec": {"runtimeRef": {"name": "placed"}, "trainer": {
               "image": "busybox:1.36", "numNodes": nodes, "numProcPerNode": procs,
               "command": ["sh", "-c", "echo placed on $(hostname)"]}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([runtime, doc]))
    return path


def hpcbridge(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HPCBRIDGE_CONFIG": str(config)})


def choice(result: subprocess.CompletedProcess) -> dict[str, str]:
    """The placement notes: the chosen cluster under "chose", each candidate's line under its name."""
    lines = [line.removeprefix("hpcbridge: note: placement: ") for line in result.stderr.splitlines()
             if line.startswith("hpcbridge: note: placement: ")]
    found = {"chose": lines[0].split()[1]} if lines else {}
    for line in lines[1:]:
        name = line.removeprefix("candidate ").split()[0]
        found[name] = line
    return found


def test_auto_follows_free_capacity_and_explains_it(config, tmp_path, slurm_cluster, kube_api) -> None:
    from kubernetes import client

    # 4 processes a node: the Slurm nodes have 2 CPUs, so only Kubernetes can ever run it
    wide = hpcbridge(config, "submit", str(job(tmp_path, "wide", 1, 4)), "--cluster", "auto", "--dry-run")
    assert wide.returncode == 0, wide.stderr
    seen = choice(wide)
    assert seen["chose"] == "k8s" and "starts now" in seen["k8s"] and "4 of 4 nodes" in seen["k8s"]
    assert "cannot run — needs 1 nodes, 0 could ever take one" in seen["hpc"]
    assert "kind: JobSet" in wide.stdout  # the artifact of the chosen cluster

    # partition long (node[1-2]): no Kubernetes node carries that partition's label, Slurm has both free
    long = job(tmp_path, "long", 2, 1, partition="long")
    seen = choice(hpcbridge(config, "submit", str(long), "--cluster", "auto", "--dry-run"))
    assert seen["chose"] == "hpc" and "partition long: 2 of 2 nodes free" in seen["hpc"]
    assert "cannot run" in seen["k8s"] and "'hpcbridge.io/partition': 'long'" in seen["k8s"]
    ran = hpcbridge(config, "submit", str(long), "--cluster", "auto", "--wait")
    assert ran.returncode == 0, ran.stderr
    assert "Succeeded" in ran.stderr and choice(ran)["chose"] == "hpc"

    # the partition is busy: Slurm says the job would wait; two Kubernetes nodes join partition long and win
    env = {**os.environ, "SLURM_CONF": str(slurm_cluster.conf)}
    # -o /dev/null: without it Slurm writes slurm-<id>.out into the directory pytest runs in (the repository root)
    blocker = subprocess.run(["sbatch", "--parsable", "-p", "long", "-N", "2", "--exclusive", "-o", "/dev/null",
                              "--wrap", "sleep 300"],
                             capture_output=True, text=True, env=env, check=True).stdout.strip()
    core = client.CoreV1Api(kube_api)
    labelled = ["kwok-node-0", "kwok-node-1"]
    try:
        for _ in range(300):
            if subprocess.run(["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True, text=True,
                              env=env).stdout.strip() == "RUNNING":
                break
            time.sleep(0.1)
        seen = choice(hpcbridge(config, "submit", str(long), "--cluster", "auto", "--dry-run"))
        assert seen["chose"] == "hpc" and "waits — needs 2; partition long: 0 of 2 nodes free" in seen["hpc"]
        for node in labelled:
            core.patch_node(node, {"metadata": {"labels": {"hpcbridge.io/partition": "long"}}})
        seen = choice(hpcbridge(config, "submit", str(long), "--cluster", "auto", "--dry-run"))
        assert seen["chose"] == "k8s" and "starts now" in seen["k8s"] and "waits" in seen["hpc"]
    finally:
        subprocess.run(["scancel", blocker], env=env, check=False)
        for node in labelled:
            core.patch_node(node, {"metadata": {"labels": {"hpcbridge.io/partition": None}}})


def test_no_cluster_that_can_run_it_is_exit_2_naming_each(config, tmp_path) -> None:
    result = hpcbridge(config, "submit", str(job(tmp_path, "huge", 9, 1)), "--cluster", "auto")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("hpcbridge: error: --cluster: no configured cluster can run this job: ")
    assert "hpc (slurm): cannot run — needs 9 nodes" in result.stderr and "k8s (kubernetes): cannot run" in result.stderr
