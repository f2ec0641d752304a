"""A tenant's job environment on real Slurm (issue 36, secrets): the job sees its TrainJob's env values and
nothing of the submitting process's environment, and the values are in no batch script, ``scontrol show job``,
command line or process list. Over the local transport and over SSH to a login host."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bridge.adapters import transport as transport_module
from bridge.adapters.base import JobState
from bridge.adapters.slurm import SlurmAdapter
from bridge.api import load_documents
from bridge.api.cluster import BridgeCluster
from bridge.plan import resolve
from tests import builders

from .conftest import finished, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

SECRET = "tenant-SECRET-4b9e1d"
#: quotes, command substitution, backslashes and a newline: what a shell, printf or a line reader could mangle
AWKWARD = "it's $(not) `a command` \\n \\0 \"q\"\nsecond line\\"
PLANTED = "operator-PLANTED-c07a5e"
PLAIN = load_documents("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
                       "metadata: {name: plain}\nspec: {mlPolicy: {numNodes: 1}}\n")[0]
#: the job writes its environment and every process's command line on the machine while it runs
JOB = ('env > "$OUT/env.txt"; for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline" 2>/dev/null; echo; done '
       '> "$OUT/ps.txt"')


def tenant_plan(cluster: BridgeCluster, name: str, out: Path):
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": name, "namespace": "team-a", "annotations": {"hpcbridge.io/workdir": str(out)}},
           "spec": {"runtimeRef": {"name": "plain"}, "trainer": {
               "command": ["sh", "-c", JOB],
               "env": [{"name": "OUT", "value": str(out)}, {"name": "TOKEN", "value": SECRET},
                       {"name": "NOTE", "value": AWKWARD}]}}}
    return dataclasses.replace(resolve(load_documents(yaml.safe_dump(doc))[0], PLAIN, cluster), tenant="team-a")


class _Popen(subprocess.Popen):
    argvs: list[list[str]] = []

    def __init__(self, args, *rest, **kwargs) -> None:
        _Popen.argvs.append([str(arg) for arg in args])
        super().__init__(args, *rest, **kwargs)


def _check_job(adapter, plan, out: Path, scontrol) -> None:
    """Submitted held, so slurmctld still has the batch script to show; then released and run."""
    artifact = adapter.render(dataclasses.replace(plan, suspend=True))
    assert SECRET not in artifact.text()
    ref = adapter.submit(artifact)
    shown = scontrol("--details", "--details", "show", "job", ref.job_id)
    assert plan.uid in shown  # (Slurm 23.02 and later print the batch script here too)
    assert SECRET not in shown and "second line" not in shown
    stored = scontrol("write", "batch_script", ref.job_id, "-")
    assert stored.startswith("#!/bin/bash") and SECRET not in stored
    scontrol("release", ref.job_id)
    status = wait_for(adapter, ref, finished)
    assert status.state == JobState.SUCCEEDED, "".join(adapter.logs(ref))
    env = (out / "env.txt").read_text()
    assert f"TOKEN={SECRET}\n" in env and f"NOTE={AWKWARD}\n" in env  # the job's own values, whole
    assert "HPCB_PLANTED" not in env and PLANTED not in env  # nothing of the submitting process
    assert f"HPCBRIDGE_JOB_UID={plan.uid}" in env
    assert SECRET not in (out / "ps.txt").read_text()
    assert SECRET not in scontrol("--details", "--details", "show", "job", ref.job_id)


def test_local_transport(bridge_cluster, slurm_cluster, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HPCB_PLANTED", PLANTED)  # in the operator's environment, before its transport exists
    monkeypatch.setattr(transport_module.subprocess, "Popen", _Popen)
    _Popen.argvs.clear()
    adapter = SlurmAdapter(bridge_cluster)
    _check_job(adapter, tenant_plan(bridge_cluster, "tenant-env", tmp_path), tmp_path,
               lambda *argv: slurm_cluster.run("scontrol", *argv).stdout)
    assert any("sbatch" in argv for argv in _Popen.argvs)
    assert not any(SECRET in arg for argv in _Popen.argvs for arg in argv)


@pytest.mark.mpi
def test_ssh_transport(netns_slurm, netns_hosts, tmp_path, monkeypatch) -> None:
    """sbatch on a login host over SSH: the values go on stdin to the fixed reader, never on the remote
    command line (the job's process list includes the login host's sshd session and its shell)."""
    monkeypatch.setenv("HPCB_PLANTED", PLANTED)
    login = netns_hosts.host("node-0")
    cluster = builders.cluster("slurm", "nsslurm", slurm={
        "slurmConf": str(netns_slurm.conf), "transport": "ssh", "host": login.ip, "user": "root",
        "keyFile": str(netns_hosts.client_key), "knownHostsFile": str(netns_hosts.known_hosts)},
        defaults={"launchCommand": [sys.executable, "-m", "bridge", "launch"]})
    adapter = SlurmAdapter(cluster)
    try:
        _check_job(adapter, tenant_plan(cluster, "tenant-env-ssh", tmp_path), tmp_path,
                   lambda *argv: netns_slurm.run("scontrol", *argv).stdout)
    finally:
        adapter.transport.close()
