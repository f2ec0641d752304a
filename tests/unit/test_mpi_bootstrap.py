"""Peer discovery from recorded scheduler environments, hostfiles, launcher argv, SSH files, the launch spec."""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

import pytest

from bridge.cli import build_parser
from bridge.errors import BackendRejected, InvalidSpec
from bridge.mpi import discovery, launchers, ssh
from bridge.mpi.bootstrap import launch_argv
from bridge.mpi.hostfile import Peer, hydra_hostfile, openmpi_hostfile
from bridge.mpi.spec import LaunchSpec

ROOT = Path(__file__).resolve().parents[2]

SLURM_ENV = {  # recorded inside `sbatch -N3 --ntasks-per-node=2` on the test cluster
    "SLURM_JOB_ID": "17", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "3",
    "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_NTASKS": "6",
}


def test_slurm_discovery() -> None:
    topology = discovery.discover("slurm", slots=2, nodes=3, env=SLURM_ENV)
    assert topology.hosts == ("node1", "node2", "node3") and topology.rank == 1 and topology.master == "node1"


def test_slurm_node_count_mismatch_is_reported() -> None:
    with pytest.raises(InvalidSpec, match="the slurm allocation has 3 hosts"):
        discovery.discover("slurm", slots=1, nodes=4, env=SLURM_ENV)


@pytest.mark.parametrize(("text", "expected"), [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2(x2)", [1, 2, 2])])
def test_tasks_per_node(text: str, expected: list[int]) -> None:
    assert discovery.parse_tasks_per_node(text) == expected


def test_tasks_per_node_malformed() -> None:
    with pytest.raises(InvalidSpec, match="item 2"):
        discovery.parse_tasks_per_node("2,x")


def test_jobset_discovery_from_pod_hostname() -> None:
    env = {"JOB_COMPLETION_INDEX": "2", "JOBSET_NAME": "train"}
    topology = discovery.from_jobset(env, slots=4, nodes=3, hostname="train-node-0-2")
    assert topology.hosts == ("train-node-0-0.train", "train-node-0-1.train", "train-node-0-2.train")
    assert topology.rank == 2


def test_kubeflow_hostfile_discovery(tmp_path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("pi-node-0-0.pi slots=2\npi-node-0-1.pi slots=2\n# comment\npi-launcher-0-0.pi slots=2\n")
    topology = discovery.from_hostfile(str(path), slots=2, rank=None, own_host="pi-launcher-0-0")
    assert topology.rank == 2 and len(topology.hosts) == 3


def test_explicit_rank_from_hostname_or_error() -> None:
    assert discovery.explicit(["a", "b.x"], 1, None, own_host="b").rank == 1
    with pytest.raises(InvalidSpec, match="not among the peers"):
        discovery.explicit(["a", "b"], 1, None, own_host="c")


def test_hostfile_formats_merge_repeated_hosts() -> None:
    peers = [Peer("localhost", 2), Peer("localhost", 2), Peer("n2", 1)]
    assert openmpi_hostfile(peers) == "localhost slots=4\nn2 slots=1\n"
    assert hydra_hostfile(peers) == "localhost:4\nn2:1\n"


def test_launcher_argv() -> None:
    topology = discovery.Topology(("n0", "n1"), 0, 2)
    settings = launchers.SSHSettings("/k/ssh_config", "/k/ssh")
    assert launchers.openmpi_argv(topology, "/h", ["app"], ["A"], ssh=settings) == [
        "mpirun", "--hostfile", "/h", "-np", "4", "--mca", "plm", "rsh", "-x", "A", "app"]
    # no path in any MCA setting: mpirun copies them onto every orted's command line, and the wrapper exists on
    # node 0 alone (orted aborts on an agent path it cannot find); the wrapper is the `ssh` on mpirun's PATH
    assert launchers.openmpi_ssh_env(settings, "/usr/bin:/bin") == {
        "PATH": "/k:/usr/bin:/bin", "OMPI_MCA_plm_rsh_agent": "ssh", "OMPI_MCA_plm_rsh_no_tree_spawn": "1"}
    assert launchers.hydra_argv(topology, "/h", ["app"], ["A", "B"], ssh=settings, mpiexec="mpiexec.hydra") == [
        "mpiexec.hydra", "-f", "/h", "-n", "4", "-launcher", "ssh", "-launcher-exec", "/k/ssh", "-genvlist", "A,B",
        "app"]
    argv = launchers.torchrun_argv(discovery.Topology(("n0", "n1"), 1, 2), ["python3", "t.py"], 29500, "uid",
                                   torchrun="torchrun")
    assert argv[1:6] == ["--nnodes=2", "--nproc-per-node=2", "--node-rank=1", "--master-addr=n0", "--master-port=29500"]
    assert not any(arg.startswith("--rdzv-backend") for arg in argv)  # static: no dynamic rendezvous to shut down
    assert argv[-3:] == ["--no-python", "python3", "t.py"]


def test_torchrun_without_a_torchrun_binary_is_torch_distributed_run(tmp_path, monkeypatch) -> None:
    # torch reached through PYTHONPATH (a shared software tree) installs no console script
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(launchers.sys, "executable", str(tmp_path / "python3"))
    argv = launchers.torchrun_argv(discovery.Topology(("n0",), 0, 1), ["python3", "t.py"], 29500, "uid")
    assert argv[:4] == [str(tmp_path / "python3"), "-m", "torch.distributed.run", "--nnodes=1"]


def test_command_that_calls_torchrun_gets_pet_env(tmp_path) -> None:
    spec = LaunchSpec("torchrun", "explicit", 2, ("torchrun", "train.py"), hosts=("n0", "n1"), node_rank=1)
    topology = discovery.Topology(("n0", "n1"), 1, 2)
    assert launch_argv(spec, topology, str(tmp_path)) == ["torchrun", "train.py"]
    from bridge.mpi.bootstrap import child_env

    env = child_env(spec, {}, topology)
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_MASTER_ADDR"]) == ("2", "1", "n0")


def test_mpi_ranks_other_than_zero_start_nothing(tmp_path) -> None:
    spec = LaunchSpec("openmpi", "slurm", 1, ("app",))
    assert launch_argv(spec, discovery.Topology(("a", "b"), 1, 1), str(tmp_path)) is None
    argv = launch_argv(spec, discovery.Topology(("a", "b"), 0, 1), str(tmp_path))
    assert argv[:4] == ["mpirun", "--hostfile", str(tmp_path / "hostfile"), "-np"]
    assert (tmp_path / "hostfile").read_text() == "a slots=1\nb slots=1\n"


def test_launch_spec_round_trips_through_the_cli_parser() -> None:
    spec = LaunchSpec("mpich", "explicit", 3, ("python3", "-c", "x -- y"), nodes=2, forward_env=("A", "B"),
                      hosts=("h1", "h2"), node_rank=1, job_id="u", ssh_dir="/keys", ssh_port=2022, wait_timeout=7)
    args = build_parser().parse_args(["launch", *spec.to_args()])
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    again = LaunchSpec(args.launcher, args.discovery, args.procs_per_node, tuple(command), nodes=args.nodes,
                       forward_env=tuple(args.forward_env), hosts=tuple(args.host), node_rank=args.node_rank,
                       job_id=args.job_id, ssh_dir=args.ssh_dir, ssh_port=args.ssh_port,
                       wait_timeout=args.wait_timeout)
    assert again == spec


def test_bad_launch_spec() -> None:
    with pytest.raises(InvalidSpec, match="--launcher"):
        LaunchSpec("slurmrun", "local", 1, ("x",))
    with pytest.raises(InvalidSpec, match="nothing to launch"):
        LaunchSpec("plain", "local", 1, ())


def test_known_hosts_pins_the_job_host_key_for_each_name() -> None:
    line = ssh.known_hosts(["n0.sub", "n1.sub"], "ssh-ed25519 AAAAKEY job-host\n", port=2222)
    assert line == "[n0.sub]:2222,[n0]:2222,[n1.sub]:2222,[n1]:2222 ssh-ed25519 AAAAKEY\n"
    assert ssh.known_hosts(["n0"], "ssh-ed25519 K", port=22) == "n0 ssh-ed25519 K\n"


def test_client_config_never_accepts_unknown_keys(tmp_path) -> None:
    text = ssh.client_config(tmp_path, tmp_path / "kh")
    assert "StrictHostKeyChecking yes" in text and "GlobalKnownHostsFile /dev/null" in text
    assert "StrictHostKeyChecking no" not in text


class BannerServer:
    """A listener on 127.0.0.x that greets each connection with *greeting* (None: accepts and stays silent)."""

    def __init__(self, address: str, port: int = 0, greeting: bytes | None = b"SSH-2.0-test\r\n") -> None:
        import socket

        self.sock = socket.create_server((address, port))
        self.port = self.sock.getsockname()[1]
        self.greeting = greeting
        self.conns: list = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.greeting is not None:
                conn.sendall(self.greeting)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_wait_for_peers_until_every_sshd_answers() -> None:
    up = BannerServer("127.0.0.1")
    late: list[BannerServer] = []
    timer = threading.Timer(0.3, lambda: late.append(BannerServer("127.0.0.2", up.port)))
    timer.start()  # a peer whose sshd comes up while we probe: refused first, then answers
    try:
        assert ssh.wait_for_peers(["127.0.0.1", "127.0.0.2", "127.0.0.1"], up.port, 30) is True
    finally:
        timer.join()
        up.close()
        for server in late:
            server.close()


def test_wait_for_peers_names_the_ones_that_never_answered() -> None:
    up = BannerServer("127.0.0.1")
    frozen = BannerServer("127.0.0.3", up.port, greeting=None)  # accepts, never greets (a stopped sshd)
    http = BannerServer("127.0.0.4", up.port, greeting=b"HTTP/1.1 400 Bad Request\r\n")
    try:
        with pytest.raises(BackendRejected, match=r"within 0.5s: 127.0.0.2, 127.0.0.3, 127.0.0.4, nohost.invalid$"):
            ssh.wait_for_peers(["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "nohost.invalid"], up.port,
                               0.5, attempt_timeout=0.1)
    finally:
        for server in (up, frozen, http):
            server.close()


def test_wait_for_peers_stops_when_asked() -> None:
    assert ssh.wait_for_peers(["127.0.0.2"], 9, 30, stop=lambda: True) is False


def test_job_keys_are_made_once(tmp_path) -> None:
    keys = ssh.create_job_keys(tmp_path / "k", "job")
    first = (keys / ssh.CLIENT_KEY).read_text()
    ssh.create_job_keys(keys, "job")
    assert (keys / ssh.CLIENT_KEY).read_text() == first
    assert (keys / ssh.AUTHORIZED_KEYS).read_text() == (keys / f"{ssh.CLIENT_KEY}.pub").read_text()
    assert oct((keys).stat().st_mode & 0o777) == "0o700"
    with pytest.raises(InvalidSpec, match="missing"):
        ssh.load_job_keys(tmp_path)


def test_release_needs_the_jobs_token(tmp_path) -> None:
    import socket
    import threading

    from bridge.mpi.peers import _released, release_token

    keys = ssh.create_job_keys(tmp_path / "k", "job")
    other = ssh.create_job_keys(tmp_path / "other", "job")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    port = listener.getsockname()[1]
    expected = release_token(keys, "job-1", "node-1")

    def send(token: bytes, answers: list) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(token + b"\n")
            answers.append(conn.recv(8))

    for token, accepted in ((release_token(other, "job-1", "node-1"), False),  # another job's key
                            (release_token(keys, "job-1", "node-2"), False),   # meant for another host
                            (expected, True)):
        answers: list = []
        sender = threading.Thread(target=send, args=(token, answers))
        sender.start()
        assert _released(listener, expected) is accepted
        sender.join()
        assert answers == [b"ok\n" if accepted else b"no\n"]
    listener.close()


def test_workdirs_are_private_and_unguessable(tmp_path, monkeypatch) -> None:
    import os
    import stat

    from bridge.mpi.bootstrap import private_workdir, remove_workdir
    from bridge.mpi.peers import release_file

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    first, second = private_workdir("job-1"), private_workdir("job-1")
    try:
        assert first != second  # a fresh random name every time: nothing to pre-create
        for workdir in (first, second):
            info = os.lstat(workdir)
            assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            assert stat.S_IMODE(info.st_mode) == 0o700  # nobody else can enter it, so nobody can plant a file
            assert os.path.dirname(release_file(workdir)) == workdir
    finally:
        remove_workdir(first)
        remove_workdir(second)
    assert not os.path.exists(first) and not os.path.exists(second)


def test_peer_sshd_tells_its_sessions_where_the_release_file_is(tmp_path) -> None:
    text = ssh.sshd_config(tmp_path, 2222, tmp_path / "pid", {"HPCBRIDGE_RELEASE_FILE": "/w/x y/released"})
    assert 'SetEnv "HPCBRIDGE_RELEASE_FILE=/w/x y/released"' in text.splitlines()
    with pytest.raises(InvalidSpec, match="SetEnv"):
        ssh.sshd_config(tmp_path, 2222, tmp_path / "pid", {"A": 'say "hi"'})


def _free_port_pair() -> int:
    """A port P with P + 1 free too (sshd's port and the release port)."""
    import socket

    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no free port pair")


def test_peer_ignores_a_planted_marker_and_forged_tokens_and_ends_on_its_release_file(tmp_path, monkeypatch) -> None:
    import socket
    import time
    from pathlib import Path

    from bridge.mpi import bootstrap, peers, spawn

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    keys = ssh.create_job_keys(tmp_path / "k", "job")
    port = _free_port_pair()
    job = f"plant-{port}"
    spec = LaunchSpec("openmpi", "explicit", 1, ("app",), hosts=("node-0", "node-1"), node_rank=1, job_id=job,
                      ssh_dir=str(keys), ssh_port=port)
    topology = discovery.Topology(("node-0", "node-1"), 1, 1)
    workdir = bootstrap.private_workdir(job)
    planted = Path(f"/tmp/hpcbridge-{job}.node-1.done")  # where the release marker used to be: anyone could make it
    planted.touch()
    configs: list[str] = []
    sshds: list = []
    answers: list = []

    def fake_sshd(config, log):
        configs.append(config.read_text())
        sshds.append(spawn.Process(["sleep", "60"]))
        return sshds[-1]

    def rank_0() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                conn = socket.create_connection(("127.0.0.1", port + 1), timeout=5)
            except OSError:
                time.sleep(0.01)
                continue
            with conn:  # a token that was not made with the job's key is refused ...
                conn.sendall(b"forged\n")
                answers.append(conn.recv(8))
            break
        Path(peers.release_file(workdir)).touch()  # ... the peer's own release file (over ssh) is not

    thread = threading.Thread(target=rank_0)
    thread.start()
    try:
        assert peers.serve_peer(spec, topology, keys, workdir, start_sshd=fake_sshd, poll=0.01) == 0
    finally:
        thread.join()
        planted.unlink()
        bootstrap.remove_workdir(workdir)
    assert answers == [b"no\n"]
    assert f'SetEnv "{peers.RELEASE_ENV}={peers.release_file(workdir)}"' in configs[0].splitlines()
    assert sshds[0].returncode == -15  # the peer stopped its sshd


def test_ssh_wrapper_waits_at_the_gate_and_connects_only_on_go(tmp_path, monkeypatch) -> None:
    import os
    import select
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\necho "ssh $*"\n')  # stands in for the real client
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    keys = ssh.create_job_keys(tmp_path / "k", "job")
    # the wrapper runs the ssh found when it is written, by path (it is on mpirun's PATH as `ssh` itself)
    monkeypatch.setenv("PATH", env["PATH"])
    for go_ahead in (True, False):
        work = tmp_path / f"work-{go_ahead}"
        work.mkdir()
        gate, go = work / "gate", work / "go"
        files = ssh.write_client_files(keys, ["n1"], work, 2222, gate=gate, go=go)
        os.mkfifo(gate)
        held = os.open(gate, os.O_RDWR)
        wrapper = subprocess.Popen([str(files.wrapper), "n1", "orted"], stdout=subprocess.PIPE, env=env)
        readable, _, _ = select.select([wrapper.stdout], [], [], 0.3)
        assert not readable and wrapper.poll() is None  # held at the gate
        if go_ahead:
            go.touch()
        gate.unlink()
        os.close(held)
        out, _ = wrapper.communicate(timeout=30)
        if go_ahead:
            assert (wrapper.returncode, out.decode()) == (0, f"ssh -F {files.config} n1 orted\n")
        else:
            assert (wrapper.returncode, out) == (255, b"")
    # without a gate the wrapper is plain ssh with the job's config
    plain = ssh.write_client_files(keys, ["n1"], tmp_path, 2222)
    out = subprocess.run([str(plain.wrapper), "n1", "true"], capture_output=True, text=True, env=env, check=True)
    assert out.stdout == f"ssh -F {plain.config} n1 true\n"


def test_spawned_processes_report_like_popen(tmp_path) -> None:
    import os
    import signal

    from bridge.mpi.spawn import Process

    assert Process(["sh", "-c", "exit 3"]).wait() == 3
    sleeper = Process(["sleep", "60"], new_session=True, quiet=True)
    try:
        assert os.getsid(sleeper.pid) == sleeper.pid  # its own session and process group
        with open(f"/proc/{sleeper.pid}/status") as status:
            ignored = int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
        assert not ignored & (1 << (signal.SIGPIPE - 1))  # Python ignores SIGPIPE; the child gets the default
        with pytest.raises(TimeoutError):
            sleeper.wait(0.05)
        assert sleeper.poll() is None
    finally:
        assert sleeper.end() == -signal.SIGTERM
    with pytest.raises(FileNotFoundError):
        Process(["hpcbridge-no-such-program"])
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        Process([str(script)])


def test_jax_processes_get_kubeflows_coordinates_and_every_visible_gpu() -> None:
    from bridge.mpi import bootstrap
    from bridge.mpi.discovery import Topology

    spec = bootstrap.LaunchSpec(launcher="plain", discovery="slurm", procs_per_node=1, command=("python3", "t.py"),
                                nodes=2, rdzv_port=29500, framework="jax")
    assert spec.to_args()[:12] == ["--launcher", "plain", "--discovery", "slurm", "--procs-per-node", "1",
                                   "--nodes", "2", "--framework", "jax", "--rdzv-port", "29500"]
    second = Topology(("node-0", "node-1"), 1, 1)
    env = bootstrap.child_env(spec, {"CUDA_VISIBLE_DEVICES": "2,3"}, second)
    assert {k: v for k, v in env.items() if k.startswith("JAX_")} == {
        "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "node-0:29500",
        "JAX_LOCAL_DEVICE_IDS": "0,1"}  # ordinals after CUDA_VISIBLE_DEVICES, not the physical ids
    assert "JAX_LOCAL_DEVICE_IDS" not in bootstrap.child_env(spec, {}, second)
    assert not any(k.startswith("JAX_") for k in bootstrap.child_env(spec._replace(framework=""), {}, second))
    with pytest.raises(InvalidSpec, match="--framework"):
        bootstrap.LaunchSpec(launcher="plain", discovery="slurm", procs_per_node=1, command=("x",), framework="tf")


def test_a_jax_runtime_renders_its_coordinates_on_every_hpc_backend() -> None:
    from bridge import service

    for backend in ("slurm", "flux", "local"):
        prepared = service.render(str(ROOT / "examples" / "jax-allgather.yaml"), to=backend)
        assert (prepared.plan.framework, prepared.plan.nodes) == ("jax", 2)
        # the launch arguments as each artifact spells them: a script line, a jobspec string, a YAML list
        assert re.search(r"--framework\W+jax\W+--rdzv-port\W+29500", prepared.artifact.text()), backend


def test_the_gpus_a_node_sees_come_from_cuda_or_the_container_runtime() -> None:
    from bridge.mpi.launchers import node_gpus, worker_gpus

    assert node_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b", "NVIDIA_VISIBLE_DEVICES": "x"}) == ["GPU-a", "GPU-b"]
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []  # Flux: none
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}) == ["0", "2"]  # CUDA stops at an invalid entry
    # Kubernetes' device plugin: UUIDs in NVIDIA_VISIBLE_DEVICES, numbered from 0 inside the container
    assert node_gpus({"NVIDIA_VISIBLE_DEVICES": "GPU-node-1-0,GPU-node-1-3"}) == ["0", "1"]
    assert node_gpus({"NVIDIA_VISIBLE_DEVICES": "all"}) == node_gpus({"NVIDIA_VISIBLE_DEVICES": "void"}) == []
    assert node_gpus({}) == []
    assert worker_gpus(["4", "5", "6", "7"], 2) == ["4,5", "6,7"]
    assert worker_gpus(["4", "5"], 2) == ["4", "5"]
    assert worker_gpus(["4"], 2) == [None, None]  # fewer GPUs than workers: each sees what the node has
    assert worker_gpus([], 3) == [None, None, None]


def test_xgboost_workers_get_kubeflows_variables_one_task_per_gpu() -> None:
    from bridge.mpi.discovery import Topology
    from bridge.mpi.launchers import xgboost_env, xgboost_tracker_argv

    second = Topology(("node-0", "node-1"), 1, 2)
    assert xgboost_env(second, 29512, 1) == {"DMLC_TRACKER_URI": "node-0", "DMLC_TRACKER_PORT": "29512",
                                             "DMLC_TASK_ID": "3", "DMLC_NUM_WORKER": "4"}
    # 12 workers: ids padded to one width, so the tracker's string order is the numeric one
    assert xgboost_env(Topology(tuple(f"n{i}" for i in range(6)), 0, 2), 1, 1)["DMLC_TASK_ID"] == "01"
    argv = xgboost_tracker_argv(["/opt/env/bin/python3.12", "train.py"], 4, 29512)
    assert argv[0] == "/opt/env/bin/python3.12" and argv[-2:] == ["4", "29512"]
    assert xgboost_tracker_argv(["./train"], 4, 1)[0] == sys.executable


def test_shared_node_jobs_move_the_coordinator_port_by_job_id() -> None:
    from bridge.mpi import bootstrap

    spec = bootstrap.LaunchSpec(launcher="plain", discovery="slurm", procs_per_node=1, command=("x",),
                                rdzv_port=29500, framework="xgboost")
    assert bootstrap.job_port(spec, {"SLURM_JOB_ID": "1234"}) == 29734
    assert bootstrap.job_port(spec, {"SLURM_JOB_ID": "1235"}) == 29735  # the next job: another port
    flux = spec._replace(discovery="flux")
    assert bootstrap.job_port(flux, {"FLUX_JOB_ID": "ƒ2RyHVBf1"}) == bootstrap.job_port(flux, {"FLUX_JOB_ID": "ƒ2RyHVBf1"})
    assert 29500 <= bootstrap.job_port(flux, {"FLUX_JOB_ID": "ƒ2RyHVBf1"}) < 29500 + bootstrap.PORT_SPREAD
    assert bootstrap.job_port(spec._replace(discovery="jobset"), {"SLURM_JOB_ID": "7"}) == 29500  # own network
    assert bootstrap.job_port(spec, {}) == 29500


def test_an_xgboost_node_starts_each_worker_and_the_first_failure_ends_them(tmp_path) -> None:
    from bridge.mpi import bootstrap
    from bridge.mpi.discovery import Topology

    out = tmp_path / "out"
    out.mkdir()
    # worker 1 fails once worker 0 has written its line (a loaded machine may start it late); worker 0 would
    # sleep a minute unless it is stopped
    script = ('echo "$DMLC_TASK_ID $DMLC_NUM_WORKER ${CUDA_VISIBLE_DEVICES-none}" > "$OUT/$DMLC_TASK_ID"; '
              'if [ "$DMLC_TASK_ID" = 3 ]; then until [ -s "$OUT/2" ]; do sleep 0.05; done; exit 5; fi; '
              'sleep 60; touch "$OUT/waited"')
    spec = bootstrap.LaunchSpec(launcher="plain", discovery="explicit", procs_per_node=2,
                                command=("sh", "-c", script), hosts=("a", "b"), node_rank=1, framework="xgboost")
    code = bootstrap.run_xgboost(spec, Topology(("a", "b"), 1, 2),
                                 {**os.environ, "OUT": str(out), "CUDA_VISIBLE_DEVICES": "6,7"})
    assert code == 5
    assert sorted(path.read_text() for path in out.iterdir()) == ["2 4 6\n", "3 4 7\n"]
    with pytest.raises(InvalidSpec, match="HPCBRIDGE_XGBOOST_TRACKER"):
        bootstrap.run_xgboost(spec, Topology(("a", "b"), 1, 2), {"HPCBRIDGE_XGBOOST_TRACKER": "both"})
