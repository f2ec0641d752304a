"""``hpcbridge launch``: the one command every node of an allocation runs.

It discovers the peers, writes the hostfile, builds the launcher's command line and runs it, forwarding
SIGTERM/SIGINT so a cancel stops every rank, and exits with the launcher's code. ``LaunchSpec`` is the
contract between the renderers (which write its arguments into batch scripts) and this command.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bridge.errors import InvalidSpec
from bridge.mpi import discovery, launchers, ssh
from bridge.mpi.hostfile import hostfile_for

LAUNCHERS = ("openmpi", "mpich", "intel", "torchrun", "plain", "flux")
MPI = ("openmpi", "mpich", "intel")


@dataclass(frozen=True)
class LaunchSpec:
    launcher: str
    discovery: str
    procs_per_node: int
    command: tuple[str, ...]
    nodes: int | None = None
    forward_env: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    node_rank: int | None = None
    hostfile: str | None = None
    rdzv_port: int = 29500
    job_id: str = ""
    #: directory with the job's SSH keys (mpi.ssh.create_job_keys); enables ssh between nodes
    ssh_dir: str | None = None
    ssh_port: int = ssh.DEFAULT_PORT
    #: how long rank 0 waits for every peer's sshd before giving up
    wait_timeout: float = 120.0
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise InvalidSpec("--launcher", self.launcher, f"use one of {', '.join(LAUNCHERS)}")
        if self.discovery not in discovery.SOURCES:
            raise InvalidSpec("--discovery", self.discovery, f"use one of {', '.join(discovery.SOURCES)}")
        if self.procs_per_node < 1:
            raise InvalidSpec("--procs-per-node", self.procs_per_node, "must be at least 1")
        if not self.command:
            raise InvalidSpec("command", None, "nothing to launch: give the command after --")

    def to_args(self) -> list[str]:
        """The ``hpcbridge launch`` arguments that recreate this spec (what renderers embed)."""
        args = ["--launcher", self.launcher, "--discovery", self.discovery, "--procs-per-node", str(self.procs_per_node)]
        if self.nodes is not None:
            args += ["--nodes", str(self.nodes)]
        for host in self.hosts:
            args += ["--host", host]
        if self.node_rank is not None:
            args += ["--node-rank", str(self.node_rank)]
        if self.hostfile:
            args += ["--hostfile", self.hostfile]
        if self.launcher == "torchrun":
            args += ["--rdzv-port", str(self.rdzv_port)]
        if self.job_id:
            args += ["--job-id", self.job_id]
        if self.ssh_dir:
            args += ["--ssh-dir", self.ssh_dir, "--ssh-port", str(self.ssh_port),
                     "--wait-timeout", f"{self.wait_timeout:g}"]
        for name in self.forward_env:
            args += ["--forward-env", name]
        return [*args, "--", *self.command]


def launch_argv(spec: LaunchSpec, topology: discovery.Topology, workdir: str,
                ssh_settings: launchers.SSHSettings | None = None) -> list[str] | None:
    """What this node runs, or None when this node has nothing to start (MPI ranks other than 0)."""
    if spec.launcher in MPI:
        if topology.rank != 0:
            return None
        path = os.path.join(workdir, "hostfile")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(hostfile_for(spec.launcher, topology.peers))
        if spec.launcher == "openmpi":
            return launchers.openmpi_argv(topology, path, spec.command, spec.forward_env, ssh=ssh_settings)
        return launchers.hydra_argv(topology, path, spec.command, spec.forward_env, ssh=ssh_settings,
                                    mpiexec="mpiexec" if spec.launcher == "intel" else None)
    if spec.launcher == "torchrun":
        if launchers.calls_torchrun(spec.command):
            return list(spec.command)  # Kubeflow style: the command runs torchrun, which reads PET_* (child_env)
        return launchers.torchrun_argv(topology, spec.command, spec.rdzv_port, spec.job_id)
    if spec.launcher == "flux":
        if topology.rank != 0:
            return None
        if spec.discovery == "slurm":
            # a Flux-policy job on Slurm: srun is the PMI launcher there, as flux run is under Flux
            return launchers.srun_argv(topology, spec.command, mpi="pmix")
        return launchers.flux_run_argv(topology, spec.command)
    return list(spec.command)


def child_env(spec: LaunchSpec, base: Mapping[str, str], topology: discovery.Topology) -> dict[str, str]:
    env = dict(base)
    env.update(spec.extra_env)
    if spec.launcher == "torchrun" and launchers.calls_torchrun(spec.command):
        env.update(launchers.torch_env(topology, spec.rdzv_port))
    if spec.launcher == "openmpi" and os.geteuid() == 0:
        # Open MPI refuses root without both variables; containers and CI commonly run as root.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if spec.discovery == "local" and spec.launcher == "openmpi":
        # all "nodes" share this machine: let ranks exceed the core count and don't pin them
        env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
        env.setdefault("OMPI_MCA_hwloc_base_binding_policy", "none")
    return env


def run_child(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run *argv* in its own process group, forward SIGTERM/SIGINT/SIGHUP to it, return a shell-style code.

    The handlers are installed before the child starts: a signal that arrives while it starts is held
    and delivered to it as soon as it exists, instead of killing us and orphaning it.
    """
    child: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            pending.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        try:
            child = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)
        except FileNotFoundError:
            print(f"hpcbridge launch: {argv[0]}: command not found", file=sys.stderr)
            return 127
        except PermissionError:
            print(f"hpcbridge launch: {argv[0]}: permission denied", file=sys.stderr)
            return 126
        for signum in pending:
            forward(signum, None)
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


_T0 = time.monotonic()


def trace(message: str) -> None:
    """Phase timings on stderr when HPCBRIDGE_TRACE is set (why is my launch slow?)."""
    if os.environ.get("HPCBRIDGE_TRACE"):
        print(f"[hpcbridge launch +{time.monotonic() - _T0:.3f}s] {message}", file=sys.stderr, flush=True)


def done_marker(job_id: str, host: str) -> str:
    """The file rank 0 creates on a peer (over ssh) to tell it the job is over."""
    return f"/tmp/hpcbridge-{job_id or 'job'}.{host}.done"


def release_token(keys: Path, job_id: str, host: str) -> bytes:
    """What rank 0 sends a peer to end it: an HMAC only holders of the job's private key can make."""
    secret = (keys / ssh.CLIENT_KEY).read_bytes()
    return hmac.new(secret, f"release {job_id} {host}".encode(), hashlib.sha256).hexdigest().encode()


def serve_peer(spec: LaunchSpec, topology: discovery.Topology, files: ssh.SSHFiles, workdir: str,
               keys: Path, poll: float = 0.05) -> int:
    """A non-zero MPI rank: serve sshd for the launcher until rank 0 says the job is over.

    Rank 0 says so on the release port (sshd's port + 1) with a token made from the job's key; a file it
    creates over ssh is the fallback where that port is not reachable.
    """
    host = topology.hosts[topology.rank]
    marker = done_marker(spec.job_id, host)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(marker)
    expected = release_token(keys, spec.job_id, host)
    listener = socket.socket(socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", spec.ssh_port + 1))
        listener.listen(8)
        listener.settimeout(poll)
    except OSError:
        listener.close()
        listener = None  # the marker file alone will do
    sshd = ssh.start_sshd(files, Path(workdir) / "sshd.log")
    stopping: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _f: stopping.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        while not stopping and not os.path.exists(marker):
            if sshd.poll() is not None:
                log = (Path(workdir) / "sshd.log").read_text(errors="replace").strip().splitlines()
                print(f"hpcbridge launch: sshd exited with code {sshd.returncode}: {log[-1] if log else ''}",
                      file=sys.stderr)
                return 1
            if listener is None:
                time.sleep(poll)
            elif _released(listener, expected):
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if listener is not None:
            listener.close()
        sshd.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sshd.wait(timeout=5)
        if sshd.poll() is None:
            sshd.kill()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)
    return 128 + stopping[0] if stopping else 0


def _released(listener: socket.socket, expected: bytes) -> bool:
    try:
        conn, _ = listener.accept()
    except (TimeoutError, OSError):
        return False
    with conn:
        conn.settimeout(2.0)
        try:
            data = conn.recv(128).strip()
        except OSError:
            return False
        ok = hmac.compare_digest(data, expected)
        with contextlib.suppress(OSError):
            conn.sendall(b"ok\n" if ok else b"no\n")
        return ok


def release_peers(spec: LaunchSpec, topology: discovery.Topology, files: ssh.SSHFiles, keys: Path) -> None:
    """Tell every peer the job is over (best effort, in parallel): their sshd stops and they exit."""
    peers = [host for index, host in enumerate(topology.hosts) if index != topology.rank]
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

    def release(host: str) -> None:
        try:
            with socket.create_connection((host, spec.ssh_port + 1), timeout=5) as conn:
                conn.settimeout(5)
                conn.sendall(release_token(keys, spec.job_id, host) + b"\n")
                if conn.recv(8).startswith(b"ok"):
                    return
        except OSError:
            pass
        # fallback: the same message as a file, written over ssh
        subprocess.run(["ssh", "-F", str(files.config), host, "touch", done_marker(spec.job_id, host)],
                       timeout=30, check=False, **quiet)

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(peers)))) as pool:
        list(pool.map(release, dict.fromkeys(peers)))
        # close the launcher's shared connections, so no ssh master outlives the job
        list(pool.map(lambda host: subprocess.run(["ssh", "-F", str(files.config), "-O", "exit", host], timeout=10,
                                                  check=False, **quiet), dict.fromkeys(peers)))


def run(spec: LaunchSpec) -> int:
    trace("started")
    topology = discovery.discover(spec.discovery, slots=spec.procs_per_node, nodes=spec.nodes, hosts=spec.hosts,
                                  rank=spec.node_rank, hostfile=spec.hostfile)
    with tempfile.TemporaryDirectory(prefix=f"hpcbridge-{spec.job_id[:8] or 'job'}-") as workdir:
        if spec.launcher in MPI and spec.ssh_dir and len(topology.hosts) > 1:
            keys = ssh.load_job_keys(spec.ssh_dir)
            files = ssh.write_ssh_files(keys, topology.hosts, Path(workdir), spec.ssh_port)
            if topology.rank != 0:
                return serve_peer(spec, topology, files, workdir, keys)
            own = topology.hosts[topology.rank]
            try:
                trace("waiting for peers")
                ssh.wait_for_peers([h for h in topology.hosts if h != own], spec.ssh_port, spec.wait_timeout)
                trace("peers answer; starting the launcher")
                argv = launch_argv(spec, topology, workdir,
                                   launchers.SSHSettings(str(files.config), str(files.wrapper)))
                assert argv is not None
                return run_child(argv, child_env(spec, os.environ, topology))
            finally:
                # also when a peer never came up: the ones that did must not serve forever
                trace("releasing peers")
                release_peers(spec, topology, files, keys)
                trace("released")
        argv = launch_argv(spec, topology, workdir)
        if argv is None:
            return 0
        return run_child(argv, child_env(spec, os.environ, topology))
