"""MPI peers between hosts without a scheduler: a non-zero rank serves the job's sshd until rank 0 releases it,
on the release port with a token made from the job's key, or else through its release file over ssh."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from bridge.mpi import discovery, ssh
from bridge.mpi.exits import STOPPING, signal_code
from bridge.mpi.spec import LaunchSpec
from bridge.mpi.timing import trace

#: True for the type checker only (which reads any TYPE_CHECKING so): importing typing would add to the
#: start-up of every node of every job
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any

    from bridge.mpi.spawn import Process

#: set in a peer's sshd sessions: the file that releases that peer (rank 0's fallback to the release port)
RELEASE_ENV = "HPCBRIDGE_RELEASE_FILE"


def release_file(workdir: str) -> str:
    """The file whose creation (by rank 0, over ssh) releases a peer: inside the peer's private workdir, so no
    other user can create it first. Rank 0 never needs the path: the peer's sshd puts it in RELEASE_ENV."""
    return os.path.join(workdir, "released")


def release_token(keys: Path, job_id: str, host: str) -> bytes:
    """What rank 0 sends a peer to end it: an HMAC only holders of the job's private key can make."""
    import hashlib
    import hmac

    secret = (keys / ssh.CLIENT_KEY).read_bytes()
    return hmac.new(secret, f"release {job_id} {host}".encode(), hashlib.sha256).hexdigest().encode()


def serve_peer(spec: LaunchSpec, topology: discovery.Topology, keys: Path, workdir: str,
               start_sshd: Callable[[Path, Path], Process] = ssh.start_sshd, poll: float = 0.05) -> int:
    """A non-zero MPI rank: serve sshd for the launcher until rank 0 says the job is over.

    Rank 0 says so on the release port (sshd's port + 1) with a token made from the job's key; where that
    port is not reachable it creates this peer's release file over ssh instead (the path reaches its ssh
    session in RELEASE_ENV). sshd starts first: rank 0 is waiting for it.
    """
    host = topology.hosts[topology.rank]
    marker = release_file(workdir)
    config = ssh.write_sshd_config(keys, Path(workdir), spec.ssh_port, {RELEASE_ENV: marker})
    log = Path(workdir) / "sshd.log"
    stopping: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _f: stopping.append(signum)) for sig in STOPPING}
    sshd = listener = None
    try:
        sshd = start_sshd(config, log)
        trace("sshd started")
        import socket

        listener = socket.socket(socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("", spec.ssh_port + 1))
            listener.listen(64)
            listener.settimeout(poll)
        except OSError:
            listener.close()
            listener = None  # the release file alone will do
        expected = release_token(keys, spec.job_id, host)
        while not stopping and not os.path.exists(marker):
            if sshd.poll() is not None:
                lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
                print(f"hpcbridge launch: sshd exited with code {sshd.returncode}: {lines[-1] if lines else ''}",
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
        if sshd is not None:
            sshd.end()
    trace(f"stopped by signal {stopping[0]}" if stopping else "released")
    return signal_code(stopping[0]) if stopping else 0


def _released(listener: socket.socket, expected: bytes) -> bool:
    try:
        conn, _ = listener.accept()
    except OSError:  # TimeoutError included
        return False
    with conn:
        conn.settimeout(2.0)
        try:
            data = conn.recv(128).strip()
        except OSError:
            return False
        import hmac

        ok = hmac.compare_digest(data, expected)
        try:
            conn.sendall(b"ok\n" if ok else b"no\n")
        except OSError:
            pass
        return ok


def _each(function: Callable[[str], None], items: Iterable[str], workers: int = 32) -> None:
    """function(item) for every item, up to *workers* at a time (threads: the work is waiting on the network)."""
    import threading

    queue = list(items)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            function(item)

    threads = [threading.Thread(target=work) for _ in range(min(workers, len(queue)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def release_peers(spec: LaunchSpec, tokens: Mapping[str, bytes], files: ssh.SSHFiles) -> None:
    """Tell every peer the job is over (best effort, in parallel): their sshd stops and they exit."""

    def release(host: str) -> None:
        import socket

        try:
            with socket.create_connection((host, spec.ssh_port + 1), timeout=5) as conn:
                conn.settimeout(5)
                conn.sendall(tokens[host] + b"\n")
                if conn.recv(8).startswith(b"ok"):
                    return
        except OSError:
            pass
        # fallback: the peer's release file, created over ssh; its sshd tells the session where it is
        import subprocess

        quiet: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        try:
            subprocess.run(["ssh", "-F", str(files.config), host, f'touch "${RELEASE_ENV}"'], timeout=30,
                           check=False, **quiet)
        except (OSError, subprocess.SubprocessError):
            pass

    _each(release, tokens)
