"""The netns host harness gives real, distinct hosts: own hostname/IP/scratch, pinned-key ssh, and bare
Open MPI and MPICH runs across all three of them.

MPI is launched from inside host node-0 (its net+uts+mount namespaces, via exec_in_host), like from a login
node: node-0 only has lo and its eth0 on the cluster subnet and resolves node-i through the cluster's
/etc/hosts, so no interface pinning (and no root-namespace /etc/hosts trick) is needed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.mpi_programs import ALLREDUCE_C
from tests.harness.netns import HostCluster

pytestmark = [pytest.mark.integration, pytest.mark.mpi]

ROOT = Path(__file__).resolve().parents[3]
# absolute: ssh sessions on the hosts have no venv on their PATH
PYTHON = str(Path(sys.executable).absolute())
MPI_TIMEOUT = 180

def require(*tools: str) -> None:
    """Fail (not skip) when a tool is missing: the project's setup is supposed to install it."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: install openmpi-bin libopenmpi-dev mpich libmpich-dev")


def launcher_env() -> dict[str, str]:
    """This environment minus anything that would steer the launchers (e.g. running inside a Slurm job)."""
    prefixes = ("SLURM_", "OMPI_", "PMIX_", "PMI_", "HYDRA_", "MPIEXEC_", "MPICH_", "I_MPI_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def explain(cluster: HostCluster, result: subprocess.CompletedProcess[str]) -> str:
    logs = "\n".join(f"--- {h.name} sshd.log\n{(h.dir / 'sshd.log').read_text(errors='replace')[-1500:]}"
                     for h in cluster.hosts)
    return f"rc={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{logs}"


def test_each_host_has_own_hostname_ip_hosts_file_and_scratch(mpi_hosts: HostCluster) -> None:
    names = {h.name for h in mpi_hosts.hosts}
    assert socket.gethostname() not in names, "the root namespace's hostname was changed"
    assert mpi_hosts.subnet + "." not in Path("/etc/hosts").read_text(), "the real /etc/hosts was written"
    for host in mpi_hosts.hosts:
        out = mpi_hosts.exec_in_host(host, ["sh", "-c", "hostname; ip -4 -o addr show dev eth0; "
                                            "getent hosts " + " ".join(sorted(names))])
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == host.name
        assert f"inet {host.ip}/24" in lines[1]
        resolved = {line.split()[1]: line.split()[0] for line in lines[2:]}
        assert resolved == {h.name: h.ip for h in mpi_hosts.hosts}
        # /var/tmp is node-local: a file made on this host is seen by no other host
        marker = f"/var/tmp/hpcb-marker-{host.name}"
        assert mpi_hosts.exec_in_host(host, ["touch", marker]).returncode == 0
        assert not Path(marker).exists()
    for host in mpi_hosts.hosts:
        seen = mpi_hosts.exec_in_host(host, ["sh", "-c", "ls /var/tmp"]).stdout.split()
        assert seen == [f"hpcb-marker-{host.name}"]


def test_ssh_reaches_every_host_with_pinned_host_keys(mpi_hosts: HostCluster, tmp_path: Path) -> None:
    config = mpi_hosts.ssh_config.read_text()
    for option in ("StrictHostKeyChecking yes", f"UserKnownHostsFile {mpi_hosts.known_hosts}",
                   "GlobalKnownHostsFile /dev/null", "BatchMode yes", "IdentitiesOnly yes"):
        assert option in config
    for host in mpi_hosts.hosts:
        by_name = mpi_hosts.ssh(host, "hostname")
        assert (by_name.returncode, by_name.stdout.strip()) == (0, host.name), by_name.stderr
        by_ip = mpi_hosts.ssh(host.ip, "hostname")  # known_hosts pins the IP as well
        assert (by_ip.returncode, by_ip.stdout.strip()) == (0, host.name), by_ip.stderr
        # host to host, as launchers do (node-0 is the login node)
        hop = mpi_hosts.exec_in_host(mpi_hosts.hosts[0], [str(mpi_hosts.ssh_wrapper), host.name, "hostname"])
        assert (hop.returncode, hop.stdout.strip()) == (0, host.name), hop.stderr

    first, last = mpi_hosts.hosts[0], mpi_hosts.hosts[-1]
    lines = mpi_hosts.known_hosts.read_text().splitlines()
    missing_last = tmp_path / "known_hosts.missing"
    missing_last.write_text("".join(f"{line}\n" for line in lines if not line.startswith(f"{last.name},")))
    partial = (f"UserKnownHostsFile={missing_last}",)
    assert mpi_hosts.ssh(first, "true", options=partial).returncode == 0
    refused = mpi_hosts.ssh(last, "true", options=partial)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr, refused.stderr

    # a pinned key that does not match (the first host's key under the last host's name) is refused as well
    first_key = lines[0].split(" ", 1)[1]
    wrong = tmp_path / "known_hosts.wrong"
    wrong.write_text("".join(f"{line}\n" for line in lines[:-1]) + f"{last.name},{last.ip} {first_key}\n")
    mismatch = mpi_hosts.ssh(last, "true", options=(f"UserKnownHostsFile={wrong}",))
    assert mismatch.returncode == 255 and "Host key verification failed" in mismatch.stderr, mismatch.stderr


def test_openmpi_mpirun_mpi4py_allreduce_across_hosts(mpi_hosts: HostCluster, tmp_path: Path) -> None:
    require("mpirun.openmpi")
    check = subprocess.run([PYTHON, "-c", "import mpi4py"], capture_output=True, text=True)
    assert check.returncode == 0, f"mpi4py missing in {PYTHON}: {check.stderr}"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{h.name} slots=1\n" for h in mpi_hosts.hosts))
    n = len(mpi_hosts.hosts)
    result = mpi_hosts.exec_in_host(
        mpi_hosts.hosts[0],
        ["mpirun.openmpi", "--allow-run-as-root", "--mca", "plm", "rsh",
         "--mca", "plm_rsh_agent", str(mpi_hosts.ssh_wrapper), "--hostfile", str(hostfile), "-np", str(n),
         PYTHON, str(ROOT / "examples" / "mpi_allreduce.py")],
        timeout=MPI_TIMEOUT, env=launcher_env())
    assert result.returncode == 0, explain(mpi_hosts, result)
    expected = n * (n + 1) // 2
    assert f"allreduce result: {expected} OK" in result.stdout, explain(mpi_hosts, result)
    for host in mpi_hosts.hosts:  # one rank on each host, not three on node-0
        assert f" on {host.name}: allreduce sum={expected}" in result.stdout, explain(mpi_hosts, result)


def test_mpich_hydra_ssh_allreduce_c_across_hosts(mpi_hosts: HostCluster, tmp_path: Path) -> None:
    require("mpicc.mpich", "mpiexec.hydra")
    source = tmp_path / "allreduce.c"
    source.write_text(ALLREDUCE_C)  # tests/harness/mpi_programs.py
    binary = tmp_path / "allreduce.mpich"
    build = subprocess.run(["mpicc.mpich", "-O2", "-o", str(binary), str(source)], capture_output=True, text=True,
                           timeout=MPI_TIMEOUT)
    assert build.returncode == 0, build.stderr
    hostfile = tmp_path / "hostfile.mpich"  # Hydra rejects "slots=": host:count
    hostfile.write_text("".join(f"{h.name}:1\n" for h in mpi_hosts.hosts))
    n = len(mpi_hosts.hosts)
    result = mpi_hosts.exec_in_host(
        mpi_hosts.hosts[0],
        ["mpiexec.hydra", "-launcher", "ssh", "-launcher-exec", str(mpi_hosts.ssh_wrapper),
         "-f", str(hostfile), "-n", str(n), str(binary)],
        timeout=MPI_TIMEOUT, env=launcher_env())
    assert result.returncode == 0, explain(mpi_hosts, result)
    expected = n * (n + 1) // 2
    for host in mpi_hosts.hosts:
        assert f" on {host.name}: allreduce sum={expected} (expect {expected})" in result.stdout, \
            explain(mpi_hosts, result)


def test_stopped_or_frozen_sshd_makes_a_host_unreachable(mpi_hosts: HostCluster) -> None:
    host = mpi_hosts.hosts[-1]
    try:
        mpi_hosts.stop_sshd(host)
        refused = mpi_hosts.ssh(host, "true")
        assert refused.returncode == 255 and "Connection refused" in refused.stderr, refused.stderr
        mpi_hosts.start_sshd(host)
        assert mpi_hosts.ssh(host, "hostname").stdout.strip() == host.name

        mpi_hosts.stop_sshd(host, freeze=True)  # TCP is accepted, but no banner ever comes
        hung = mpi_hosts.ssh(host, "true", options=("ConnectTimeout=3",))
        assert hung.returncode == 255 and "timed out" in hung.stderr, hung.stderr
        mpi_hosts.start_sshd(host)
        assert mpi_hosts.ssh(host, "hostname").stdout.strip() == host.name
    finally:
        mpi_hosts.start_sshd(host)  # leave the session's cluster whole for whatever runs next
