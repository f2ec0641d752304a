"""The Slurm fixtures run the release asked for (``HPCBRIDGE_SLURM``, this machine's 22.05 by default), in every
part a test reaches: the commands on PATH, slurmctld, each node's slurmd, srun inside a job, and the commands an
SSH login on the emulated hosts finds. A matrix run must never pass on 22.05 unnoticed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest

from tests.harness import slurm_versions

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

RELEASE = slurm_versions.requested() or slurm_versions.HOST_RELEASE


def release_of(version_line: str) -> str:
    """'24.11' of 'slurm 24.11.5' or 'slurm-wlm 24.11.5' (Debian's build names itself so)."""
    match = re.match(r"slurm(?:-wlm)? (\d+\.\d+)\.\d+", version_line.strip())
    assert match, version_line
    return match.group(1)


def test_commands_controller_and_nodes_are_the_release_asked(slurm_cluster, tmp_path) -> None:
    assert slurm_cluster.release == RELEASE
    # what the adapter runs: the first sinfo on this process's PATH
    sinfo = shutil.which("sinfo")
    assert sinfo
    shown = subprocess.run([sinfo, "--version"], capture_output=True, text=True, env=slurm_cluster.env)
    assert release_of(shown.stdout) == RELEASE, shown.stderr
    config = slurm_cluster.run("scontrol", "show", "config").stdout
    assert re.search(rf"^SLURM_VERSION\s*=\s*{re.escape(RELEASE)}\.\d+$", config, re.M), config
    nodes = slurm_cluster.run("scontrol", "show", "node", "-o").stdout.splitlines()
    assert len(nodes) == slurm_cluster.nodes
    assert {re.search(r"\bVersion=(\d+\.\d+)\.", line).group(1) for line in nodes} == {RELEASE}, nodes
    # a job's srun: on the PATH sbatch hands on from this process, and on a fixed one (a tenant's job has it)
    out = tmp_path / "srun.out"
    done = slurm_cluster.run("sbatch", "--wait", "--parsable", "-o", str(out), "--wrap",
                             "srun --version; PATH=/usr/local/bin:/usr/bin:/bin srun --version")
    assert done.returncode == 0, done.stderr
    assert [release_of(line) for line in out.read_text().splitlines()] == [RELEASE, RELEASE]


@pytest.mark.mpi
def test_every_emulated_host_and_an_ssh_login_run_the_release_asked(netns_slurm, netns_hosts) -> None:
    nodes = netns_slurm.run("scontrol", "show", "node", "-o").stdout.splitlines()
    assert {re.search(r"\bNodeName=(\S+)", line).group(1) for line in nodes} == {h.name for h in netns_hosts.hosts}
    assert {re.search(r"\bVersion=(\d+\.\d+)\.", line).group(1) for line in nodes} == {RELEASE}, nodes
    # the SSH transport's commands: an ssh login's own PATH, on the login host
    conf = shlex.quote(str(netns_slurm.conf))
    login = netns_hosts.ssh(netns_hosts.hosts[0], f"SLURM_CONF={conf} sinfo --version; SLURM_CONF={conf} scontrol --version")
    assert login.returncode == 0, login.stderr
    assert [release_of(line) for line in login.stdout.splitlines()] == [RELEASE, RELEASE]
