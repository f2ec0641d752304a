"""SSH between the nodes of one job, with every host key pinned.

A job carries two ed25519 keypairs, made once at submit time and shared by its nodes (a Kubernetes
Secret, or a directory on a shared filesystem): the client key every launcher logs in with, and the host
key every node's sshd presents. known_hosts then pins exactly that host key for exactly the job's peer
names, so StrictHostKeyChecking stays on and nothing is ever accepted on first use.

The sshd runs as the job's user on a high port; nothing here needs root.

Imports stay light (socket, selectors, threading, subprocess, shutil load where they are used): every node
of a job imports this module on its start-up path, all of them at once.
"""

from __future__ import annotations

import errno
import os
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from bridge.errors import BackendRejected, InvalidSpec

#: True for the type checker only (which reads any TYPE_CHECKING so): every node imports this module at start-up
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any

    from bridge.mpi.spawn import Process

CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
AUTHORIZED_KEYS = "authorized_keys"
DEFAULT_PORT = 2222


def _keygen(path: Path, comment: str) -> None:
    import shutil
    import subprocess

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


def private_keys(directory: Path, workdir: Path) -> Path:
    """The job's keys where ssh and sshd accept them: *directory* itself when this user owns its files with
    no group or other access, else copies in *workdir*/keys (0600). A Kubernetes Secret volume gives the
    files to root with group access (fsGroup), which OpenSSH refuses for a key its owner loads."""
    names = (CLIENT_KEY, HOST_KEY, f"{HOST_KEY}.pub", AUTHORIZED_KEYS)
    uid = os.geteuid()
    if all((st := os.stat(directory / name)).st_uid == uid and not st.st_mode & 0o077 for name in names[:2]):
        return directory
    copy = workdir / "keys"
    copy.mkdir(mode=0o700)
    for name in names:
        fd = os.open(copy / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write((directory / name).read_bytes())
    return copy


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


def client_config(keys: Path, known_hosts_file: Path, port: int = DEFAULT_PORT, user: str | None = None) -> str:
    # no ControlMaster: launchers open one connection per peer anyway, and a persistent master would have
    # to be shut down at the end of every job (an ssh process per peer)
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
    return "\n".join(lines) + "\n"


def sshd_config(keys: Path, port: int, pid_file: Path, session_env: Mapping[str, str] | None = None) -> str:
    """A private sshd for the job: key login only, to the job's own user, on a high port.

    *session_env* is set in every session it starts (sshd's SetEnv), e.g. where this node's release file is.
    """
    lines = [
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
        "UseDNS no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "MaxStartups 100:30:200",
        "LogLevel ERROR",
    ]
    for name, value in (session_env or {}).items():
        if not name.isidentifier() or any(c in value for c in '"\\\n'):
            raise InvalidSpec("sshd SetEnv", f"{name}={value}", "needs a plain name and a value without quotes")
        lines.append(f'SetEnv "{name}={value}"')
    return "\n".join(lines) + "\n"


class SSHFiles(namedtuple("SSHFiles", "config wrapper known_hosts")):
    """What a launcher on rank 0 uses to reach the peers: the client *config*, the *wrapper* (an executable
    ``ssh -F config "$@"`` for launchers that take a program, not arguments; it waits at the gate, see
    write_client_files) and *known_hosts*."""

    __slots__ = ()


def write_client_files(keys: Path, hosts: Sequence[str], workdir: Path, port: int = DEFAULT_PORT,
                       gate: Path | None = None, go: Path | None = None) -> SSHFiles:
    """Client config, known_hosts and the ssh wrapper in *workdir* (node-local).

    With *gate* (a FIFO that rank 0 holds open) and *go*, the wrapper first waits until the gate is gone, then
    connects only if *go* exists: the launcher can start while the peers' sshd are still coming up, and no
    connection is tried before they answer (nor ever, if they don't).
    """
    known = workdir / "known_hosts"
    known.write_text(known_hosts(hosts, (keys / f"{HOST_KEY}.pub").read_text(), port))
    config = workdir / "ssh_config"
    config.write_text(client_config(keys, known, port))
    wrapper = workdir / "ssh"
    lines = ["#!/bin/sh"]
    if gate is not None and go is not None:
        g = _sh_quote(str(gate))
        lines += [f"if [ -p {g} ]; then read _ 2>/dev/null < {g}; fi", f"[ -e {_sh_quote(str(go))} ] || exit 255"]
    # the real ssh by its path: the wrapper is itself called ssh, first on the PATH of Open MPI's mpirun
    from bridge.mpi.spawn import which

    real = which("ssh", os.pathsep.join(d for d in os.environ.get("PATH", os.defpath).split(os.pathsep)
                                        if d and os.path.abspath(d) != os.path.abspath(workdir))) or "/usr/bin/ssh"
    lines.append(f'exec {_sh_quote(real)} -F {_sh_quote(str(config))} "$@"')
    wrapper.write_text("\n".join(lines) + "\n")
    wrapper.chmod(0o755)
    return SSHFiles(config, wrapper, known)


def _sh_quote(text: str) -> str:
    """shlex.quote, always quoting (shlex itself is a few imports more on every node's start-up)."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def write_sshd_config(keys: Path, workdir: Path, port: int = DEFAULT_PORT,
                      session_env: Mapping[str, str] | None = None) -> Path:
    path = workdir / "sshd_config"
    path.write_text(sshd_config(keys, port, workdir / "sshd.pid", session_env))
    return path


def start_sshd(config: Path, log: Path) -> Process:
    """``sshd -D`` with *config* (a spawn.Process); it logs to *log*."""
    from bridge.mpi.spawn import Process, which

    sshd = which("sshd", os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/usr/local/sbin"]))
    if sshd is None:
        raise BackendRejected("ssh", "sshd not found: install openssh-server on the nodes")
    # sshd refuses to start without its privilege separation directory (made by systemd elsewhere)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    return Process([sshd, "-D", "-e", "-f", str(config), "-E", str(log)], quiet=True)


class _Attempt:
    """One connection to one peer, from connect to its first bytes."""

    def __init__(self, host: str, sock: socket.socket, expires: float) -> None:
        self.host, self.sock, self.expires, self.data = host, sock, expires, b""


class _Names:
    """Peer addresses, looked up in a background thread: a slow DNS answer holds up no probe, and a name that
    does not resolve yet (a pod's record appears once it runs) is asked again with backoff, not 100 times a
    second. Known names are looked up again every *refresh* seconds while their peer has not answered."""

    def __init__(self, hosts: Sequence[str], port: int, refresh: float = 1.0) -> None:
        import threading

        self.port, self.refresh = port, refresh
        self.addresses: dict[str, list[tuple[int, int, int, Any]]] = {}
        self.wanted = set(hosts)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(list(hosts),), daemon=True)
        self.thread.start()

    def _run(self, hosts: list[str]) -> None:
        import socket

        due = dict.fromkeys(hosts, 0.0)
        backoff = dict.fromkeys(hosts, 0.05)
        while not self.done.is_set():
            now = time.monotonic()
            with self.lock:
                todo = [host for host in hosts if host in self.wanted and due[host] <= now]
            for host in todo:
                try:
                    infos = socket.getaddrinfo(host, self.port, type=socket.SOCK_STREAM)
                except OSError:
                    due[host] = time.monotonic() + backoff[host]
                    backoff[host] = min(1.0, backoff[host] * 2)
                    continue
                with self.lock:
                    self.addresses[host] = [(family, kind, proto, address) for family, kind, proto, _, address in infos]
                due[host] = time.monotonic() + self.refresh
            with self.lock:
                upcoming = [due[host] for host in hosts if host in self.wanted]
            if not upcoming:
                return
            self.done.wait(max(0.0, min(upcoming) - time.monotonic()))

    def get(self, host: str) -> list[tuple[int, int, int, Any]]:
        with self.lock:
            return self.addresses.get(host, [])

    def answered(self, host: str) -> None:
        with self.lock:
            self.wanted.discard(host)

    def close(self) -> None:
        self.done.set()


def wait_resolvable(host: str, deadline_seconds: float) -> None:
    """Until *host* resolves: a launcher decides at start which hostfile entry is its own host by the address
    the name resolves to (a pod's DNS record appears a moment after the pod has its address)."""
    import socket

    deadline = time.monotonic() + deadline_seconds
    pause = 0.05
    while True:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise BackendRejected("launch", f"this host's name {host} does not resolve: {exc}") from None
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def wait_for_peers(hosts: Sequence[str], port: int, deadline_seconds: float, *, interval: float = 0.01,
                   attempt_timeout: float = 2.0, stop: Callable[[], bool] | None = None) -> bool:
    """Until every host's sshd answers on *port* (sends its ``SSH-`` banner): True, or False once *stop* says so.

    One non-blocking loop connects to all pending hosts at once and retries each *interval* after a refusal;
    a peer that accepts but sends no banner (a frozen sshd) is retried after *attempt_timeout*. When the
    deadline passes first, BackendRejected names the hosts that never answered.
    """
    pending = list(dict.fromkeys(hosts))
    deadline = time.monotonic() + deadline_seconds
    probe = _PeerProbe(pending, port, interval, attempt_timeout)
    try:
        while pending:
            now = time.monotonic()
            probe.connect_due(now)
            if stop is not None and stop():
                return False
            if now >= deadline:
                shown = ", ".join(pending[:10]) + (f" and {len(pending) - 10} more" if len(pending) > 10 else "")
                raise BackendRejected("launch", f"peers never answered ssh on port {port} within "
                                                f"{deadline_seconds:g}s: {shown}")
            probe.serve(max(0.0, probe.wake(now, deadline) - now))
            probe.expire(time.monotonic())
        return True
    finally:
        probe.close()


class _PeerProbe:
    """The connections of one ``wait_for_peers``: per pending host, its attempt in flight or when it is
    tried again. A host leaves *pending* (the caller's list) once its sshd's banner arrives."""

    def __init__(self, pending: list[str], port: int, interval: float, attempt_timeout: float) -> None:
        import selectors

        self.pending = pending
        self.interval, self.attempt_timeout = interval, attempt_timeout
        self.retry_at = dict.fromkeys(pending, 0.0)
        self.tries = dict.fromkeys(pending, 0)
        self.attempts: dict[socket.socket, _Attempt] = {}
        self.selector = selectors.DefaultSelector()
        self.names = _Names(pending, port)

    def connect_due(self, now: float) -> None:
        """Starts a connection to every host whose retry time has come (its addresses taken in turn)."""
        import selectors
        import socket

        for host in [h for h in self.pending if h in self.retry_at and self.retry_at[h] <= now]:
            addresses = self.names.get(host)
            if not addresses:
                self.retry_at[host] = now + self.interval
                continue
            self.tries[host] += 1
            family, kind, proto, address = addresses[(self.tries[host] - 1) % len(addresses)]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            if sock.connect_ex(address) not in (0, errno.EINPROGRESS):
                sock.close()
                self.retry_at[host] = now + self.interval
                continue
            del self.retry_at[host]
            self.attempts[sock] = _Attempt(host, sock, now + self.attempt_timeout)
            self.selector.register(sock, selectors.EVENT_WRITE)

    def wake(self, now: float, deadline: float) -> float:
        """When something is next due: a retry, an attempt's expiry, the deadline, or a look at *stop*."""
        return min([deadline, now + 0.05, *self.retry_at.values(), *(a.expires for a in self.attempts.values())])

    def serve(self, timeout: float) -> None:
        """Reads what the ready connections say: a banner answers its host; a refusal, a close or another
        protocol's greeting has it tried again."""
        import selectors
        import socket

        for key, events in self.selector.select(timeout):
            attempt = self.attempts[key.fileobj]  # type: ignore[index]  # the socket registered, given back
            now = time.monotonic()
            if events & selectors.EVENT_WRITE:
                if attempt.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self.give_up(attempt, now)
                else:
                    self.selector.modify(attempt.sock, selectors.EVENT_READ)
                continue
            try:
                chunk = attempt.sock.recv(8 - len(attempt.data))
            except OSError:
                chunk = b""
            attempt.data += chunk
            if attempt.data.startswith(b"SSH-"):
                self.pending.remove(attempt.host)
                self.names.answered(attempt.host)
                self._drop(attempt)
            elif not chunk or not b"SSH-".startswith(attempt.data[:4]):
                self.give_up(attempt, now)

    def expire(self, now: float) -> None:
        """Tries again every host whose attempt has waited past its timeout (a frozen sshd)."""
        for attempt in [a for a in self.attempts.values() if a.expires <= now]:
            self.give_up(attempt, now)

    def give_up(self, attempt: _Attempt, now: float) -> None:
        self._drop(attempt)
        self.retry_at[attempt.host] = now + self.interval

    def _drop(self, attempt: _Attempt) -> None:
        self.selector.unregister(attempt.sock)
        del self.attempts[attempt.sock]
        attempt.sock.close()

    def close(self) -> None:
        self.names.close()
        for sock in self.attempts:
            sock.close()
        self.selector.close()
