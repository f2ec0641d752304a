"""The Flux adapter against a live `flux start --test-size=2` instance (skipped when flux is not on PATH)."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from bridge.adapters.base import JobState
from bridge.adapters.flux import FluxAdapter
from bridge.api.catalog import builtin_runtimes
from bridge.plan import find_runtime, resolve
from tests import builders
from tests.harness import layer
from tests.harness.mpi_programs import build_allreduce

pytestmark = [pytest.mark.integration, pytest.mark.flux]
ROOT = Path(__file__).resolve().parents[3]


def trainjob(name: str, runtime: str, command: list[str], workdir: Path, **trainer):
    # a uid of its own: both transports' runs share one Flux instance and must not see each other's jobs
    return builders.trainjob(name, runtime=runtime, uid=str(uuid.uuid4()),
                             annotations={"hpcbridge.io/workdir": str(workdir)}, trainer={"command": command, **trainer})


def run(adapter: FluxAdapter, job):
    plan = resolve(job, find_runtime(job, builtin_runtimes()), adapter.cluster)
    ref = layer.submit(adapter, plan)
    return plan, ref


def test_batch_job_completes_with_logs(flux_cluster, tmp_path) -> None:
    adapter = FluxAdapter(flux_cluster)
    _, ref = run(adapter, trainjob("hello", "sbatch-script", ["sh", "-c", "echo hello from flux"], tmp_path))
    status = adapter.wait(ref, timeout=120)
    assert (status.state, status.exit_code) == (JobState.SUCCEEDED, 0)
    assert "hello from flux" in "".join(adapter.logs(ref))


def test_cancel_a_running_job(flux_cluster, tmp_path) -> None:
    adapter = FluxAdapter(flux_cluster)
    _, ref = run(adapter, trainjob("long", "sbatch-script", ["sleep", "300"], tmp_path))
    deadline = time.monotonic() + 60
    while adapter.poll([ref])[ref].state != JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    adapter.cancel(ref)
    assert adapter.wait(ref, timeout=120).state == JobState.CANCELLED


def test_suspended_trainjob_is_held(flux_cluster, tmp_path) -> None:
    adapter = FluxAdapter(flux_cluster)
    job = trainjob("held", "sbatch-script", ["true"], tmp_path)
    job.spec.suspend = True
    _, ref = run(adapter, job)
    assert adapter.poll([ref])[ref].state == JobState.PENDING
    adapter.cancel(ref)


def test_ssh_uri(flux_cluster, flux_uri, tmp_path, monkeypatch) -> None:
    """ssh:// URIs go through FLUX_SSH; a stand-in that runs the remote command here replaces sshd."""
    wrapper = tmp_path / "fake-ssh"
    wrapper.write_text('#!/bin/sh\n# drop [-p port] [user@]host, run the rest here\n'
                       'while [ "$1" = "-p" ]; do shift 2; done\nshift\nexec "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("FLUX_SSH", str(wrapper))
    remote = flux_cluster.model_copy(deep=True)
    remote.spec.flux.uri = "ssh://localhost" + flux_uri.removeprefix("local://")
    adapter = FluxAdapter(remote)
    _, ref = run(adapter, trainjob("over-ssh-uri", "sbatch-script", ["sh", "-c", "echo via ssh uri"], tmp_path))
    assert adapter.wait(ref, timeout=120).state == JobState.SUCCEEDED
    assert "via ssh uri" in "".join(adapter.logs(ref))


def test_failing_job_exit_code(flux_cluster, tmp_path) -> None:
    adapter = FluxAdapter(flux_cluster)
    _, ref = run(adapter, trainjob("fails", "sbatch-script", ["sh", "-c", "exit 3"], tmp_path))
    status = adapter.wait(ref, timeout=120)
    assert status.state == JobState.FAILED and status.exit_code == 3


def test_submit_twice_is_one_job(flux_cluster, tmp_path) -> None:
    adapter = FluxAdapter(flux_cluster)
    job = trainjob("twice", "sbatch-script", ["sleep", "30"], tmp_path)
    _, first = run(adapter, job)
    _, second = run(adapter, job)
    assert first.job_id == second.job_id
    adapter.cancel(first)
    assert adapter.wait(first, timeout=120).state == JobState.CANCELLED


def test_timeout(flux_cluster, tmp_path) -> None:
    adapter = FluxAdapter(flux_cluster)
    job = trainjob("too-slow", "sbatch-script", ["sleep", "60"], tmp_path)
    job.spec.active_deadline_seconds = 2
    _, ref = run(adapter, job)
    assert adapter.wait(ref, timeout=120).state == JobState.TIMEOUT


@pytest.mark.parametrize(("runtime", "compiler"), [("mpi-distributed", "mpicc.openmpi"),
                                                   ("mpich-distributed", "mpicc.mpich")])
def test_two_node_mpi_allreduce_inside_flux(flux_cluster, tmp_path, runtime, compiler) -> None:
    """2 nodes x 2 ranks inside a Flux allocation through hpcbridge launch (flux run + Flux's PMI)."""
    program = build_allreduce(tmp_path, compiler)
    adapter = FluxAdapter(flux_cluster)
    job = trainjob(f"mpi-{runtime.split('-')[0]}", runtime, [str(program)], tmp_path,
                   numNodes=2, numProcPerNode=2)
    _, ref = run(adapter, job)
    status = adapter.wait(ref, timeout=300)
    text = "".join(adapter.logs(ref))
    assert status.state == JobState.SUCCEEDED, text
    assert "allreduce result: 10 OK" in text


def test_mpi4py_allreduce_inside_flux(flux_cluster, tmp_path) -> None:
    adapter = FluxAdapter(flux_cluster)
    job = trainjob("mpi4py", "mpi-distributed", [sys.executable, str(ROOT / "examples" / "mpi_allreduce.py")],
                   tmp_path, numNodes=2, numProcPerNode=1)
    _, ref = run(adapter, job)
    status = adapter.wait(ref, timeout=300)
    text = "".join(adapter.logs(ref))
    assert status.state == JobState.SUCCEEDED, text
    assert "allreduce result: 3 OK" in text


def test_example_cluster_entry_runs_the_mpi_example_as_shipped(flux_uri, tmp_path) -> None:
    """examples/clusters.yaml's Flux entry gives only a URI: the MPI example runs on it with no fluxCommand or
    launchCommand (the job launches with this hpc-bridge and finds flux where the submitter does)."""
    import os
    import subprocess

    entry = next(doc for doc in yaml.safe_load_all((ROOT / "examples" / "clusters.yaml").read_text())
                 if doc["spec"]["type"] == "flux")
    assert set(entry["spec"]["flux"]) == {"uri"}
    entry["spec"]["flux"]["uri"] = flux_uri
    config = tmp_path / "clusters.yaml"
    config.write_text(yaml.safe_dump(entry))
    env = {**os.environ, "HPCBRIDGE_CONFIG": str(config)}
    result = subprocess.run([sys.executable, "-m", "bridge", "submit", str(ROOT / "examples" / "mpi-allreduce.yaml"),
                             "--cluster", entry["metadata"]["name"], "--wait", "--rerun"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    job = result.stdout.split()[0]
    logs = subprocess.run([sys.executable, "-m", "bridge", "logs", job, "--cluster", entry["metadata"]["name"]],
                          capture_output=True, text=True, env=env, timeout=120)
    assert "allreduce result: 10 OK" in logs.stdout, logs.stdout + logs.stderr
