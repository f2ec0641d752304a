"""N emulated hosts on this machine: network namespaces on a bridge, each with its own hostname and sshd.

Why: multi-host code (hostfiles, ssh launchers, Open MPI / MPICH across nodes, later one slurmd per node)
must be tested against hosts that really differ in hostname, IP and node-local scratch, with real sshd and
pinned host keys -- not against N processes on localhost.

Layout (defaults): bridge ``br-hpcb`` with 10.77.0.1/24 in the root namespace; host ``node-i`` is the netns
``br-hpcb-node-i`` at 10.77.0.(10+i), joined by the veth ``br-hpcb-vi`` (its ``eth0`` inside). Each host has
a long-lived holder process (``sleep infinity``, :attr:`Host.pid`) owning its net, UTS and mount namespaces:

- UTS: ``hostname`` is ``node-i``;
- mount (private): ``/etc/hosts`` is bind-mounted from :attr:`HostCluster.hosts_file` and ``/var/tmp`` from a
  per-host directory (node-local scratch); the real ``/etc`` is never written;
- ``/tmp`` (and /work, /root) stay shared by all hosts, like an NFS home.

One sshd per host listens on ``<ip>:22`` with its own host key; root logs in with a generated client key. Use
:attr:`HostCluster.ssh_wrapper` (``ssh -F <config>``) as the rsh agent of launchers. Note that sshd gives a
session its default PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin), which lacks the
venv (root's shell startup files may add pyenv shims, nothing more): commands run over ssh need absolute
paths (e.g. ``/work/main/.venv/bin/python``).

Everything started here is found again by name (netns ``<bridge>-*``, veths ``<bridge>-v*``), so a run that
was killed is cleaned up by the next :meth:`HostCluster.start`. A lock file (flock, released by the kernel
when its holder dies) keeps two test sessions from tearing down each other's cluster.

This module has no pytest dependency: it serves fixtures and benchmarks alike. Needs root, iproute2,
util-linux (nsenter, unshare, mount), hostname and openssh-server / openssh-client.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REQUIRED_TOOLS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "mount": "mount",
    "hostname": "hostname",
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}
SSHD_CONFIG = """\
ListenAddress {ip}:22
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys} {authorized_keys}.%u
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
X11Forwarding no
PrintMotd no
AcceptEnv LANG LC_* OMPI_* PMIX_* SLURM_*
MaxStartups 100:30:200
Subsystem sftp /usr/lib/openssh/sftp-server
"""
# The holder enters fresh UTS + mount namespaces (inside the host's netns), sets them up, then only waits.
# A ready file is written last, so nobody enters the namespaces before the bind mounts exist.
HOLDER_SCRIPT = (
    'set -e; hostname "$1"; mount --bind "$2" /etc/hosts; mount --bind "$3" /var/tmp; '
    ': > "$4"; exec sleep infinity'
)


class HarnessError(RuntimeError):
    """The emulated cluster cannot be brought up (missing tool, not root, address in use, sshd died...)."""


@dataclass
class Host:
    """One emulated host. ``pid`` holds its net+uts+mount namespaces for as long as the cluster is up."""

    name: str
    ip: str
    pid: int
    netns: str
    veth: str
    dir: Path
    sshd_pid: int = 0


def _run(argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a setup command; failures raise HarnessError carrying the command's stderr."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise HarnessError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _alive(pid: int) -> bool:
    """True while *pid* exists and is not a zombie (PID 1 here may never reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class HostCluster:
    """Brings up and tears down ``count`` emulated hosts; see the module docstring for the layout."""

    def __init__(self, count: int = 3, base_dir: Path | None = None, subnet: str = "10.77.0",
                 bridge: str = "br-hpcb", prefix: str = "node", ready_timeout: float = 30.0,
                 lock_timeout: float = 1800.0) -> None:
        if not 1 <= count <= 200:
            raise ValueError("count must be 1..200 (hosts are <subnet>.10 .. <subnet>.209)")
        if len(bridge) > 10:
            raise ValueError("bridge name must be at most 10 characters (veth names <bridge>-vN must fit 15)")
        self.count = count
        self.subnet = subnet
        self.network = ipaddress.ip_network(f"{subnet}.0/24")
        self.gateway = f"{subnet}.1"
        self.bridge = bridge
        self.prefix = prefix
        self.ready_timeout = ready_timeout
        self.lock_timeout = lock_timeout
        self._own_base = base_dir is None
        self.base_dir = Path(base_dir) if base_dir is not None else Path(tempfile.mkdtemp(prefix="hpcb-netns-"))
        ssh_dir = self.base_dir / "ssh"
        self.ssh_config = ssh_dir / "config"
        self.ssh_wrapper = ssh_dir / "ssh"
        self.known_hosts = ssh_dir / "known_hosts"
        self.client_key = ssh_dir / "id_ed25519"
        self.authorized_keys = ssh_dir / "authorized_keys"
        self.hosts_file = self.base_dir / "hosts"
        self.hosts: list[Host] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._sshd: dict[str, subprocess.Popen[Any]] = {}
        self._lock_fd: int | None = None
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> HostCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Clean up leftovers of an earlier (killed) run, then bring up every host and wait for its sshd."""
        t0 = time.monotonic()
        if self.hosts:
            self.stop()
        try:
            self._check_prerequisites()
            self._acquire_lock()
            self._teardown_by_name()
            self._check_subnet_free()
            self._write_files()
            self._create_network()
            for host in self.hosts:
                self._start_holder(host)
            for host in self.hosts:
                self._wait_holder(host)
                self.start_sshd(host, wait=False)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0

    def stop(self) -> None:
        """Kill everything started in the hosts (by PID), delete veths, namespaces and the bridge. Idempotent.

        Without the lock (start() never got that far) nothing here is ours, so nothing is torn down.
        """
        t0 = time.monotonic()
        try:
            if self._lock_fd is not None:
                self._teardown_by_name()
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
        finally:
            self._procs.clear()
            self._sshd.clear()
            self.hosts = []
            self._release_lock()
            if self._own_base:
                shutil.rmtree(self.base_dir, ignore_errors=True)
        self.timings["stop"] = time.monotonic() - t0

    # ------------------------------------------------------------------ running things in a host

    def nsenter_argv(self, host: Host, argv: list[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """The argv that runs *argv* in *host*'s net+uts+mount namespaces (cwd given explicitly: entering a
        mount namespace resets the working directory to /)."""
        wd = [f"--wd={os.fspath(cwd)}"] if cwd is not None else []
        return ["nsenter", "-t", str(host.pid), "-n", "-u", "-m", *wd, "--", *argv]

    def run_in_host(self, host: Host, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start *argv* inside *host* (e.g. slurmd, a launcher); it is killed by :meth:`stop` at the latest."""
        cwd = popen_kwargs.pop("cwd", None)
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self.nsenter_argv(host, argv, cwd), **popen_kwargs)
        self._procs.append(proc)
        return proc

    def exec_in_host(self, host: Host, argv: list[str], timeout: float = 120,
                     **run_kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run *argv* inside *host* and wait (captured text output by default)."""
        cwd = run_kwargs.pop("cwd", None)
        run_kwargs.setdefault("capture_output", True)
        run_kwargs.setdefault("text", True)
        run_kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.nsenter_argv(host, argv, cwd), timeout=timeout, **run_kwargs)

    def ssh(self, target: Host | str, command: str, timeout: float = 60,
            options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        """``ssh <target> <command>`` from the root namespace with the generated config (+ ``-o`` *options*)."""
        name = target.name if isinstance(target, Host) else target
        opts = [arg for option in options for arg in ("-o", option)]
        return subprocess.run([str(self.ssh_wrapper), *opts, name, command], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def host(self, name: str) -> Host:
        """The host called *name*."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    # ------------------------------------------------------------------ sshd control (failure tests)

    def start_sshd(self, host: Host, wait: bool = True) -> None:
        """Start (or resume a frozen) sshd of *host*; with *wait*, until it accepts a login."""
        proc = self._sshd.get(host.name)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        else:
            with open(host.dir / "sshd.log", "ab") as log:  # the child keeps its own copy of the fd
                proc = self.run_in_host(host, ["/usr/sbin/sshd", "-D", "-e", "-f", str(host.dir / "sshd_config")],
                                        stdout=log, stderr=subprocess.STDOUT)
            self._sshd[host.name] = proc
            host.sshd_pid = proc.pid  # nsenter execs sshd: same pid
        if wait:
            self.wait_ready([host])

    def stop_sshd(self, host: Host, freeze: bool = False) -> None:
        """Make *host* unreachable over ssh while its namespaces stay up.

        ``freeze=False`` kills sshd: connections are refused at once. ``freeze=True`` SIGSTOPs it: the kernel
        still accepts TCP connections but no banner ever comes, like a hung node; clients wait for their
        ConnectTimeout. :meth:`start_sshd` undoes either.
        """
        proc = self._sshd.get(host.name)
        if proc is None or proc.poll() is not None:
            return
        if freeze:
            os.kill(proc.pid, signal.SIGSTOP)
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        del self._sshd[host.name]

    def wait_ready(self, hosts: list[Host] | None = None) -> None:
        """Wait until every sshd accepts a real login (``ssh host true``), up to ``ready_timeout`` seconds."""
        pending = list(hosts if hosts is not None else self.hosts)
        deadline = time.monotonic() + self.ready_timeout
        errors: dict[str, str] = {}
        while pending:
            for host in pending:
                proc = self._sshd.get(host.name)
                if proc is None or proc.poll() is not None:
                    raise HarnessError(f"sshd of {host.name} is not running; log:\n{_tail(host.dir / 'sshd.log')}")
            attempts = [(host, subprocess.Popen([str(self.ssh_wrapper), "-o", "ConnectTimeout=5", host.name, "true"],
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.PIPE, text=True)) for host in pending]
            still: list[Host] = []
            for host, attempt in attempts:
                try:
                    _, err = attempt.communicate(timeout=max(1.0, deadline - time.monotonic()) + 10)
                except subprocess.TimeoutExpired:
                    attempt.kill()
                    _, err = attempt.communicate()
                if attempt.returncode != 0:
                    errors[host.name] = err.strip()
                    still.append(host)
            pending = still
            if pending and time.monotonic() > deadline:
                detail = "; ".join(f"{h.name}: {errors.get(h.name)}" for h in pending)
                raise HarnessError(f"sshd not ready after {self.ready_timeout:.0f} s: {detail}")
            if pending:
                time.sleep(0.2)

    # ------------------------------------------------------------------ internals

    def _check_prerequisites(self) -> None:
        if os.geteuid() != 0:
            raise HarnessError("the netns host harness needs root (network namespaces, bridge, sshd on port 22)")
        search = f"{os.environ.get('PATH', '')}:{SBIN_PATH}"
        missing = [f"{tool} (package {pkg})" for tool, pkg in REQUIRED_TOOLS.items()
                   if shutil.which(tool, path=search) is None]
        if missing:
            raise HarnessError("missing tools for the netns host harness: " + ", ".join(missing)
                               + "; the project's setup must install them")

    def _acquire_lock(self) -> None:
        """Hold /tmp/.hpcb-netns-<bridge>.lock while the cluster is up; wait for another session to finish."""
        if self._lock_fd is not None:
            return
        fd = os.open(f"/tmp/.hpcb-netns-{self.bridge}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise HarnessError(f"bridge {self.bridge} still held by another session after "
                                       f"{self.lock_timeout:.0f} s") from None
                time.sleep(0.5)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _netns_names(self) -> list[str]:
        try:
            names = os.listdir("/run/netns")
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.startswith(f"{self.bridge}-"))

    def _links(self) -> list[dict[str, Any]]:
        return json.loads(_run(["ip", "-j", "addr", "show"]).stdout or "[]")

    def _teardown_by_name(self) -> None:
        """Kill every process in our namespaces (ours, by ``ip netns pids``), then delete veths, netns, bridge."""
        names = self._netns_names()
        pids = {p.pid for p in self._procs if p.poll() is None}
        for name in names:
            pids.update(int(p) for p in _run(["ip", "netns", "pids", name], check=False).stdout.split())
        pids.discard(os.getpid())
        for sig in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a frozen sshd must see its SIGTERM
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for proc in self._procs:
                proc.poll()  # reap our children so they stop counting as alive
            if not any(_alive(pid) for pid in pids):
                break
            time.sleep(0.05)
        for pid in pids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for link in self._links():
            if link.get("ifname", "").startswith(f"{self.bridge}-v"):
                _run(["ip", "link", "del", link["ifname"]], check=False)
        for name in names:
            _run(["ip", "netns", "del", name], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)

    def _check_subnet_free(self) -> None:
        for link in self._links():
            for addr in link.get("addr_info", []):
                if addr.get("family") == "inet" and ipaddress.ip_address(addr["local"]) in self.network:
                    raise HarnessError(f"{self.network} is already used by {link['ifname']} ({addr['local']}); "
                                       "pass another subnet= to HostCluster")

    def _write_files(self) -> None:
        """Keys, known_hosts, authorized_keys, ssh config + wrapper, /etc/hosts and sshd_config per host."""
        ssh_dir = self.ssh_config.parent
        ssh_dir.mkdir(parents=True, exist_ok=True)
        self.hosts = []
        for i in range(self.count):
            name = f"{self.prefix}-{i}"
            host = Host(name=name, ip=f"{self.subnet}.{10 + i}", pid=0, netns=f"{self.bridge}-{name}",
                        veth=f"{self.bridge}-v{i}", dir=self.base_dir / name)
            (host.dir / "vartmp").mkdir(parents=True, exist_ok=True)
            (host.dir / "vartmp").chmod(0o1777)
            for stale in ("ready", "sshd.pid"):
                (host.dir / stale).unlink(missing_ok=True)
            self.hosts.append(host)
        keys = [(self.client_key, "hpcb-client")] + [(h.dir / "ssh_host_ed25519_key", h.name) for h in self.hosts]
        for path, comment in keys:
            if not path.exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
        self.authorized_keys.write_text(Path(f"{self.client_key}.pub").read_text())
        known = []
        for host in self.hosts:
            key_type, key = Path(f"{host.dir}/ssh_host_ed25519_key.pub").read_text().split()[:2]
            known.append(f"{host.name},{host.ip} {key_type} {key}\n")
        self.known_hosts.write_text("".join(known))
        self.hosts_file.write_text(
            f"127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{self.gateway} gateway\n"
            + "".join(f"{h.ip} {h.name}\n" for h in self.hosts))
        config = "".join(f"Host {h.name}\n  HostName {h.ip}\n" for h in self.hosts)
        config += (f"Host *\n  User root\n  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
                   "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 10\n")
        self.ssh_config.write_text(config)
        self.ssh_wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {self.ssh_config} "$@"\n')
        self.ssh_wrapper.chmod(0o755)
        for host in self.hosts:
            (host.dir / "sshd_config").write_text(SSHD_CONFIG.format(
                ip=host.ip, host_key=host.dir / "ssh_host_ed25519_key", pid_file=host.dir / "sshd.pid",
                authorized_keys=self.authorized_keys))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir

    def _create_network(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for host in self.hosts:
            _run(["ip", "netns", "add", host.netns])
            _run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns])
            _run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
            _run(["ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0"])
            _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
            _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])

    def _start_holder(self, host: Host) -> None:
        """nsenter --net (not `ip netns exec`: it remounts /sys, hiding /sys/fs/cgroup from slurmd later)."""
        argv = ["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--uts", "--mount", "--propagation",
                "private", "sh", "-c", HOLDER_SCRIPT, "holder", host.name, str(self.hosts_file),
                str(host.dir / "vartmp"), str(host.dir / "ready")]
        with open(host.dir / "holder.log", "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._procs.append(proc)
        host.pid = proc.pid  # nsenter, unshare and sh all exec: this becomes `sleep infinity`

    def _wait_holder(self, host: Host) -> None:
        deadline = time.monotonic() + self.ready_timeout
        proc = next(p for p in self._procs if p.pid == host.pid)
        while not (host.dir / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HarnessError(f"namespaces of {host.name} not set up; log:\n{_tail(host.dir / 'holder.log')}")
            time.sleep(0.02)
        if os.readlink(f"/proc/{host.pid}/ns/uts") == os.readlink("/proc/self/ns/uts"):
            raise HarnessError(f"holder of {host.name} did not get its own UTS namespace")
        if socket.gethostname() == host.name:
            raise HarnessError(f"the root namespace's hostname became {host.name}")
