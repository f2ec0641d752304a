"""SSH between the nodes of one job, with every host key pinned.

A job carries two ed25519 keypairs, made once at submit time and shared by its nodes (a Kubernetes
Secret, or a directory on a shared filesystem): the client key every launcher logs in with, and the host
key every node's sshd presents. known_hosts then pins exactly that host key for exactly the job's peer
names, so StrictHostKeyChecking stays on and nothing is ever accepted on first use.

The sshd runs as the job's user on a high port; nothing here needs root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import BackendRejected, InvalidSpec

CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
AUTHORIZED_KEYS = "authorized_keys"
DEFAULT_PORT = 2222


def _keygen(path: Path, comment: str) -> None:
    if shutil.which("ssh-keygen") is None:
        raise BackendRejected("ssh", "ssh-keygen not found: install openssh-client")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def create_job_keys(directory: str | os.PathLike[str], job: str = "hpcbridge") -> Path:
    """Make the job's client and host keypairs and authorized_keys in *directory* (mode 0700)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    for name in (CLIENT_KEY, HOST_KEY):
        if not (directory / name).exists():
            _keygen(directory / name, f"{job}-{'client' if name == CLIENT_KEY else 'host'}")
    (directory / AUTHORIZED_KEYS).write_text((directory / f"{CLIENT_KEY}.pub").read_text())
    return directory


def load_job_keys(directory: str | os.PathLike[str]) -> Path:
    directory = Path(directory)
    for name in (CLIENT_KEY, HOST_KEY, f"{HOST_KEY}.pub", AUTHORIZED_KEYS):
        if not (directory / name).is_file():
            raise InvalidSpec("--ssh-dir", str(directory), f"missing {name}; make the keys with create_job_keys")
    return directory


def host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts(hosts: Iterable[str], host_public_key: str, port: int = DEFAULT_PORT) -> str:
    """One line pinning the job's host key to exactly these names (short and full)."""
    names: list[str] = []
    for host in hosts:
        for name in (host, host.split(".")[0]):
            entry = host_entry(name, port)
            if entry not in names:
                names.append(entry)
    key_type, key = host_public_key.split()[:2]
    return f"{','.join(names)} {key_type} {key}\n"


def client_config(keys: Path, known_hosts_file: Path, port: int = DEFAULT_PORT, user: str | None = None,
                  control_dir: Path | None = None) -> str:
    lines = [
        "Host *",
        f"  Port {port}",
        f"  IdentityFile {keys / CLIENT_KEY}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {known_hosts_file}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
        "  LogLevel ERROR",
        "  ConnectTimeout 10",
        "  ConnectionAttempts 3",
    ]
    if user:
        lines.insert(2, f"  User {user}")
    if control_dir is not None:
        # one connection per peer, shared by the launcher's daemons and the final release: each new ssh
        # handshake costs ~0.35 s on small nodes
        lines += ["  ControlMaster auto", f"  ControlPath {control_dir}/%C", "  ControlPersist 60"]
    return "\n".join(lines) + "\n"


def sshd_config(keys: Path, port: int, pid_file: Path) -> str:
    """A private sshd for the job: key login only, to the job's own user, on a high port."""
    return "\n".join([
        f"Port {port}",
        f"HostKey {keys / HOST_KEY}",
        f"AuthorizedKeysFile {keys / AUTHORIZED_KEYS}",
        f"PidFile {pid_file}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        # keys may live on a shared scratch filesystem whose parents are group/world writable
        "StrictModes no",
        "UsePAM no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "MaxStartups 100:30:200",
        "LogLevel ERROR",
    ]) + "\n"


@dataclass(frozen=True)
class SSHFiles:
    config: Path
    wrapper: Path
    known_hosts: Path
    sshd_config: Path
    sshd_pid: Path


def write_ssh_files(keys: Path, hosts: Sequence[str], workdir: Path, port: int = DEFAULT_PORT) -> SSHFiles:
    """Client config, known_hosts and a Hydra-compatible wrapper in *workdir* (node-local)."""
    known = workdir / "known_hosts"
    known.write_text(known_hosts(hosts, (keys / f"{HOST_KEY}.pub").read_text(), port))
    config = workdir / "ssh_config"
    control = workdir / "cm"
    control.mkdir(mode=0o700, exist_ok=True)
    config.write_text(client_config(keys, known, port, control_dir=control))
    wrapper = workdir / "ssh"
    wrapper.write_text(f"#!/bin/sh\nexec ssh -F '{config}' \"$@\"\n")
    wrapper.chmod(0o755)
    pid = workdir / "sshd.pid"
    sshd = workdir / "sshd_config"
    sshd.write_text(sshd_config(keys, port, pid))
    return SSHFiles(config, wrapper, known, sshd, pid)


def start_sshd(files: SSHFiles, log: Path) -> subprocess.Popen:
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        raise BackendRejected("ssh", "sshd not found: install openssh-server on the nodes")
    # sshd refuses to start without its privilege separation directory (made by systemd elsewhere)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    return subprocess.Popen([sshd, "-D", "-e", "-f", str(files.sshd_config), "-E", str(log)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ssh_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when something on host:port speaks SSH (sends an SSH-2.0 banner)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def wait_for_peers(hosts: Sequence[str], port: int, deadline_seconds: float, clock=time.monotonic,
                   sleep=time.sleep, probe=ssh_answers) -> None:
    """Probe every peer in parallel until all answer or one deadline passes; name the ones that never did."""
    pending = list(dict.fromkeys(hosts))
    deadline = clock() + deadline_seconds
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(pending)))) as pool:
        while pending:
            answered = list(pool.map(lambda h: probe(h, port), pending))
            pending = [host for host, ok in zip(pending, answered, strict=True) if not ok]
            if not pending:
                return
            if clock() >= deadline:
                shown = ", ".join(pending[:10]) + (f" and {len(pending) - 10} more" if len(pending) > 10 else "")
                raise BackendRejected("launch", f"peers never answered ssh on port {port} within "
                                                f"{deadline_seconds:g}s: {shown}")
            sleep(0.05)
