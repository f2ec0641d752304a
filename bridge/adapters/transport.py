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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bridge.errors import BackendUnavailable, InvalidSpec


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Transport(ABC):
    name = "transport"

    @abstractmethod
    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> CommandResult:
        """Run *argv* (no shell) on the target host and return its status and output."""

    def close(self) -> None:  # noqa: B027 - optional hook: transports without connections keep this no-op
        """Release connections; the transport may be used again afterwards."""


class LocalTransport(Transport):
    """Commands on this machine, with extra environment (e.g. SLURM_CONF for a non-default cluster)."""

    name = "local"

    def __init__(self, env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> CommandResult:
        try:
            proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout,
                                  env=self.env, cwd=self.cwd, errors="replace")
        except FileNotFoundError:
            raise BackendUnavailable(self.name, f"{argv[0]}: command not found on this machine") from None
        except subprocess.TimeoutExpired:
            raise BackendUnavailable(self.name, f"{argv[0]} did not answer within {timeout:g}s") from None
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


class SSHTransport(Transport):
    """Commands on a login host over one reused paramiko connection."""

    name = "ssh"

    def __init__(self, host: str, port: int = 22, user: str | None = None, key_file: str | None = None,
                 known_hosts_file: str | None = None, env: Mapping[str, str] | None = None,
                 connect_timeout: float = 10.0, retries: int = 3, backoff: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not known_hosts_file:
            raise InvalidSpec("spec.slurm.knownHostsFile", None,
                              "the SSH transport needs a known_hosts file: host keys are never accepted unseen")
        self.host, self.port, self.user = host, port, user
        # config files say ~/.ssh/...; paramiko does not expand ~
        self.key_file = os.path.expanduser(key_file) if key_file else None
        self.known_hosts_file = os.path.expanduser(known_hosts_file)
        self.env = dict(env or {})
        self.connect_timeout, self.retries, self.backoff, self._sleep = connect_timeout, retries, backoff, sleep
        self._client = None
        self._lock = threading.Lock()
        self.connects = 0  # how many times a connection was opened (tests and benchmarks read it)

    def _connect(self):
        import paramiko  # only when an SSH cluster is used: keeps the CLI fast

        client = paramiko.SSHClient()
        client.load_host_keys(self.known_hosts_file)
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

    def _client_or_connect(self):
        if self._client is None or not self._client.get_transport() or not self._client.get_transport().is_active():
            self._client = self._connect()
        return self._client

    def command_line(self, argv: Sequence[str]) -> str:
        prefix = ["env", *(f"{k}={v}" for k, v in sorted(self.env.items()))] if self.env else []
        return shlex.join([*prefix, *argv])

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0) -> CommandResult:
        import paramiko

        line = self.command_line(argv)
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                with self._lock:
                    client = self._client_or_connect()
                    chan_in, chan_out, chan_err = client.exec_command(line, timeout=timeout)
                    if stdin is not None:
                        chan_in.write(stdin)
                    chan_in.channel.shutdown_write()
                    out = chan_out.read().decode("utf-8", errors="replace")
                    err = chan_err.read().decode("utf-8", errors="replace")
                    code = chan_out.channel.recv_exit_status()
                return CommandResult(tuple(argv), code, out, err)
            except BackendUnavailable:
                raise
            except (OSError, EOFError, paramiko.SSHException) as exc:
                self.close()
                if attempt == self.retries:
                    raise BackendUnavailable(self.name, f"{self.host}:{self.port}: {exc or type(exc).__name__}") from None
                self._sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
