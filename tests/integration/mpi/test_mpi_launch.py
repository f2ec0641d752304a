"""`hpcbridge launch` on three real hosts (netns + sshd): the environment a scheduler gives, nothing faked.

Every host runs the same command; rank 0 waits for the peers' per-job sshd, writes the hostfile and runs
the MPI launcher over ssh with pinned host keys; the other ranks serve sshd until rank 0 releases them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.mpi.ssh import create_job_keys
from tests.harness.mpi_programs import build_allreduce

pytestmark = [pytest.mark.integration, pytest.mark.mpi]

ROOT = Path(__file__).resolve().parents[3]
# scheduler variables of an enclosing CI job would steer the launchers away from ssh
_SCRUB = ("SLURM_", "OMPI_", "PMI", "PMIX_", "HYDRA_", "I_MPI_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    return {**env, **extra}


@pytest.fixture(scope="module")
def job_keys(mpi_hosts) -> Path:
    return create_job_keys(mpi_hosts.base_dir / "job-keys", "test-job")


@pytest.fixture(scope="module")
def programs(mpi_hosts) -> dict[str, Path]:
    return {impl: build_allreduce(mpi_hosts.base_dir, f"mpicc.{impl}") for impl in ("openmpi", "mpich")}


def launch_argv(job_keys: Path, hosts, launcher: str, command: list[str], job_id: str, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "bridge", "launch", "--launcher", launcher, "--discovery", "explicit",
            "--procs-per-node", "1", "--job-id", job_id, "--ssh-dir", str(job_keys), "--wait-timeout", "60"]
    for host in hosts:
        argv += ["--host", host.name]
    return [*argv, *extra, "--", *command]


def run_everywhere(mpi_hosts, argv_for, env=None, skip=()) -> dict[str, subprocess.Popen]:
    """Start the launch command on every host, peers first (a real scheduler starts them in any order)."""
    procs = {}
    for host in reversed(mpi_hosts.hosts):
        if host.name in skip:
            continue
        procs[host.name] = mpi_hosts.run_in_host(host, argv_for(host), cwd=str(ROOT), env=env or clean_env(),
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return procs


def finish(procs: dict[str, subprocess.Popen], timeout: float = 180) -> dict[str, tuple[int, str]]:
    results = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=timeout)
        results[name] = (proc.returncode, out)
    return results


def test_openmpi_mpi4py_allreduce_across_three_hosts(mpi_hosts, job_keys) -> None:
    command = [sys.executable, str(ROOT / "examples" / "mpi_allreduce.py")]
    results = finish(run_everywhere(mpi_hosts, lambda h: launch_argv(job_keys, mpi_hosts.hosts, "openmpi", command,
                                                                      "ompi-py")))
    code, out = results["node-0"]
    assert code == 0, out
    assert "allreduce result: 6 OK" in out
    assert {f"on node-{i}" for i in range(3)} <= {part for line in out.splitlines() for part in
                                                   [line.split(":")[0].split(" ", 2)[-1]]}
    assert all(code == 0 for code, _ in results.values()), results


def test_openmpi_c_allreduce_across_three_hosts(mpi_hosts, job_keys, programs) -> None:
    results = finish(run_everywhere(mpi_hosts, lambda h: launch_argv(job_keys, mpi_hosts.hosts, "openmpi",
                                                                      [str(programs["openmpi"])], "ompi-c")))
    code, out = results["node-0"]
    assert code == 0, out
    assert "allreduce result: 6 OK" in out
    assert sorted(line.split(" on ")[1].split(":")[0] for line in out.splitlines() if " on node-" in line) == \
        ["node-0", "node-1", "node-2"]


def test_mpich_hydra_allreduce_across_three_hosts(mpi_hosts, job_keys, programs) -> None:
    results = finish(run_everywhere(mpi_hosts, lambda h: launch_argv(job_keys, mpi_hosts.hosts, "mpich",
                                                                      [str(programs["mpich"])], "mpich-c")))
    code, out = results["node-0"]
    assert code == 0, out
    assert "allreduce result: 6 OK" in out
    assert all(code == 0 for code, _ in results.values()), results


def test_env_is_forwarded_to_remote_ranks(mpi_hosts, job_keys) -> None:
    # one write per rank: print() writes its pieces one by one, and mpirun's forwarding interleaved them
    script = ("import os; from mpi4py import MPI; os.write(1, f\"rank {MPI.COMM_WORLD.rank} sees "
              "{os.environ['SECRET_SAUCE']!r}\\n\".encode())")
    value = "a 'quoted' $(value)\twith tab"
    results = finish(run_everywhere(
        mpi_hosts, lambda h: launch_argv(job_keys, mpi_hosts.hosts, "openmpi", [sys.executable, "-c", script],
                                         "ompi-env", "--forward-env", "SECRET_SAUCE"),
        env=clean_env(SECRET_SAUCE=value)))
    code, out = results["node-0"]
    assert code == 0, out
    assert out.count(f"sees {value!r}") == 3


def test_peer_without_sshd_fails_within_the_deadline_naming_it(mpi_hosts, job_keys) -> None:
    argv = lambda h: launch_argv(job_keys, mpi_hosts.hosts, "openmpi", ["true"], "no-peer",  # noqa: E731
                                 "--wait-timeout", "5")
    procs = run_everywhere(mpi_hosts, argv, skip=("node-2",))
    code, out = finish({"node-0": procs.pop("node-0")}, timeout=60)["node-0"]
    assert code == 1
    assert "peers never answered ssh on port 2222 within 5s: node-2" in out
    assert "node-1" not in out.split("within")[1]
    # rank 0 released the peer that did come up
    assert finish(procs, timeout=60)["node-1"][0] == 0


def wait_for_lines(path: Path, count: int, timeout: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (not path.exists() or len(path.read_text().splitlines()) < count):
        time.sleep(0.2)
    return path.read_text().splitlines() if path.exists() else []


def assert_gone(pids) -> None:
    """Every rank process has exited (the hosts share one pid namespace; a zombie counts as gone)."""
    for pid in pids:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as stat:
            assert stat.read().split()[2] == "Z", f"rank process {pid} still running"


def test_killed_rank_fails_the_job_and_leaves_nothing_running(mpi_hosts, job_keys) -> None:
    marker = mpi_hosts.base_dir / "rank-pids"
    marker.unlink(missing_ok=True)
    script = (f"import os, time\nfrom mpi4py import MPI\nopen({str(marker)!r}, 'a').write(f'{{MPI.COMM_WORLD.rank}} "
              "{os.getpid()}\\n')\nMPI.COMM_WORLD.Barrier()\ntime.sleep(300)\n")
    procs = run_everywhere(mpi_hosts, lambda h: launch_argv(job_keys, mpi_hosts.hosts, "openmpi",
                                                            [sys.executable, "-c", script], "kill-rank"))
    ranks = dict(line.split() for line in wait_for_lines(marker, 3))
    assert len(ranks) == 3
    victim = mpi_hosts.host("node-2")
    mpi_hosts.exec_in_host(victim, ["kill", "-9", ranks["2"]])
    results = finish(procs)
    assert results["node-0"][0] != 0, results["node-0"][1]
    assert_gone(ranks.values())


def listening_ports(mpi_hosts, host) -> set[int]:
    out = mpi_hosts.exec_in_host(host, ["ss", "-Hltn"])
    assert out.returncode == 0, out.stderr
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.stdout.splitlines()}


def test_sigterm_on_rank_0_stops_every_rank(mpi_hosts, job_keys) -> None:
    marker = mpi_hosts.base_dir / "term-pids"
    marker.unlink(missing_ok=True)
    script = (f"import os, time\nfrom mpi4py import MPI\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
              "time.sleep(300)\n")
    procs = run_everywhere(mpi_hosts, lambda h: launch_argv(job_keys, mpi_hosts.hosts, "openmpi",
                                                            [sys.executable, "-c", script], "term-job"))
    assert len(wait_for_lines(marker, 3)) == 3
    procs["node-0"].send_signal(signal.SIGTERM)
    results = finish(procs)
    codes = {name: code for name, (code, _) in results.items()}
    # rank 0 forwards SIGTERM to mpirun, which stops the ranks and exits 1; rank 0 exits with the launcher's code
    # and releases the peers, which end normally (0): none of them was killed, none is left serving
    assert codes == {"node-0": 1, "node-1": 0, "node-2": 0}, results
    assert not any("Traceback" in out for _, out in results.values()), results
    assert_gone(marker.read_text().split())
    for host in mpi_hosts.hosts[1:]:  # the peers' sshd and release listener are gone with them
        assert not listening_ports(mpi_hosts, host) & {2222, 2223}, host.name


def test_peer_whose_release_port_is_taken_is_released_over_ssh(mpi_hosts, job_keys, programs) -> None:
    """Where sshd's port + 1 is not the peer's (taken here by a stranger that answers nothing), rank 0 falls
    back to ssh: it creates the peer's release file, whose private path the peer's sshd gives the session."""
    squatter_code = ("import socket\ns = socket.create_server(('', 2223))\nprint('listening', flush=True)\n"
                     "while True:\n    c, _ = s.accept()\n    c.close()\n")
    victim = mpi_hosts.host("node-2")
    squatter = mpi_hosts.run_in_host(victim, [sys.executable, "-c", squatter_code], stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "listening"
        results = finish(run_everywhere(mpi_hosts, lambda h: launch_argv(job_keys, mpi_hosts.hosts, "openmpi",
                                                                          [str(programs["openmpi"])], "fallback")))
    finally:
        squatter.kill()
        squatter.wait()
    code, out = results["node-0"]
    assert code == 0, out
    assert "allreduce result: 6 OK" in out
    assert {name: code for name, (code, _) in results.items()} == {"node-0": 0, "node-1": 0, "node-2": 0}, results
    assert not listening_ports(mpi_hosts, victim) & {2222, 2223}


def test_torchrun_ddp_across_two_hosts(mpi_hosts) -> None:
    hosts = mpi_hosts.hosts[:2]
    argv = [sys.executable, "-m", "bridge", "launch", "--launcher", "torchrun", "--discovery", "explicit",
            "--procs-per-node", "1", "--job-id", "ddp-2-hosts", "--host", "node-0", "--host", "node-1",
            "--", sys.executable, str(ROOT / "examples" / "torch_ddp.py")]
    procs = {}
    for host in hosts:
        procs[host.name] = mpi_hosts.run_in_host(host, argv, cwd=str(ROOT), env=clean_env(), stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True)
    results = finish(procs)
    assert all(code == 0 for code, _ in results.values()), results
    combined = "".join(out for _, out in results.values())
    assert "ddp allreduce result: 3.000 OK" in combined
    assert combined.count("grad=1.500 expected=1.500") == 2


def _as_pid1(command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`hpcbridge launch -- sh -c COMMAND` as PID 1 of a new PID namespace with its own /proc: what a pod's
    container runs."""
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "bridge", "launch", "--launcher",
            "plain", "--discovery", "explicit", "--host", "localhost", "--node-rank", "0", "--", "sh", "-c",
            command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=ROOT)


def test_launch_as_pid1_reaps_orphans_passes_signals_and_exits_as_its_command() -> None:
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("no PID namespaces here (unshare --pid needs root)")
    # orphans (as sshd's and orted's children become) end reparented to PID 1: none may stay a zombie
    orphans = _as_pid1('for i in 1 2 3; do (sleep 0.1 &); done; sleep 1; '
                       'echo "pid1=$(cat /proc/1/comm)"; '
                       'echo "zombies=$(grep -l "^State:.*Z" /proc/[0-9]*/status 2>/dev/null | wc -l)"; exit 3')
    assert orphans.returncode == 3, orphans.stderr
    assert "zombies=0" in orphans.stdout and "pid1=python" in orphans.stdout, orphans.stdout
    # SIGTERM to PID 1 (a pod being deleted) reaches the command, which ends as a shell reports it
    stopped = _as_pid1('trap "echo got TERM; exit 143" TERM; kill -TERM 1; sleep 30 & wait')
    assert stopped.returncode == 143 and "got TERM" in stopped.stdout, (stopped.returncode, stopped.stdout,
                                                                       stopped.stderr)
