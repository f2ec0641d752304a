"""Slurm with one slurmd per emulated host: a TrainJob that really spans hosts, and the SSH transport."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from bridge.adapters.base import JobState
from bridge.adapters.slurm import SlurmAdapter
from bridge.adapters.transport import SSHTransport
from bridge.api import load_documents
from bridge.api.catalog import builtin_runtimes
from bridge.api.cluster import BridgeCluster
from bridge.errors import AlreadyRan, BackendUnavailable
from bridge.plan import find_runtime, resolve
from tests import builders
from tests.harness import layer

from .conftest import finished, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.mpi]
ROOT = Path(__file__).resolve().parents[3]


def bridge_cluster(netns_slurm, **slurm) -> BridgeCluster:
    return builders.cluster("slurm", "nsslurm", slurm={"slurmConf": str(netns_slurm.conf), **slurm},
                            defaults={"launchCommand": [sys.executable, "-m", "bridge", "launch"]})


def mpi_trainjob(name: str, workdir: Path):
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": name, "annotations": {"hpcbridge.io/workdir": str(workdir)}},
           "spec": {"runtimeRef": {"name": "mpi-distributed"}, "trainer": {
               "numNodes": 3, "numProcPerNode": 1,
               "command": [sys.executable, str(ROOT / "examples" / "mpi_allreduce.py")],
               "env": [{"name": "ALLREDUCE_TAG", "value": "across hosts"}]}}}
    return load_documents(yaml.safe_dump(doc))[0]


def test_three_host_mpi_trainjob_through_hpcbridge_launch(netns_slurm, tmp_path) -> None:
    adapter = SlurmAdapter(bridge_cluster(netns_slurm))
    job = mpi_trainjob("mpi-3-hosts", tmp_path)
    plan = resolve(job, find_runtime(job, builtin_runtimes()), adapter.cluster)
    ref = adapter.submit(adapter.render(plan))
    status = wait_for(adapter, ref, finished, timeout=180)
    text = "".join(adapter.logs(ref))
    assert status.state == JobState.SUCCEEDED, text
    assert "allreduce result: 6 OK" in text
    assert sorted(re.findall(r"rank \d/3 on (node-\d)", text)) == ["node-0", "node-1", "node-2"]
    assert status.nodes == ("node-[0-2]",)


def test_ssh_transport_to_a_login_host(netns_slurm, netns_hosts, tmp_path) -> None:
    """sbatch/squeue run on node-0 over one paramiko connection, host key checked against known_hosts."""
    login = netns_hosts.host("node-0")
    cluster = bridge_cluster(netns_slurm, transport="ssh", host=login.ip, user="root",
                             keyFile=str(netns_hosts.client_key), knownHostsFile=str(netns_hosts.known_hosts))
    adapter = SlurmAdapter(cluster)
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
           "metadata": {"name": "plain"}, "spec": {"mlPolicy": {"numNodes": 1}}}
    runtime = load_documents(yaml.safe_dump(doc))[0]
    job = load_documents(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "over-ssh", "annotations": {"hpcbridge.io/workdir": str(tmp_path)}},
        "spec": {"runtimeRef": {"name": "plain"}, "trainer": {"command": ["sh", "-c", "echo on $(hostname)"]}}}))[0]
    ref = layer.submit(adapter, resolve(job, runtime, cluster))
    status = wait_for(adapter, ref, finished)
    assert status.state == JobState.SUCCEEDED
    assert "".join(adapter.logs(ref)).startswith("on node-")
    assert adapter.transport.connects == 1  # submit, polls and logs shared one connection
    # the same submission again is recognised over ssh too: finished, so not sent again unless asked
    assert layer.submit(adapter, resolve(job, runtime, cluster), if_finished="attach") == ref
    with pytest.raises(AlreadyRan):
        layer.submit(adapter, resolve(job, runtime, cluster))


def test_ssh_transport_refuses_an_unknown_host_key(netns_hosts, tmp_path) -> None:
    login = netns_hosts.host("node-1")
    other = tmp_path / "known_hosts"
    other.write_text("".join(line + "\n" for line in netns_hosts.known_hosts.read_text().splitlines()
                             if "node-1" not in line and login.ip not in line))
    transport = SSHTransport(login.ip, user="root", key_file=str(netns_hosts.client_key),
                             known_hosts_file=str(other), retries=0)
    with pytest.raises(BackendUnavailable, match="not in .*known_hosts"):
        transport.run(["true"])


def test_ssh_transport_reads_stdout_and_stderr_together(netns_hosts) -> None:
    """A command that writes megabytes to stderr before any stdout: reading one stream to its end first
    would fill the channel's window and hang; both come back whole, with the exit status."""
    login = netns_hosts.host("node-0")
    transport = SSHTransport(login.ip, user="root", key_file=str(netns_hosts.client_key),
                             known_hosts_file=str(netns_hosts.known_hosts), retries=0)
    try:
        result = transport.run(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' e >&2; echo out; "
                                            "head -c 2000000 /dev/zero | tr '\\0' o; exit 7"], timeout=120)
        assert result.returncode == 7
        assert result.stderr == "e" * 3_000_000
        assert result.stdout == "out\n" + "o" * 2_000_000
        streamed = "".join(transport.stream(["sh", "-c", "for i in 1 2 3; do echo line $i; done"]))
        assert streamed == "line 1\nline 2\nline 3\n"
    finally:
        transport.close()


def _cut_connections(netns_hosts, host, after: float) -> threading.Thread:
    """Kill *host*'s per-connection sshd processes (its listener stays) after *after* seconds."""
    def cut() -> None:
        time.sleep(after)
        subprocess.run(["pkill", "-KILL", "-P", str(host.sshd_pid)], check=False)

    thread = threading.Thread(target=cut)
    thread.start()
    return thread


@pytest.mark.parametrize("resend", [False, True])
def test_a_command_cut_off_mid_way_is_sent_again_only_when_allowed(netns_hosts, tmp_path, resend) -> None:
    """The connection breaks while a command runs on the login host (sshd's session process killed): a
    read-only command is sent again on a new connection; a submission (resend=False) is not, since it may
    have run, and the error says so; the caller looks it up before sending it again."""
    login = netns_hosts.host("node-0")
    marker = tmp_path / "ran"  # the namespaces share this machine's file system
    transport = SSHTransport(login.ip, user="root", key_file=str(netns_hosts.client_key),
                             known_hosts_file=str(netns_hosts.known_hosts), retries=2, backoff=0.2)
    command = ["sh", "-c", f"echo ran >> {shlex.quote(str(marker))}; sleep 3; echo done"]
    try:
        transport.run(["true"])
        cutter = _cut_connections(netns_hosts, login, after=1.0)
        if resend:
            assert transport.run(command).stdout == "done\n"
            assert marker.read_text() == "ran\nran\n" and transport.connects == 2
        else:
            with pytest.raises(BackendUnavailable, match="connection lost after sh was sent, so whether it ran "
                                                         "is unknown"):
                transport.run(command, resend=False)
            assert marker.read_text() == "ran\n"
            assert transport.run(["true"]).ok and transport.connects == 2  # the next command reconnects
        cutter.join()
    finally:
        transport.close()


def test_batch_script_over_ssh_is_sent_as_it_is(netns_slurm, netns_hosts, tmp_path) -> None:
    """Over SSH the user's script goes on sbatch's stdin, unchanged; sbatch's default name (the file's) is
    given explicitly, and the identity is appended to the user's comment."""
    from bridge import service

    login = netns_hosts.host("node-0")
    cluster = bridge_cluster(netns_slurm, transport="ssh", host=login.ip, user="root",
                             keyFile=str(netns_hosts.client_key), knownHostsFile=str(netns_hosts.known_hosts))
    script = tmp_path / "verbatim.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --comment='kept comment'\n#SBATCH -o {tmp_path}/%x-%j.out\n"
                      "echo \"name=$SLURM_JOB_NAME on $(hostname)\"\n")
    prepared = service.prepare(service.read_input(str(script)), cluster="nsslurm", configured={"nsslurm": cluster})
    assert prepared.artifact.main == script.read_text()
    assert prepared.artifact.command[-1] == "--job-name=verbatim.sbatch"  # no file argument: stdin
    submitted = service.submit(prepared)
    adapter = prepared.adapter
    status = wait_for(adapter, submitted.ref, finished)
    assert status.state == JobState.SUCCEEDED
    assert re.match(r"name=verbatim\.sbatch on node-\d", "".join(adapter.logs(submitted.ref)))
    info = netns_slurm.run("scontrol", "--oneliner", "show", "job", submitted.ref.job_id).stdout
    assert re.search(r"Comment=kept comment hpcbridge\.io/uid=[0-9a-f-]{36} ", info), info


def test_training_operator_v1_jobs_run_across_hosts(netns_slurm, tmp_path) -> None:
    """A TFJob (chief + 2 workers) and an MPIJob (3 workers) read as they are, converted, and run on Slurm
    spanning 3 hosts: each TFJob node gets TF_CONFIG naming its own host (by its address) and role; the MPIJob's
    ranks meet."""
    from bridge import service

    cluster = bridge_cluster(netns_slurm)
    adapter = SlurmAdapter(cluster)
    pod = {"spec": {"containers": [{"name": "tensorflow", "image": "tensorflow/tensorflow",
                                    "command": [sys.executable, str(ROOT / "examples" / "tf_config_check.py")]}]}}
    tfjob = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
             "metadata": {"name": "tf-hosts", "annotations": {"hpcbridge.io/workdir": str(tmp_path)}},
             "spec": {"tfReplicaSpecs": {"Chief": {"replicas": 1, "template": pod},
                                         "Worker": {"replicas": 2, "template": pod}}}}
    program = [sys.executable, str(ROOT / "examples" / "mpi_allreduce.py")]
    mpijob = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
              "metadata": {"name": "mpi-hosts", "annotations": {"hpcbridge.io/workdir": str(tmp_path)}},
              "spec": {"sshAuthMountPath": "/home/mpiuser/.ssh", "mpiReplicaSpecs": {
                  "Launcher": {"template": {"spec": {"containers": [
                      {"name": "l", "image": "i", "command": ["mpirun", "-np", "3", "--bind-to", "none", *program],
                       "env": [{"name": "ALLREDUCE_GREETING", "value": "from an MPIJob"}]}]}}},
                  "Worker": {"replicas": 3, "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}}}}
    refs = {}
    for name, doc in (("tf", tfjob), ("mpi", mpijob)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        source = service.read_input(str(path))
        assert source.notes  # what did not carry over is said (image, --bind-to, ...)
        prepared = service.prepare(source, cluster="nsslurm", configured={"nsslurm": cluster})
        refs[name] = service.submit(prepared).ref
    for name, ref in refs.items():
        status = wait_for(adapter, ref, finished, timeout=180)
        text = "".join(adapter.logs(ref))
        assert status.state == JobState.SUCCEEDED, text
        if name == "tf":
            # each host by its NodeAddr (what the nodes reach), not its Slurm name
            ip = {host.name: host.ip for host in netns_slurm.hosts.hosts}
            cluster_line = (f'{{"chief": ["{ip["node-0"]}:2223"], "worker": ["{ip["node-1"]}:2224", '
                            f'"{ip["node-2"]}:2225"]}}')
            assert sorted(line.split(" of ")[0] for line in text.splitlines() if " of cluster " in line) == \
                ["chief 0", "worker 0", "worker 1"], text
            assert text.count(cluster_line) == 3, text
        else:
            assert "allreduce result: 6 OK" in text and text.count("from an MPIJob") == 3, text
            assert sorted(re.findall(r"rank \d/3 on (node-\d)", text)) == ["node-0", "node-1", "node-2"]
