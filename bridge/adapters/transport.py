"""How commands reach a login host: this machine's shell, or SSH (shared by the slurm and flux adapters).

Every remote command line is built with shlex quoting; SSH host keys are checked against a known_hosts
file and never accepted on first use; one connection is reused and re-opened with backoff when it drops.
Failures to reach the host raise ``BackendUnavailable`` (retryable); a command's own exit status is
returned, not raised, so each adapter decides what it means.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.errors import BackendRejected, BackendUnavailable, InvalidSpec

if TYPE_CHECKING:
    import paramiko


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


#: A fixed POSIX sh program that hands a job's environment to a command on its fd 3 (``sbatch
#: --export-file=3``) with no value on a command line, in a file or in a process environment. Its stdin starts
#: with a count, then one NAME=value line per entry (``job_env_input``); ``read`` takes a pipe's bytes one at a
#: time, so the rest of stdin (the batch script) is left whole for the command. The builtin printf writes the
#: entries NUL-separated into a pipe that becomes the command's fd 3.
JOB_ENV_READER = r"""IFS= read -r n || exit 125
case $n in ''|*[!0-9]*) exit 125;; esac
e=
while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; e="$e$l
"; n=$((n - 1)); done
exec 4<&0
set -f; IFS='
'
printf '%b\0' $e | { exec 3<&0 0<&4 4<&-; exec "$@"; }"""


def job_env_input(env: Mapping[str, str]) -> str:
    """The head of JOB_ENV_READER's stdin: backslashes and newlines escaped as printf's %b reads them back."""
    lines = (f"{name}={value}".replace("\\", "\\\\").replace("\n", "\\n") for name, value in env.items())
    return f"{len(env)}\n" + "".join(f"{line}\n" for line in lines)


class Transport(ABC):
    name = "transport"

    @abstractmethod
    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0,
            resend: bool = True, job_env: Mapping[str, str] | None = None) -> CommandResult:
        """Run *argv* (no shell) on the target host and return its status and output. Without *resend* a
        command whose connection broke after it was sent is not sent again (it may have run: a submit is
        looked up before it is retried, by the caller). With *job_env*, the whole environment of the job
        *argv* submits: the command reads it on fd 3 as NUL-separated NAME=value entries (JOB_ENV_READER),
        and none of it is on a command line or in the command's own environment."""

    @abstractmethod
    def stream(self, argv: Sequence[str], timeout: float = 24 * 3600.0, check: bool = True) -> Iterator[str]:
        """Run *argv* and yield its stdout as it comes (``logs -f``); with *check*, a failing exit raises
        BackendRejected after the output."""

    def close(self) -> None:  # noqa: B027 - optional hook: transports without connections keep this no-op
        """Release connections; the transport may be used again afterwards."""


class LocalTransport(Transport):
    """Commands on this machine, with extra environment (e.g. SLURM_CONF for a non-default cluster)."""

    name = "local"

    def __init__(self, env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        # what a command that submits a job for someone else runs with (job_env): the cluster's own settings,
        # a PATH to find the command, where Slurm's configuration is, and the locale; never the rest of this
        # process's environment
        self.minimal_env = {**{name: value for name, value in os.environ.items()
                               if name in ("PATH", "SLURM_CONF", "LANG", "LANGUAGE") or name.startswith("LC_")},
                            **(env or {})}
        self.cwd = cwd

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0,
            resend: bool = True, job_env: Mapping[str, str] | None = None) -> CommandResult:
        asked, env = argv, self.env
        if job_env is not None:
            argv, stdin, env = ["sh", "-c", JOB_ENV_READER, "sh", *argv], job_env_input(job_env) + (stdin or ""), \
                self.minimal_env
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                    env=env, cwd=self.cwd)
        except FileNotFoundError:
            raise BackendUnavailable(self.name, f"{argv[0]}: command not found on this machine") from None
        # A timer kills it, rather than communicate(timeout=...): with a timeout, Popen.wait polls with sleeps
        # from 0.5 ms up, which cost every sbatch half a millisecond (an eighth of the call).
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            stdout, stderr = proc.communicate(stdin)
        finally:
            timer.cancel()
            if proc.poll() is None:  # interrupted: never leave the command behind
                proc.kill()
                proc.wait()
        if expired.is_set():
            raise BackendUnavailable(self.name, f"{asked[0]} did not answer within {timeout:g}s")
        return CommandResult(tuple(asked), proc.returncode, stdout, stderr)

    def stream(self, argv: Sequence[str], timeout: float = 24 * 3600.0, check: bool = True) -> Iterator[str]:
        try:
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                                    cwd=self.cwd, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise BackendUnavailable(self.name, f"{argv[0]}: command not found on this machine") from None
        assert proc.stdout is not None and proc.stderr is not None
        try:
            for line in iter(proc.stdout.readline, b""):
                yield line.decode("utf-8", errors="replace")
            err = proc.stderr.read().decode("utf-8", errors="replace")
            code = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if code != 0 and check:
            raise BackendRejected(self.name, f"{argv[0]} exited {code}: {' '.join(err.split())[:300]}")


class SSHTransport(Transport):
    """Commands on a login host over one reused paramiko connection."""

    name = "ssh"

    def __init__(self, host: str, port: int = 22, user: str | None = None, key_file: str | None = None,
                 known_hosts_file: str | None = None, env: Mapping[str, str] | None = None,
                 connect_timeout: float = 10.0, retries: int = 3, backoff: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep,
                 known_hosts_field: str = "spec.slurm.knownHostsFile") -> None:
        #: the cluster's field that names the known_hosts file, for errors about it
        self.known_hosts_field = known_hosts_field
        if not known_hosts_file:
            raise InvalidSpec(known_hosts_field, None,
                              "the SSH transport needs a known_hosts file: host keys are never accepted unseen")
        self.host, self.port, self.user = host, port, user
        # config files say ~/.ssh/...; paramiko does not expand ~
        self.key_file = os.path.expanduser(key_file) if key_file else None
        self.known_hosts_file = os.path.expanduser(known_hosts_file)
        self.env = dict(env or {})
        self.connect_timeout, self.retries, self.backoff, self._sleep = connect_timeout, retries, backoff, sleep
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self.connects = 0  # how many times a connection was opened (tests and benchmarks read it)

    def _connect(self) -> paramiko.SSHClient:
        import paramiko  # only when an SSH cluster is used: keeps the CLI fast

        client = paramiko.SSHClient()
        self._load_host_keys(client)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(self.host, port=self.port, username=self.user, key_filename=self.key_file,
                           timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                           auth_timeout=self.connect_timeout, allow_agent=False, look_for_keys=False)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise BackendUnavailable(self.name, f"host key of {self.host} does not match known_hosts: {exc}") from None
        except paramiko.SSHException as exc:
            client.close()
            if "not found in known_hosts" in str(exc):
                raise BackendUnavailable(self.name, f"{self.host} is not in {self.known_hosts_file}; "
                                                    "add its host key (never auto-accepted)") from None
            raise
        self.connects += 1
        return client

    def _load_host_keys(self, client: paramiko.SSHClient) -> None:
        """The known_hosts file into *client*; one that is missing or unreadable fails at once, saying how to
        make it (no retry brings a file)."""
        try:
            client.load_host_keys(self.known_hosts_file)
        except OSError as exc:
            port = f"-p {self.port} " if self.port != 22 else ""
            host, file = shlex.quote(self.host), shlex.quote(self.known_hosts_file)
            raise InvalidSpec(self.known_hosts_field, self.known_hosts_file,
                              f"cannot read the known_hosts file ({exc.strerror or exc}); add {self.host}'s host key "
                              f"after checking it (`ssh-keyscan {port}{host} | ssh-keygen -lf -` prints its "
                              f"fingerprints, to compare with the ones your site publishes): `ssh-keyscan -H "
                              f"{port}{host} >> {file}`") from None

    def _client_or_connect(self) -> paramiko.SSHClient:
        transport = self._client.get_transport() if self._client is not None else None
        if self._client is None or not transport or not transport.is_active():
            self._client = self._connect()
        return self._client

    def command_line(self, argv: Sequence[str]) -> str:
        prefix = ["env", *(f"{k}={v}" for k, v in sorted(self.env.items()))] if self.env else []
        return shlex.join([*prefix, *argv])

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0,
            resend: bool = True, job_env: Mapping[str, str] | None = None) -> CommandResult:
        import paramiko

        line = self.command_line(argv)
        if job_env is not None:
            # values go on stdin to the fixed reader, never on the remote command line (sshd and ps see it)
            line = self.command_line(["sh", "-c", JOB_ENV_READER, "sh", *argv])
            stdin = job_env_input(job_env) + (stdin or "")
        delay = self.backoff
        for attempt in range(self.retries + 1):
            sent = False
            try:
                with self._lock:
                    client = self._client_or_connect()
                    sent = True
                    chan_in, _, _ = client.exec_command(line, timeout=timeout)
                    channel = chan_in.channel
                    if stdin is not None:
                        channel.sendall(stdin.encode())
                    channel.shutdown_write()
                    out, err = _drain(channel, timeout)
                    code = channel.recv_exit_status()
                return CommandResult(tuple(argv), code, out.decode("utf-8", errors="replace"),
                                     err.decode("utf-8", errors="replace"))
            except BackendUnavailable:
                raise
            except (OSError, EOFError, paramiko.SSHException) as exc:
                self.close()
                if sent and not resend:
                    raise BackendUnavailable(self.name, f"{self.host}:{self.port}: connection lost after "
                                                        f"{argv[0]} was sent, so whether it ran is unknown: "
                                                        f"{exc or type(exc).__name__}") from None
                if attempt == self.retries:
                    raise BackendUnavailable(self.name, f"{self.host}:{self.port}: {exc or type(exc).__name__}") from None
                self._sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def stream(self, argv: Sequence[str], timeout: float = 24 * 3600.0, check: bool = True) -> Iterator[str]:
        import paramiko

        channel = None
        try:
            with self._lock:
                client = self._client_or_connect()
                transport = client.get_transport()
                assert transport is not None  # _client_or_connect gives a client whose transport is active
                channel = transport.open_session(timeout=self.connect_timeout)
            channel.settimeout(timeout)
            channel.exec_command(self.command_line(argv))
            channel.shutdown_write()
            err = bytearray()
            while True:
                if channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                data = channel.recv(65536)
                if not data:
                    break
                yield data.decode("utf-8", errors="replace")
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            code = channel.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise BackendUnavailable(self.name, f"{self.host}:{self.port}: {exc or type(exc).__name__}") from None
        finally:
            if channel is not None:  # a reader that stops early ends the remote command (sshd hangs it up)
                channel.close()
        if code != 0 and check:
            text = " ".join(err.decode("utf-8", errors="replace").split())[:300]
            raise BackendRejected(self.name, f"{argv[0]} exited {code}: {text}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _drain(channel: paramiko.Channel, timeout: float) -> tuple[bytes, bytes]:
    """Read stdout and stderr together until both end: reading one to its end first deadlocks when the
    other fills the channel's window (a command that writes a lot to stderr before any stdout)."""
    import select

    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while True:
        progressed = False
        while channel.recv_ready():
            out += channel.recv(65536)
            progressed = True
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(65536)
            progressed = True
        if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
            # the exit status can arrive before the last data: take what is still buffered
            if channel.eof_received:
                break
        if not progressed:
            if time.monotonic() > deadline:
                raise OSError(f"no answer within {timeout:g}s")
            select.select([channel], [], [], 0.05)
    return bytes(out), bytes(err)
