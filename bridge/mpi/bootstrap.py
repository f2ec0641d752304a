"""``hpcbridge launch``: the one command every node of an allocation runs.

It discovers the peers, writes the hostfile, builds the launcher's command line and runs it, forwarding
SIGTERM/SIGINT so a cancel stops every rank, and exits with the launcher's code. ``LaunchSpec``
(bridge.mpi.spec) is the contract between the renderers (which write its arguments into batch scripts) and
this command.

Between hosts without a scheduler the peers serve a per-job sshd; rank 0 starts the launcher at once (its own
start-up overlaps the peers'), holds the launcher's ssh at a gate until every peer's sshd answers, and at the
end releases the peers (bridge.mpi.peers). Every node's files live in a fresh private directory (mkdtemp, mode 0700).
Start-up time is spent on every node of every job: modules load where they are needed (hashlib for the
release token, socket for the probes), after the peers' sshd or rank 0's launcher is already running, and
children start with os.posix_spawn (bridge.mpi.spawn), not subprocess.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bridge.envnames import TAG_OUTPUT_ENV, TF_ROLES_ENV, XGBOOST_TRACKER_ENV, XGBOOST_TRACKERS
from bridge.errors import InvalidSpec
from bridge.mpi import discovery, launchers, rendezvous, ssh
from bridge.mpi.exits import FORWARDED, shell_code
from bridge.mpi.hostfile import Peer, hostfile_for
from bridge.mpi.peers import release_peers, release_token, serve_peer
from bridge.mpi.spec import MPI, LaunchSpec
from bridge.mpi.timing import trace

#: True for the type checker only (which reads any TYPE_CHECKING so): importing typing would add to the
#: start-up of every node of every job
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

    from bridge.mpi.group import LineRelay
    from bridge.mpi.spawn import Process


def launch_argv(spec: LaunchSpec, topology: discovery.Topology, workdir: str,
                ssh_settings: launchers.SSHSettings | None = None, tag_output: bool = False) -> list[str] | None:
    """What this node runs, or None when this node has nothing to start (MPI ranks other than 0); with
    *tag_output* an MPI launcher tags what each rank writes (run_tagged reads the tags)."""
    if spec.launcher in MPI:
        if topology.rank != 0:
            return None
        peers, own = topology.peers, topology.hosts[0]
        nodename = os.uname().nodename
        localhost = None
        if own != nodename and own.split(".")[0] == nodename.split(".")[0]:
            # the launcher's own line names it as the kernel does: it tells itself from the others by name
            # (Hydra) and without a DNS lookup; the others reach it by the full name it was given (a JobSet pod's
            # short name resolves nowhere but in its own /etc/hosts)
            peers = [Peer(nodename, peers[0].slots), *peers[1:]]
            localhost = own
        path = os.path.join(workdir, "hostfile")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(hostfile_for(spec.launcher, peers))
        if spec.launcher == "openmpi":
            return launchers.openmpi_argv(topology, path, spec.command, spec.forward_env, ssh=ssh_settings,
                                          tag_output=tag_output)
        return launchers.hydra_argv(topology, path, spec.command, spec.forward_env, ssh=ssh_settings,
                                    mpiexec="mpiexec" if spec.launcher == "intel" else None, localhost=localhost,
                                    tag_output=tag_output)
    if spec.launcher == "torchrun":
        if launchers.calls_torchrun(spec.command):
            return list(spec.command)  # Kubeflow style: the command runs torchrun, which reads PET_* (child_env)
        command = list(spec.command)
        if tag_output and chunks_workers(spec):
            from bridge.mpi import rankchunks

            command = rankchunks.wrap(command)
        return launchers.torchrun_argv(topology, command, spec.rdzv_port, spec.job_id)
    if spec.launcher == "flux":
        if topology.rank != 0:
            return None
        if spec.discovery == "slurm":
            # a Flux-policy job on Slurm: srun is the PMI launcher there, as flux run is under Flux
            return launchers.srun_argv(topology, spec.command, mpi="pmix")
        return launchers.flux_run_argv(topology, spec.command, spec.gpus_per_node)
    return list(spec.command)


def child_env(spec: LaunchSpec, base: Mapping[str, str], topology: discovery.Topology) -> dict[str, str]:
    env = dict(base)
    env.update(spec.extra_env)
    if spec.launcher == "torchrun" and launchers.calls_torchrun(spec.command):
        env.update(launchers.torch_env(topology, spec.rdzv_port))
    if spec.framework == "jax":
        env.update(launchers.jax_env(topology, spec.rdzv_port, launchers.node_gpus(env)))
    roles = env.get(TF_ROLES_ENV)
    if roles:
        env["TF_CONFIG"] = launchers.tf_config(roles, topology, int(env.get(launchers.TF_PORT_ENV) or
                                                                     launchers.TF_DEFAULT_PORT))
    if spec.launcher == "openmpi" and os.geteuid() == 0:
        # Open MPI refuses root without both variables; containers and CI commonly run as root.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if spec.discovery == "local" and spec.launcher == "openmpi":
        # all "nodes" share this machine: let ranks exceed the core count and don't pin them
        env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
        env.setdefault("OMPI_MCA_hwloc_base_binding_policy", "none")
    return env


class Child:
    """The launcher, in its own process group; SIGTERM/SIGINT/SIGHUP to us are forwarded to that group.

    The handlers are installed on entering, before the child starts: a signal that arrives while it starts is
    held and delivered to it as soon as it exists, instead of killing us and orphaning it.
    """

    def __init__(self) -> None:
        self.proc: Process | None = None
        self.pending: list[int] = []
        self.previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def __enter__(self) -> Child:
        self.previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _forward(self, signum: int, _frame: object) -> None:
        if self.proc is None:
            self.pending.append(signum)
            return
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def start(self, argv: Sequence[str], env: Mapping[str, str],
              outputs: tuple[int, int] | None = None) -> int | None:
        """Start *argv* (its stdout and stderr on *outputs* when given); None, or the shell's code when it
        cannot start (127 not found, 126 not executable)."""
        from bridge.mpi.spawn import Process

        try:
            self.proc = Process(argv, env, new_session=True, outputs=outputs)
        except FileNotFoundError:
            print(f"hpcbridge launch: {argv[0]}: command not found", file=sys.stderr)
            return 127
        except PermissionError:
            print(f"hpcbridge launch: {argv[0]}: permission denied", file=sys.stderr)
            return 126
        for signum in self.pending:
            self._forward(signum, None)
        return None

    def exited(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def wait(self, meeting: rendezvous.Meeting | None = None) -> int:
        """The child's exit as a shell reports it (128+N when signal N ended it); with a *meeting* point that
        never answers, 1 once the child is stopped (bridge.mpi.rendezvous)."""
        assert self.proc is not None  # start() started it
        unmet = rendezvous.exit_if_unmet(meeting, self.exited, self.stop)
        return unmet if unmet is not None else shell_code(self.proc.wait())

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM its group, SIGKILL after *grace* seconds."""
        self._forward(signal.SIGTERM, None)
        assert self.proc is not None  # start() started it
        try:
            self.proc.wait(grace)
        except TimeoutError:
            self._forward(signal.SIGKILL, None)
            self.proc.wait()


def run_child(argv: Sequence[str], env: Mapping[str, str], meeting: rendezvous.Meeting | None = None) -> int:
    """Run *argv* in its own process group, forward SIGTERM/SIGINT/SIGHUP to it, return a shell-style code."""
    with Child() as child:
        failed = child.start(argv, env)
        return failed if failed is not None else child.wait(meeting)


def chunks_workers(spec: LaunchSpec) -> bool:
    """Whether torchrun's workers on this node write through bridge.mpi.rankchunks: they share torchrun's pipe
    where there are several (wrapped by the launch's torchrun, or by the shim a command that runs torchrun itself
    finds first on its PATH)."""
    return spec.launcher == "torchrun" and spec.procs_per_node > 1


def with_torchrun_shim(spec: LaunchSpec, env: dict[str, str], workdir: str) -> dict[str, str]:
    """*env* with bridge.mpi.rankchunks' torchrun first on PATH, for a command that runs torchrun itself and
    whose workers' lines are tagged."""
    if chunks_workers(spec) and launchers.calls_torchrun(spec.command):
        from bridge.mpi import rankchunks

        shims = rankchunks.write_torchrun_shim(workdir, sys.executable)
        env["PATH"] = shims + os.pathsep + env.get("PATH", os.defpath)
    return env


def writers(spec: LaunchSpec, topology: discovery.Topology) -> int:
    """How many processes of the job write output: a tag tells them apart only where there are several."""
    per_node = spec.launcher in MPI or spec.framework or chunks_workers(spec)
    return len(topology.hosts) * (spec.procs_per_node if per_node else 1)


def tags_output(spec: LaunchSpec, topology: discovery.Topology, env: Mapping[str, str]) -> bool:
    """Whether this launch tags its lines with their node and rank: where the local cluster asks for it
    (TAG_OUTPUT_ENV), for a job with several writers, and not for a batch script (its steps label their own
    lines, ``srun -l``)."""
    return env.get(TAG_OUTPUT_ENV) == "1" and spec.launcher != "script" and writers(spec, topology) > 1


def node_label(node: int) -> bytes:
    return f"[node-{node}] ".encode()


def rank_label(rank: int, per_node: int) -> bytes:
    """The tag of a rank's lines: its node (the launchers fill each node's slots in rank order) and rank."""
    return f"[node-{rank // per_node} rank-{rank}] ".encode()


def run_relayed(argv: Sequence[str], env: Mapping[str, str], relay: LineRelay, outputs: tuple[int, int],
                meeting: rendezvous.Meeting | None = None) -> int:
    """run_child with the child's output through *relay* (its pipes are *outputs*): every line out whole."""
    with Child() as child:
        try:
            failed = child.start(argv, env, outputs)
        finally:
            relay.started()
        code = failed if failed is not None else child.wait(meeting)
    relay.finish()
    return code


def run_tagged(spec: LaunchSpec, topology: discovery.Topology, argv: Sequence[str], env: Mapping[str, str],
               meeting: rendezvous.Meeting | None = None) -> int:
    """This node's launch with each line tagged: an MPI launcher's ranks by the tags it writes (it tags chunks,
    not lines: RankLines joins each rank's chunks into whole lines), torchrun's workers by the chunks
    bridge.mpi.rankchunks tags for them, any other command by this node."""
    from bridge.mpi.group import HYDRA_TAG, OPENMPI_TAG, LineRelay, RankLines

    relay = LineRelay(node_label(topology.rank))
    if spec.launcher in MPI or chunks_workers(spec):
        from bridge.mpi.rankchunks import CHUNK_TAG

        tag = CHUNK_TAG if spec.launcher == "torchrun" else OPENMPI_TAG if spec.launcher == "openmpi" else HYDRA_TAG
        own = node_label(topology.rank) if spec.launcher == "torchrun" else b""  # torchrun's own lines
        outputs = relay.pipe(split=lambda: RankLines(tag, lambda rank: rank_label(rank, spec.procs_per_node), own))
    else:
        outputs = relay.pipe()
    return run_relayed(argv, env, relay, outputs, meeting)


def private_workdir(job_id: str) -> str:
    """A fresh directory for this node's files that only this user can enter, made as mkdtemp makes one: in
    one mkdir, mode 0700, under a random name (so nobody else can pre-create, plant or read anything in it).
    In $TMPDIR or /tmp; tempfile itself (a few ms to import) only where neither will do."""
    prefix = f"hpcbridge-{(job_id[:8] or 'job').replace(os.sep, '_')}-"
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(100):
        path = os.path.join(base, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
        except OSError:
            break
    import tempfile

    return tempfile.mkdtemp(prefix=prefix)


def remove_workdir(workdir: str) -> None:
    try:  # the directory is flat (configs, known_hosts, hostfile, logs, the gate): no shutil needed
        for name in os.listdir(workdir):
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)
    except OSError:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


def _open_gate(gate: Path, fd: int, go: Path | None) -> None:
    """Let the launcher's ssh wrappers go on: to connect when *go* is given, else to give up (exit 255)."""
    if go is not None:
        go.touch()
    try:
        gate.unlink()  # first: a wrapper that comes later must not wait on a gate nobody holds
    finally:
        os.close(fd)


def lead(spec: LaunchSpec, topology: discovery.Topology, keys: Path, workdir: str) -> int:
    """MPI rank 0 between hosts: start the launcher at once; its ssh waits until every peer's sshd answers."""
    own = topology.hosts[topology.rank]
    peers = [host for host in dict.fromkeys(topology.hosts) if host != own]
    work = Path(workdir)
    gate, go = work / "gate", work / "go"
    files = ssh.write_client_files(keys, topology.hosts, work, spec.ssh_port, gate=gate, go=go)
    os.mkfifo(gate, 0o600)
    gate_fd = os.open(gate, os.O_RDWR)  # held: the wrappers' reads end when it closes
    settings = launchers.SSHSettings(str(files.config), str(files.wrapper))
    argv = launch_argv(spec, topology, workdir, settings)
    assert argv is not None
    env = child_env(spec, os.environ, topology)
    if spec.launcher == "openmpi":
        env.update(launchers.openmpi_ssh_env(settings, env.get("PATH")))
    answered = False
    tokens: dict[str, bytes] = {}
    try:
        if "." in own:  # a DNS name (a JobSet pod's): it must resolve before the launcher reads the hostfile
            try:
                ssh.wait_resolvable(own, spec.wait_timeout)
            except BaseException:
                _open_gate(gate, gate_fd, None)
                raise
        with Child() as child:
            failed = child.start(argv, env)
            if failed is not None:
                _open_gate(gate, gate_fd, None)
                return failed
            trace("launcher started; waiting for peers")
            try:
                answered = ssh.wait_for_peers(peers, spec.ssh_port, spec.wait_timeout, stop=child.exited)
            except BaseException:  # the deadline passed (BackendRejected names the peers), or worse
                child.stop()  # its ssh never got past the gate: nothing runs on any peer
                raise
            finally:
                _open_gate(gate, gate_fd, go if answered else None)
            trace("peers answer" if answered else "the launcher ended before every peer answered")
            # while the launcher runs: the release costs nothing at the end
            tokens = {host: release_token(keys, spec.job_id, host) for host in peers}
            code = child.wait()
            trace(f"launcher exited with {code}")
            return code
    finally:
        # also when a peer never came up: the ones that did must not serve forever
        if not tokens:
            tokens = {host: release_token(keys, spec.job_id, host) for host in peers}
        release_peers(spec, tokens, files)
        trace("released")


def run_script(spec: LaunchSpec, topology: discovery.Topology, workdir: str) -> int:
    """A batch script, as sbatch runs one: once, on the first node, with Slurm's job environment and ``srun`` /
    ``scontrol`` shims first on PATH (bridge.mpi.step); between pods the other nodes serve the job's sshd for
    its steps, as MPI peers do."""
    from bridge.mpi import step

    if spec.discovery == "flux":
        transport = "flux"
    elif len(topology.hosts) == 1 or spec.discovery == "local":
        transport = "local"
    elif spec.ssh_dir:
        transport = "ssh"
    else:
        raise InvalidSpec("--ssh-dir", None, f"a batch script on {len(topology.hosts)} hosts needs the job's ssh "
                                             "keys: its steps reach the other nodes over ssh")
    keys = None
    if transport == "ssh":
        assert spec.ssh_dir  # what made the transport ssh
        keys = ssh.private_keys(ssh.load_job_keys(spec.ssh_dir), Path(workdir))
        if topology.rank != 0:
            return serve_peer(spec, topology, keys, workdir)
    elif topology.rank != 0:
        return 0  # the script runs once; this node's tasks start with each step
    env = child_env(spec, os.environ, topology)
    env.update(step.batch_env(spec.job_id, topology.hosts, spec.procs_per_node, env))
    env["PATH"] = step.write_shims(workdir, sys.executable) + os.pathsep + env.get("PATH", os.defpath)
    env.update({step.TRANSPORT_ENV: transport, step.HOSTS_ENV: ",".join(topology.hosts), step.STATE_ENV: workdir,
                step.PYTHON_ENV: sys.executable})
    if keys is None:
        return run_child(list(spec.command), env)
    files = ssh.write_client_files(keys, topology.hosts, Path(workdir), spec.ssh_port)
    env[step.SSH_CONFIG_ENV] = str(files.config)
    peers = [host for host in dict.fromkeys(topology.hosts[1:]) if host != topology.hosts[0]]
    try:
        ssh.wait_for_peers(peers, spec.ssh_port, spec.wait_timeout)
        trace("peers answer; starting the script")
        return run_child(list(spec.command), env)
    finally:
        release_peers(spec, {host: release_token(keys, spec.job_id, host) for host in peers}, files)


def report_gpus(topology: discovery.Topology, gpus: Sequence[str]) -> None:
    """One line per node, once: which GPUs this node's processes got (where a job's devices went, in its log)."""
    if gpus:
        print(f"hpcbridge launch: node {topology.rank} ({topology.hosts[topology.rank]}): GPUs {','.join(gpus)}",
              file=sys.stderr, flush=True)


class _Worker:
    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.code: int | None = None


def run_xgboost(spec: LaunchSpec, topology: discovery.Topology, env: Mapping[str, str]) -> int:
    """XGBoost on one node: its G workers (G = processes per node: one per GPU), each with the DMLC_* variables
    of task ``node*G+local`` and, with G or more GPUs, its own share of them (XGBoost's ``device="cuda"`` is
    device 0 of what a process sees; two workers on one GPU fail in NCCL). Kubeflow starts one process per
    pod yet counts G workers per pod, so its tracker waits forever; here every counted worker starts.

    The first worker that fails ends the others, and the node's exit code is that worker's: the backend then
    ends the other nodes (srun --kill-on-bad-exit, the local cluster, the JobSet's failure policy), so no
    worker is left waiting on a tracker. With HPCBRIDGE_XGBOOST_TRACKER=launch node 0 runs the tracker itself
    (the workers then need no tracker code); by default task 0's script runs it, as on Kubeflow."""
    from bridge.mpi.spawn import Process

    mode = env.get(XGBOOST_TRACKER_ENV) or "script"
    if mode not in XGBOOST_TRACKERS:
        raise InvalidSpec(XGBOOST_TRACKER_ENV, mode, f"use one of {', '.join(XGBOOST_TRACKERS)}")
    gpus = launchers.node_gpus(env)
    shares = launchers.worker_gpus(gpus, spec.procs_per_node)
    from bridge.mpi.group import LineRelay, wait_all

    members: list[_Worker] = []
    tracker = None
    # one untagged worker writes straight to our output; several go through a relay, each line whole
    tagged = tags_output(spec, topology, env)
    relay = LineRelay() if spec.procs_per_node > 1 or tagged else None
    try:
        if mode == "launch" and topology.rank == 0:
            argv = launchers.xgboost_tracker_argv(spec.command, len(topology.hosts) * spec.procs_per_node,
                                                  spec.rdzv_port)
            tracker = _Worker(Process(argv, env, new_session=True))
        # on the local cluster the workers that would only retry until the tracker listens wait for it here,
        # silently: XGBoost logs each refused connection (task 0's script starts the tracker in script mode)
        waits_from = 1 if mode == "script" and topology.rank == 0 else 0
        for local in range(spec.procs_per_node):
            if local == waits_from and spec.discovery == "local":
                owner = tracker or (members[0] if members else None)
                wait_for_tracker(spec.rdzv_port, spec.wait_timeout, owner.proc if owner else None)
            worker_env = {**env, **launchers.xgboost_env(topology, spec.rdzv_port, local)}
            share = shares[local]
            if share is not None:
                worker_env["CUDA_VISIBLE_DEVICES"] = share
            label = rank_label(topology.rank * spec.procs_per_node + local, spec.procs_per_node) if tagged else b""
            members.append(_Worker(Process(list(spec.command), worker_env, new_session=True,
                                           outputs=relay.pipe(label) if relay else None)))
    except FileNotFoundError as exc:
        print(f"hpcbridge launch: {exc.filename or spec.command[0]}: command not found", file=sys.stderr)
        for member in [*members, *([tracker] if tracker else [])]:
            os.killpg(member.proc.pid, signal.SIGKILL)
            member.proc.wait()
        return 127
    finally:
        if relay is not None:
            relay.started()
    # the tracker is one of them: a tracker that fails ends the workers, and node 0 ends when it does (once
    # every node's workers have shut down; those of the other nodes may still be training)
    code = wait_all([*([tracker] if tracker else []), *members], kill_on_bad_exit=True)
    if relay is not None:
        relay.finish()
    return code


def exited(proc: Process) -> bool:
    """Whether *proc* has ended, without reaping it (wait_all reaps the group's members)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def listening(port: int) -> bool:
    """Whether a socket of this machine listens on TCP *port*, from the kernel's tables: a probe connection
    would reach XGBoost's tracker as a worker that failed its handshake, and the tracker logs each one."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl, local address (hex ip:port), remote address, state (0A: LISTEN), ...
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                return True
    return False


def wait_for_tracker(port: int, timeout: float, owner: Process | None) -> None:
    """Until this machine listens on *port*, the tracker's process (*owner*, on node 0) ended, or *timeout*
    seconds passed (the workers then retry as they would have)."""
    import time

    deadline = time.monotonic() + timeout
    while not listening(port) and not (owner and exited(owner)) and time.monotonic() < deadline:
        time.sleep(0.02)


#: how many ports above the plan's a shared-node job's coordinator may move (job_port)
PORT_SPREAD = 1000


def job_port(spec: LaunchSpec, env: Mapping[str, str]) -> int:
    """The coordinator's port (torch master, JAX coordinator, XGBoost tracker) for this job. Slurm and Flux put
    several jobs on one node, where a fixed port would clash with a running job, or with one that just ended
    (XGBoost's tracker binds without SO_REUSEADDR, so a port still in TIME_WAIT is refused): the port moves
    up from the plan's by the job id (modulo PORT_SPREAD), the same on every node of the job and different for
    consecutive jobs. Pods and the local cluster (which picks a free port at submit) keep the plan's."""
    if spec.discovery == "slurm":
        job = env.get("SLURM_JOB_ID", "")
    elif spec.discovery == "flux":
        job = env.get("FLUX_JOB_ID", "")
    else:
        return spec.rdzv_port
    if not job:
        return spec.rdzv_port
    number = int(job) if job.isdigit() else sum(ord(char) * 131 ** index for index, char in enumerate(job))
    return spec.rdzv_port + number % PORT_SPREAD


def run(spec: LaunchSpec) -> int:
    trace("started")
    if spec.launcher == "torchrun" or spec.framework:
        spec = spec._replace(rdzv_port=job_port(spec, os.environ))
    topology = discovery.discover(spec.discovery, slots=spec.procs_per_node, nodes=spec.nodes, hosts=spec.hosts,
                                  rank=spec.node_rank, hostfile=spec.hostfile, leader=spec.leader)
    topology = rendezvous.with_addresses(spec, topology, os.environ)
    report_gpus(topology, launchers.node_gpus(os.environ))
    workdir = private_workdir(spec.job_id)
    try:
        if spec.launcher == "script":
            return run_script(spec, topology, workdir)
        if spec.launcher in MPI and spec.ssh_dir and len(topology.hosts) > 1:
            keys = ssh.private_keys(ssh.load_job_keys(spec.ssh_dir), Path(workdir))
            if topology.rank != 0:
                return serve_peer(spec, topology, keys, workdir)
            return lead(spec, topology, keys, workdir)
        if spec.framework == "xgboost":
            return run_xgboost(spec, topology, child_env(spec, os.environ, topology))
        tagged = tags_output(spec, topology, os.environ)
        argv = launch_argv(spec, topology, workdir, tag_output=tagged)
        if argv is None:
            return 0
        env = child_env(spec, os.environ, topology)
        meeting = rendezvous.meeting(spec, topology, env)
        if not tagged:
            return run_child(argv, env, meeting)
        return run_tagged(spec, topology, argv, with_torchrun_shim(spec, env, workdir), meeting)
    finally:
        remove_workdir(workdir)
