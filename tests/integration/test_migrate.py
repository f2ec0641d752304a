"""``hpcbridge migrate``: a training job that checkpoints every step (examples/checkpointed_train.py) moves from
the real Slurm cluster to pods on real kubelets, on to Flux when flux-core is on PATH, and back to Slurm, as a
user types it, and finishes with every step done exactly once. The checkpoint directory is shared: the same
path on the host (Slurm's nodes, Flux) and in the pods (a hostPath volume of the job's runtime)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests import builders
from tests.integration.engines import LAUNCH, movable_runtime, pod_namespace

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.kubernetes]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 60


@pytest.fixture
def setup(slurm_cluster, real_kube, tmp_path, request):
    from kubernetes import client

    api = real_kube.api_client()
    core = client.CoreV1Api(api)
    namespace = pod_namespace(core, "migrate")
    clusters = [
        {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "hpc"},
         "spec": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                  "defaults": {"launchCommand": LAUNCH}}},
        {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "pods"},
         "spec": {"type": "kubernetes", "kubernetes": {
             "kubeconfig": str(real_kube.kube.kubeconfig), "namespace": namespace, "imagePullPolicy": "Never",
             "images": {"busybox:1.36": real_kube.images["node"].ref},
             # the movable runtime's checkpoint directory is a hostPath, the same path as on the HPC nodes
             "podPolicy": {"volumes": ["hostPath"]}}}}]
    if shutil.which("flux"):
        uri = request.getfixturevalue("flux_uri")
        clusters.append({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "fx"},
                         "spec": {"type": "flux", "flux": {"uri": uri, "transport": "cli",
                                                           "fluxCommand": shutil.which("flux")},
                                  "defaults": {"launchCommand": LAUNCH}}})
    config = tmp_path / "clusters.yaml"
    config.write_text(yaml.safe_dump_all(clusters))
    try:
        yield config, [c["metadata"]["name"] for c in clusters]
    finally:
        core.delete_namespace(namespace)
        api.close()


def trainjob(shared: Path, declares_checkpoint: bool = True, name: str = "moving") -> Path:
    """The job and a runtime whose pods mount *shared* where the host has it."""
    shared.mkdir(mode=0o777)
    script = shared / "checkpointed_train.py"
    shutil.copy(ROOT / "examples" / "checkpointed_train.py", script)
    checkpoint = shared / "checkpoint"
    runtime = movable_runtime(shared, "busybox:1.36")
    job = builders.trainjob_doc(name, runtime="movable", annotations={
        "hpcbridge.io/workdir": str(shared),
        **({"hpcbridge.io/checkpoint-dir": str(checkpoint)} if declares_checkpoint else {})},
        trainer={"command": ["python3", str(script), str(checkpoint), str(STEPS), "0.5"]})
    path = shared / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([runtime, job]))
    return path


def hpcbridge(config: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HPCBRIDGE_CONFIG": str(config), "XDG_STATE_HOME": str(state)})


def steps(log: Path) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    return [(int(number), cluster) for number, cluster in (line.split() for line in log.read_text().splitlines())]


def wait_for_steps(log: Path, cluster: str, count: int) -> None:
    """Until *cluster* has done *count* steps (a bound on the wait, not a timing assertion)."""
    for _ in range(2400):
        if sum(1 for _, where in steps(log) if where == cluster) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{cluster} did not get to {count} steps: {steps(log)[-5:]}")


def test_a_checkpointing_job_moves_between_clusters_and_does_every_step_once(setup, tmp_path) -> None:
    config, names = setup
    shared = tmp_path / "shared"
    job_file = trainjob(shared)
    log = shared / "checkpoint" / "steps.log"
    state = tmp_path / "state"
    submitted = hpcbridge(config, state, "submit", str(job_file), "--cluster", "hpc")
    assert submitted.returncode == 0, submitted.stderr
    job, cluster = submitted.stdout.strip(), "hpc"
    route = ["pods", *(["fx"] if "fx" in names else []), "hpc"]
    for target in route:
        wait_for_steps(log, cluster, 4)
        signal = "USR1@60" if cluster == "hpc" else "TERM@60"  # pods are stopped with SIGTERM only
        moved = hpcbridge(config, state, "migrate", job, "--cluster", cluster, "--to", target, "--signal", signal,
                          "--reason", f"{cluster} drains")
        assert moved.returncode == 0, moved.stderr
        assert f"hpcbridge: moved from {cluster} job {job}" in moved.stderr
        job, cluster = moved.stdout.strip(), target
    for _ in range(2400):
        status = yaml.safe_load(hpcbridge(config, state, "status", job, "--cluster", "hpc", "-o", "yaml").stdout)
        if status[0]["state"] in ("Succeeded", "Failed"):
            break
        time.sleep(0.1)
    assert status[0]["state"] == "Succeeded", status
    done = steps(log)
    assert [number for number, _ in done] == list(range(1, STEPS + 1))  # every step, once, in order
    ran_on = [cluster for index, (_, cluster) in enumerate(done) if index == 0 or done[index - 1][1] != cluster]
    assert ran_on == ["hpc", *route]
    history = status[0]["history"]
    assert [(move["from"]["cluster"], move["to"]["cluster"]) for move in history] == \
        list(zip(["hpc", *route[:-1]], route, strict=True))
    assert history[0]["signal"] == "SIGUSR1" and history[0]["reason"] == "hpc drains"
    assert history[0]["from"]["state"] == "Succeeded"  # it stopped itself, checkpoint written, within the grace


def test_a_job_without_a_checkpoint_directory_is_not_stopped(setup, tmp_path) -> None:
    config, _ = setup
    shared = tmp_path / "shared"
    job_file = trainjob(shared, declares_checkpoint=False, name="staying")
    state = tmp_path / "state"
    submitted = hpcbridge(config, state, "submit", str(job_file), "--cluster", "hpc")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    moved = hpcbridge(config, state, "migrate", job, "--cluster", "hpc", "--to", "pods")
    assert moved.returncode == 2
    assert "hpcbridge.io/checkpoint-dir" in moved.stderr and "would start over" in moved.stderr
    status = yaml.safe_load(hpcbridge(config, state, "status", job, "--cluster", "hpc", "-o", "yaml").stdout)
    assert status[0]["state"] in ("Pending", "Running"), status  # refused before anything was stopped
    hpcbridge(config, state, "cancel", job, "--cluster", "hpc")
