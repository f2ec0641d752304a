"""A real Slurm cluster for tests: slurmctld and several slurmd on this machine, state in a temp dir.

N ``slurmd -N nodeX`` on localhost (one machine, no network namespaces), each on its own port,
with 2 CPUs, 2000 MB and two (fake-device) GPUs per node. No accounting; finished jobs are in the
job-completion log. Everything is stopped by PID.

The release is this machine's (Debian 12's 22.05) or, given an ``install`` (tests/harness/slurm_versions.py),
another one: its daemons, its commands first on the cluster's PATH, and the configuration lines it needs.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

from tests.harness import slurm_versions
from tests.harness.slurm_versions import HOST_RELEASE, SlurmInstall

DAEMONS = ("slurmctld", "slurmd", "munged", "sinfo", "sbatch", "squeue", "scontrol", "scancel", "sacct")


def _free_port_block(count: int, start: int = 20000, end: int = 40000) -> int:
    """A base port such that base..base+count-1 are all free on loopback."""
    for base in range(start, end, count + 1):
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free port block for the Slurm test cluster")


def _wait_gone(pids: list[int], deadline: float) -> list[int]:
    """Wait until every process in *pids* has exited, or *deadline* (monotonic) passed; those still there."""
    left = list(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                left.remove(pid)
        if left:
            time.sleep(0.05)
    return left


def ensure_munge() -> None:
    """munged must run for any Slurm daemon; start it once (it is shared by every cluster on the machine)."""
    check = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
    if check.returncode == 0:
        return
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
    for _ in range(200):
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("munged did not come up")


def _untraversable(path: Path) -> Path | None:
    """The outermost folder above *path* that other users may not enter (root's home: /root), or None. A
    home folder counts even while it is open: a test may open it for a while (the tenant tests make /root o+x)
    and close it again under a running slurmrestd, which then can no longer load its plugins."""
    for folder in reversed(path.parents):
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    home = Path(os.path.expanduser("~"))
    return home if home != Path("/") and home in path.parents else None


# Another release's slurmrestd, as nobody, must read its files under root's cache (/root is root's alone): in a
# mount namespace of its own, a world-readable tmpfs covers the folder nobody may not enter, and the release's
# folder is bound back at its path. Nothing else of root's home is there for it.
REVEAL = """blocked=$1 home=$2; shift 2
keep=$(mktemp -d)
mount --bind "$home" "$keep"
mount -t tmpfs -o mode=0755 hpcbridge-slurmrestd "$blocked"
mkdir -p "$home"
mount --bind "$keep" "$home"
umount "$keep"; rmdir "$keep"
exec "$@"
"""


# the release's commands over /usr/local/bin, then the daemon ($1: the release's bin/, then its argv)
OVERLAY = """mount -t overlay hpcbridge-slurm -o "lowerdir=$1:/usr/local/bin" /usr/local/bin
shift
exec "$@"
"""


class SlurmCluster:
    def __init__(self, base: Path, nodes: int = 4, cpus: int = 2, memory_mb: int = 2000, gpus: int = 2,
                 min_job_age: int = 300, install: SlurmInstall | None = None) -> None:
        self.base = Path(base)
        #: another release's files; by default the one HPCBRIDGE_SLURM asks for (none: this machine's 22.05)
        self.install = install or slurm_versions.current()
        install = self.install
        #: the Slurm release this cluster runs ("22.05", "24.11"...)
        self.release = install.release if install else HOST_RELEASE
        self.nodes = nodes
        self.cpus, self.memory_mb, self.gpus, self.min_job_age = cpus, memory_mb, gpus, min_job_age
        self.conf = self.base / "etc" / "slurm.conf"
        self.pids: list[int] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if install is not None:
            self.env["PATH"] = f"{install.bin_dir}:{os.environ.get('PATH', '')}"
        self.rest_url: str | None = None
        self._rest: subprocess.Popen | None = None

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def tool(self, name: str) -> str:
        """The command *name* of this cluster's release (a path for another release, else the name)."""
        return self.install.command(name) if self.install else name

    def slurmd_argv(self, *extra: str) -> list[str]:
        # another release's slurmd must start its own slurmstepd, not the compiled-in /usr/sbin one (22.05's)
        stepd = ["-d", self.tool("slurmstepd")] if self.install else []
        return [self.tool("slurmd"), *stepd, *extra]

    def _own_commands(self, argv: list[str]) -> list[str]:
        """*argv* (a slurmd) in a mount namespace of its own where the release's commands are in
        /usr/local/bin, ahead of /usr/bin's 22.05 ones: a job finds them whatever its PATH (a tenant's job
        gets a fixed one) as long as /usr/local/bin comes first, as in every default PATH. Mounts made here
        later still reach it (slave propagation)."""
        if self.install is None:
            return argv
        return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-ec", OVERLAY, "overlay",
                str(self.install.bin_dir), *argv]

    def write_config(self) -> None:
        missing = [tool for tool in DAEMONS if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}")]
        if missing and self.install is None:
            raise RuntimeError(f"Slurm/munge not installed ({', '.join(missing)} missing): run scripts/setup.sh --all")
        ports = _free_port_block(self.nodes + 1)
        b = self.base
        for sub in ("etc", "state", "spool", "log", "run", "jobs"):
            (b / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""# hpc-bridge test cluster (tests/harness/slurm.py)
ClusterName=hpcbtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort={ports}
SlurmdPort={ports + 1}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={b}/log/jobcomp.txt
GresTypes=gpu
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge={self.min_job_age}
NodeName=node[1-{self.nodes}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[{ports + 1}-{ports + self.nodes}] \
CPUs={self.cpus} RealMemory={self.memory_mb} Gres=gpu:a100:{self.gpus} Feature=intel,ib State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=long Nodes=node[1-{min(2, self.nodes)}] MaxTime=INFINITE State=UP
Licenses=matlab:2
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={b}/etc/jwt_hs256.key
""")
        if self.install is not None:
            self._write_release_config()
        (b / "etc" / "jwt_hs256.key").write_bytes(os.urandom(32))
        (b / "etc" / "jwt_hs256.key").chmod(0o600)
        # slurmrestd runs as nobody and must read slurm.conf
        for path in (b, b / "etc"):
            path.chmod(0o755)
        # /dev/null and /dev/zero stand in for GPU devices: enough for Slurm to count and assign them
        devices = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random"][: self.gpus]
        (self.conf.parent / "gres.conf").write_text(
            "AutoDetect=off\n" + "".join(f"NodeName=node[1-{self.nodes}] Name=gpu Type=a100 File={d}\n" for d in devices))

    def _write_release_config(self) -> None:
        """What another release needs: its own plugins (the compiled-in directory holds 22.05's), and a
        cgroup.conf (from 23.x slurmd reads one at start even with proctrack/linuxproc and task/none)."""
        assert self.install is not None
        with open(self.conf, "a", encoding="utf-8") as conf:
            conf.write(f"PluginDir={self.install.plugin_dir}\n")
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=disabled\n")

    def start(self) -> None:
        ensure_munge()
        self.write_config()
        subprocess.run([self.tool("slurmctld")], env=self.env, check=True)
        for node in self.node_names:
            (self.base / "spool" / node).mkdir(exist_ok=True)
            subprocess.run(self._own_commands(self.slurmd_argv("-N", node)), env=self.env, check=True)
        self._collect_pids()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-t", "idle", "-o", "%D"], env=self.env, capture_output=True, text=True)
            if out.stdout.strip() == str(self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Slurm nodes not idle: {self.log_tail()}")

    def start_rest(self, address: str = "127.0.0.1") -> str:
        """slurmrestd with JWT auth on a port of *address* (loopback by default; the hosts' gateway for clients
        beyond this machine, such as pods), as nobody (it refuses root). 22.05's serves OpenAPI
        v0.0.38 only; another release's serves what its slurmctld plugin does (without slurmdbd, loading all
        plugins fails)."""
        port = _free_port_block(1, start=41000, end=50000)
        log = open(self.base / "log" / "slurmrestd.log", "wb")
        argv = ["runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={self.conf}", "SLURM_JWT=daemon",
                self.tool("slurmrestd"), "-s", "openapi/v0.0.38" if self.install is None else "openapi/slurmctld"]
        blocked = self.install and _untraversable(self.install.home)
        if blocked:
            argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", REVEAL, "reveal",
                    str(blocked), str(self.install.home), *argv]
        self._rest = subprocess.Popen([*argv, "-a", "rest_auth/jwt", f"{address}:{port}"],
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.rest_url = f"http://{address}:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex((address, port)) == 0:
                    return self.rest_url
            if self._rest.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"slurmrestd did not start: {(self.base / 'log' / 'slurmrestd.log').read_text()}")

    def token(self, user: str = "root", lifespan: int = 3600) -> str:
        out = self.run("scontrol", "token", f"username={user}", f"lifespan={lifespan}")
        if out.returncode != 0:
            raise RuntimeError(f"scontrol token failed: {out.stderr}")
        return out.stdout.strip().split("=", 1)[1]

    def _collect_pids(self) -> None:
        for _ in range(100):
            files = list((self.base / "run").glob("*.pid"))
            if len(files) == self.nodes + 1:
                break
            time.sleep(0.05)
        self.pids = [int(f.read_text().strip()) for f in (self.base / "run").glob("*.pid") if f.read_text().strip()]

    def stop_controller(self) -> None:
        """Stop slurmctld alone (an outage): slurmd and the jobs they run go on."""
        pid = int((self.base / "run" / "slurmctld.pid").read_text().strip())
        os.kill(pid, 15)
        _wait_gone([pid], time.monotonic() + 30)
        self.pids = [p for p in self.pids if p != pid]

    def start_controller(self) -> None:
        """slurmctld again, recovering its saved state (jobs included)."""
        pid_file = self.base / "run" / "slurmctld.pid"
        pid_file.unlink(missing_ok=True)
        subprocess.run([self.tool("slurmctld")], env=self.env, check=True)
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmctld did not start again: {self.log_tail()}")
            time.sleep(0.05)
        self.pids.append(int(pid_file.read_text().strip()))
        while self.run("scontrol", "ping").returncode != 0 or "UP" not in self.run("scontrol", "ping").stdout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmctld does not answer: {self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 20) -> str:
        log = self.base / "log" / "slurmctld.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"

    def stop(self) -> None:
        if self._rest is not None:
            self._rest.terminate()
            try:
                self._rest.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._rest.kill()
            self._rest = None
        if self.pids:
            # jobs first, so no slurmstepd or job process outlives the cluster
            self.run("scancel", "--full", "--user=root")
            time.sleep(0.5)
        for pid in self.pids:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
        for pid in _wait_gone(self.pids, time.monotonic() + 30):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.pids = []

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=60)


class NetnsSlurmCluster(SlurmCluster):
    """Variant b: slurmctld in the root namespace on the bridge address, one slurmd inside each emulated host,
    so a job really spans hosts (own hostname and IP; MPI goes over the veth network)."""

    def __init__(self, base: Path, hosts, install: SlurmInstall | None = None) -> None:
        super().__init__(base, nodes=len(hosts.hosts), gpus=0, install=install)
        self.hosts = hosts
        self._overlaid: list = []

    @property
    def node_names(self) -> list[str]:
        return [host.name for host in self.hosts.hosts]

    def write_config(self) -> None:
        super().write_config()
        text = self.conf.read_text()
        controller = socket.gethostname().split(".")[0]
        text = text.replace("ClusterName=hpcbtest", "ClusterName=hpcbnetns")
        text = text.replace("SlurmctldHost=localhost", f"SlurmctldHost={controller}({self.hosts.gateway})")
        text = text.replace("GresTypes=gpu\n", "")
        nodes = "".join(f"NodeName={h.name} NodeAddr={h.ip} CPUs={self.cpus} RealMemory={self.memory_mb} "
                        f"State=UNKNOWN\n" for h in self.hosts.hosts)
        lines = [line for line in text.splitlines()
                 if line.strip() and not line.startswith(("NodeName=", "PartitionName=", "CPUs="))]
        self.conf.write_text("\n".join(lines) + "\n" + nodes + "PartitionName=debug Nodes=ALL Default=YES "
                             "MaxTime=INFINITE State=UP\n")
        (self.conf.parent / "gres.conf").unlink(missing_ok=True)
        # srun --mpi=pmix needs a node-local temp dir; every host has its own /var/tmp
        (self.conf.parent / "mpi.conf").write_text("PMIxCliTmpDirBase=/var/tmp\n")

    def start(self) -> None:
        ensure_munge()
        self.write_config()
        if self.install is not None:
            self._overlay_commands()
        subprocess.run([self.tool("slurmctld")], env=self.env, check=True)
        for host in self.hosts.hosts:
            (self.base / "spool" / host.name).mkdir(exist_ok=True)
            self.hosts.exec_in_host(host, self.slurmd_argv(), env=self.env, check=True)
        self._collect_pids()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-t", "idle", "-o", "%D")
            if out.stdout.strip() == str(self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Slurm netns nodes not idle: {self.log_tail()}")

    def _overlay_commands(self) -> None:
        """Another release's commands in each host's /usr/local/bin (an overlay on top of what is there, in the
        host's own mount namespace): an SSH login's PATH is sshd's default, which no fixture can set, and
        /usr/local/bin comes before /usr/bin (22.05's) in it, as in sudo's secure_path."""
        assert self.install is not None
        for host in self.hosts.hosts:
            self.hosts.exec_in_host(host, ["mount", "-t", "overlay", "hpcbridge-slurm", "-o",
                                           f"lowerdir={self.install.bin_dir}:/usr/local/bin", "/usr/local/bin"],
                                    check=True)
            self._overlaid.append(host)

    def stop(self) -> None:
        super().stop()
        for host in self._overlaid:
            self.hosts.exec_in_host(host, ["umount", "/usr/local/bin"], check=False)
        self._overlaid = []

