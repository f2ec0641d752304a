"""Slurm's job steps off Slurm: ``srun`` and ``scontrol show hostnames`` for a batch script that runs on the
local cluster, in a Flux allocation or in JobSet pods, over the shared bootstrap.

``hpcbridge launch --launcher script`` runs the script once, on the allocation's first node, with the
environment sbatch gives a batch script (``batch_env``) and this module's shims first on PATH. An ``srun`` line
then starts a step: its tasks run on the allocation's nodes through the transport the launch found —

- ``local``: every emulated node is this machine; the tasks are its children;
- ``ssh``: JobSet pods; the other pods serve the job's sshd (as MPI peers do) and one ssh per node starts
  that node's tasks (``node``), with the script's environment sent on the connection's stdin;
- ``flux``: ``flux run`` inside the Flux allocation.

``--mpi=pmix|pmi2|pmix_v*`` steps start through the MPI launcher instead (Open MPI's mpirun for PMIx, Hydra's
mpiexec for PMI-2, ``flux run`` under Flux), so an MPI program finds its PMI as under srun. Every task runs
under ``task``, which sets SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID and the step's variables from the
identity its starter gave it, and labels its lines for ``-l``. The step's exit code is the highest of its
tasks', as srun's is. What of srun this does not cover is refused by name (README: "Moving from Slurm").
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from bridge.mpi.exits import ending_signal, shell_code
from bridge.mpi.hostlist import compress, expand

if TYPE_CHECKING:
    import subprocess

#: how the launch told the script's shims to reach the nodes, and where the shims keep their state
TRANSPORT_ENV = "HPCBRIDGE_STEP_TRANSPORT"
HOSTS_ENV = "HPCBRIDGE_STEP_HOSTS"
SSH_CONFIG_ENV = "HPCBRIDGE_STEP_SSH_CONFIG"
STATE_ENV = "HPCBRIDGE_STEP_DIR"
PYTHON_ENV = "HPCBRIDGE_STEP_PYTHON"
#: a task's identity from our own starters (local, ssh): "procid,localid,nodeid"
TASK_ENV = "HPCBRIDGE_STEP_TASK"
TRANSPORTS = ("local", "ssh", "flux")
MPI_TYPES = ("none", "pmix", "pmi2", "openmpi", "pmix_v2", "pmix_v3", "pmix_v4", "pmix_v5", "cray_shasta")

#: the environment a step's tasks do not take from the script: a parent launcher's identity (ours is set anew)
_NOT_EXPORTED_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "HYDRA_", "FLUX_TASK_", "BASH_FUNC_")
_NOT_EXPORTED = frozenset({"_", "SHLVL", "OLDPWD", "PWD", TASK_ENV})


class StepError(Exception):
    """A step srun would refuse: one line, exit 2 (nothing started)."""


class Step(NamedTuple):
    """A step's shape, decided from srun's options and the job's environment as srun decides it."""

    nodes: int
    ntasks: int
    per_node: int
    cpus_per_task: int | None
    label: bool
    mpi: str
    kill_on_bad_exit: bool
    command: tuple[str, ...]

    def tasks_on(self, node: int) -> range:
        """Task ids on *node*: block distribution, the first nodes full (srun's default)."""
        first = node * self.per_node
        return range(first, min(first + self.per_node, self.ntasks))


# --- srun's command line ----------------------------------------------------------------------------------

#: options with a value: srun's long name for each short one
_VALUED_SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "J": "job-name", "t": "time", "p": "partition",
                 "m": "distribution", "D": "chdir", "W": "wait"}
_FLAG_SHORT = {"l": "label", "K": "kill-on-bad-exit", "u": "unbuffered", "v": "verbose", "Q": "quiet",
               "X": "disable-status"}
_VALUED = {"nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "mpi", "job-name", "time", "partition",
           "distribution", "chdir", "cpu-bind", "mem", "mem-per-cpu", "mem-per-gpu", "export", "gpus-per-task",
           "gpu-bind", "kill-on-bad-exit", "wait"}
#: of these, all but -N, -n, --ntasks-per-node, -c, -l, -K, --mpi, --export and -m change nothing inside an
#: allocation that is already the job's (binding, memory, names, limits): accepted and ignored
_FLAGS = {"label", "kill-on-bad-exit", "unbuffered", "verbose", "quiet", "exclusive", "overlap", "disable-status",
          "whole"}


def parse_srun(argv: Sequence[str]) -> tuple[dict[str, str | None], list[str]]:
    """srun's options (long names; flags map to None) and the command after them."""
    options: dict[str, str | None] = {}
    index = 0
    args = list(argv)
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            if name in _VALUED and (eq or name not in _FLAGS):
                if not eq:
                    index += 1
                    if index >= len(args):
                        raise StepError(f"option --{name} needs a value")
                    value = args[index]
                options[name] = value
            elif name in _FLAGS and not eq:
                options[name] = None
            else:
                raise StepError(f"option --{name} is not available off Slurm (hpc-bridge's srun covers -N, -n, "
                                "--ntasks-per-node, -c, -l, -K, --mpi, --export and options that change nothing "
                                "here; README: Moving from Slurm)")
        elif arg.startswith("-") and len(arg) > 1:
            letters = arg[1:]
            while letters:
                letter, letters = letters[0], letters[1:]
                if letter in _FLAG_SHORT:
                    options[_FLAG_SHORT[letter]] = None
                elif letter in _VALUED_SHORT:
                    if not letters:
                        index += 1
                        if index >= len(args):
                            raise StepError(f"option -{letter} needs a value")
                        letters = args[index]
                    options[_VALUED_SHORT[letter]] = letters.removeprefix("=")
                    letters = ""
                else:
                    raise StepError(f"option -{letter} is not available off Slurm (README: Moving from Slurm)")
        else:
            break
        index += 1
    return options, args[index:]


def _count(options: Mapping[str, str | None], name: str, env: Mapping[str, str], variable: str | None) -> int | None:
    text = options.get(name)
    where = f"--{name}"
    if text is None and variable and env.get(variable):
        text, where = env[variable], variable
    if text is None:
        return None
    if name == "nodes":
        text = text.split("-", 1)[0]  # a range: the minimum, as srun starts a step with it
    if not text.isdigit() or int(text) < 1:
        raise StepError(f"{where}: {text!r} is not a positive count")
    return int(text)


def decide(options: Mapping[str, str | None], command: Sequence[str], env: Mapping[str, str], allocated: int) -> Step:
    """The step srun would start in this allocation (*allocated* nodes), with its environment as defaults."""
    if not command:
        raise StepError("no command to run")
    for unsupported in ("chdir",):
        if unsupported in options:
            raise StepError(f"option --{unsupported} is not available off Slurm (run cd before srun)")
    distribution = options.get("distribution")
    if distribution is not None and distribution.split(":")[0] not in ("block", "*"):
        raise StepError(f"--distribution={distribution}: only block distribution is available off Slurm")
    export = options.get("export")
    if export is not None and export.split(",")[0].upper() not in ("ALL",):
        raise StepError(f"--export={export}: only ALL (srun's default) is available off Slurm")
    given_nodes = _count(options, "nodes", env, None)
    given_tasks = _count(options, "ntasks", env, None)
    per_node = _count(options, "ntasks-per-node", env, None)
    cpus = _count(options, "cpus-per-task", env, "SLURM_CPUS_PER_TASK")
    if given_nodes is not None and given_nodes > allocated:
        raise StepError(f"--nodes={options['nodes']}: the allocation has {allocated} node(s)")
    # as srun reads it: the job's SLURM_NTASKS is the step's -n unless the line says otherwise
    ntasks = given_tasks
    if ntasks is None:
        if given_nodes is not None:
            ntasks = given_nodes * (per_node or 1)
        else:
            ntasks = _count({}, "ntasks", env, "SLURM_NTASKS") or allocated * (per_node or 1)
    nodes = given_nodes
    if nodes is None:
        nodes = min(allocated, -(-ntasks // per_node) if per_node else ntasks)
    if per_node is not None and ntasks != per_node * nodes:
        print(f"srun: Warning: can't honor --ntasks-per-node set to {per_node} which doesn't match the requested "
              f"tasks {ntasks} with the number of requested nodes {nodes}. Ignoring --ntasks-per-node.",
              file=sys.stderr, flush=True)
    if ntasks < nodes:
        raise StepError(f"--ntasks={ntasks} is fewer than --nodes={nodes}: every node of a step runs a task")
    mpi = (options.get("mpi") or env.get("SLURM_MPI_TYPE") or "none").lower()
    if mpi not in MPI_TYPES:
        raise StepError(f"--mpi={mpi}: use one of none, pmix or pmi2")
    kill = options.get("kill-on-bad-exit", "0") if "kill-on-bad-exit" in options else "0"
    return Step(nodes, ntasks, -(-ntasks // nodes), cpus, "label" in options, mpi, kill in (None, "1"),
                tuple(command))


# --- the environment Slurm gives a batch script and a step's tasks -----------------------------------------

def tasks_per_node_text(counts: Sequence[int]) -> str:
    """Slurm's compressed SLURM_TASKS_PER_NODE: [2, 2, 1] → ``2(x2),1``."""
    parts: list[str] = []
    index = 0
    while index < len(counts):
        end = index
        while end + 1 < len(counts) and counts[end + 1] == counts[index]:
            end += 1
        run = end - index + 1
        parts.append(f"{counts[index]}(x{run})" if run > 1 else str(counts[index]))
        index = end + 1
    return ",".join(parts)


def node_names(hosts: Sequence[str]) -> list[str]:
    """The names a script sees for the allocation's nodes: the hosts, except the local cluster's emulated nodes
    (all "localhost"), which get loopback addresses of their own so that a hostlist names each once."""
    if len(hosts) > 1 and len(set(hosts)) == 1 and hosts[0] == "localhost":
        return [f"127.0.0.{index + 1}" for index in range(len(hosts))]
    return list(hosts)


def batch_env(job_id: str, hosts: Sequence[str], procs_per_node: int, env: Mapping[str, str]) -> dict[str, str]:
    """What the batch script finds beside what the renderer set (SLURM_JOB_NAME, SLURM_NTASKS, ...): the
    allocation's shape as it is, and the batch step's identity (node 0, task 0)."""
    names = node_names(hosts)
    nodelist = compress(names)
    ntasks = env.get("SLURM_NTASKS") or str(len(hosts) * procs_per_node)
    counts = _block(int(ntasks), len(hosts))
    values = {
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id,
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(len(hosts)), "SLURM_NNODES": str(len(hosts)),
        "SLURM_NTASKS": ntasks, "SLURM_NPROCS": ntasks,
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": names[0],
        "SLURM_SUBMIT_DIR": env.get("SLURM_SUBMIT_DIR") or os.getcwd(),
        "SLURM_SUBMIT_HOST": env.get("SLURM_SUBMIT_HOST") or os.uname().nodename,
    }
    return values


def _block(ntasks: int, nodes: int) -> list[int]:
    per_node = -(-ntasks // nodes)
    return [max(0, min(per_node, ntasks - node * per_node)) for node in range(nodes)]


def step_env(step: Step, step_id: int, names: Sequence[str]) -> dict[str, str]:
    """The step's variables, the same for each of its tasks (srun sets them)."""
    used = names[:step.nodes]
    counts = [len(step.tasks_on(node)) for node in range(step.nodes)]
    values = {
        "SLURM_STEP_ID": str(step_id), "SLURM_STEPID": str(step_id),
        "SLURM_STEP_NUM_NODES": str(step.nodes), "SLURM_STEP_NUM_TASKS": str(step.ntasks),
        "SLURM_STEP_NODELIST": compress(used), "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_NNODES": str(step.nodes), "SLURM_NTASKS": str(step.ntasks), "SLURM_NPROCS": str(step.ntasks),
        "SLURM_NODELIST": compress(used), "SLURM_TASKS_PER_NODE": tasks_per_node_text(counts),
    }
    if step.cpus_per_task:
        values["SLURM_CPUS_PER_TASK"] = str(step.cpus_per_task)
    return values


def exported(env: Mapping[str, str]) -> dict[str, str]:
    """The script's environment as srun passes it on (--export=ALL), less a parent launcher's identity."""
    return {name: value for name, value in env.items()
            if name not in _NOT_EXPORTED and not name.startswith(_NOT_EXPORTED_PREFIXES)}


# --- the shims -------------------------------------------------------------------------------------------

def write_shims(directory: str, python: str) -> str:
    """``srun`` and ``scontrol`` executables in *directory*/bin (the launch's private workdir); its path."""
    shims = os.path.join(directory, "bin")
    os.mkdir(shims, 0o700)
    quoted = "'" + python.replace("'", "'\"'\"'") + "'"
    for name in ("srun", "scontrol"):
        path = os.path.join(shims, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f'#!/bin/sh\nexec {quoted} -m bridge.mpi.step {name} "$@"\n')
        os.chmod(path, 0o755)
    return shims


def _next_step_id(state: str | None) -> int:
    """0, 1, 2, ... per job, as Slurm numbers steps; steps started together (``srun ... &``) get distinct ids."""
    if not state:
        return 0
    for number in range(100000):
        try:
            os.close(os.open(os.path.join(state, f"step.{number}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return number
        except FileExistsError:
            continue
    return 0


def _hosts(env: Mapping[str, str]) -> list[str]:
    text = env.get(HOSTS_ENV)
    if not text:
        raise StepError(f"not inside an hpc-bridge allocation ({HOSTS_ENV} is not set)")
    return text.split(",")


def srun(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    transport = env.get(TRANSPORT_ENV)
    if transport not in TRANSPORTS:
        raise StepError(f"not inside an hpc-bridge allocation ({TRANSPORT_ENV}={transport!r})")
    hosts = _hosts(env)
    options, command = parse_srun(argv)
    step = decide(options, command, env, len(hosts))
    step_id = _next_step_id(env.get(STATE_ENV))
    names = node_names(hosts)
    base = {**exported(env), **step_env(step, step_id, names)}
    python = env.get(PYTHON_ENV) or sys.executable
    wrapper = [python, "-m", "bridge.mpi.step", "task", "--per-node", str(step.per_node),
               *(["--label", str(step.ntasks)] if step.label else []), "--"]
    if transport == "flux":
        return _run_flux(step, base, wrapper)
    if step.mpi != "none":
        return _run_mpi(step, base, wrapper, hosts, names, env, transport)
    return _run_tasks(step, base, wrapper, hosts, names, env, transport)


def _run_flux(step: Step, env: dict[str, str], wrapper: list[str]) -> int:
    # Flux's own PMI serves MPI programs (as under `flux run` itself); exit-timeout=none: the other tasks go on
    # when one ends, unless -K asks otherwise (srun's default)
    argv = ["flux", "run", f"--nodes={step.nodes}", f"--ntasks={step.ntasks}", "-o", "cpu-affinity=off",
            "-o", "exit-on-error" if step.kill_on_bad_exit else "exit-timeout=none"]
    if step.cpus_per_task:
        argv.append(f"--cores-per-task={step.cpus_per_task}")
    return _wait_all([_start([*argv, *wrapper, *step.command], env)])


def _run_mpi(step: Step, env: dict[str, str], wrapper: list[str], hosts: Sequence[str], names: Sequence[str],
             script_env: Mapping[str, str], transport: str) -> int:
    from bridge.mpi import launchers
    from bridge.mpi.discovery import Topology
    from bridge.mpi.hostfile import Peer, hostfile_for

    kind = "mpich" if step.mpi == "pmi2" else "openmpi"
    peers = [Peer(hosts[node], len(step.tasks_on(node))) for node in range(step.nodes)]
    nodename = os.uname().nodename
    localhost = None
    if transport == "ssh" and hosts[0] != nodename and hosts[0].split(".")[0] == nodename.split(".")[0]:
        # as for MPI jobs (bootstrap.launch_argv): this host by the kernel's name, the others by the full names
        # they resolve by (a pod's short name resolves only in its own /etc/hosts)
        peers[0] = Peer(nodename, peers[0].slots)
        localhost = hosts[0]
    import tempfile

    # in the launch's private directory (0700); a file of our own, never a name someone could have made first
    fd, hostfile = tempfile.mkstemp(prefix="hostfile.", dir=script_env.get(STATE_ENV) or None)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(hostfile_for(kind, peers))
    topology = Topology(tuple(hosts[:step.nodes]), 0, step.per_node)
    ssh = None
    if transport == "ssh":
        config = script_env[SSH_CONFIG_ENV]
        ssh = launchers.SSHSettings(config, os.path.join(os.path.dirname(config), "ssh"))
    command = [*wrapper, *step.command]
    # the tasks keep the job's SLURM_* variables, so the launcher must not take this for a Slurm allocation
    # (Open MPI would start its daemons with srun, Hydra would read Slurm's node list)
    if kind == "openmpi":
        env.update({"OMPI_MCA_plm": "rsh", "OMPI_MCA_ras": "^slurm", "OMPI_MCA_ess": "^slurm",
                    "OMPI_MCA_orte_keep_fqdn_hostnames": "true"})
        argv = launchers.openmpi_argv(topology, hostfile, command, sorted(env), ssh=ssh)
        argv[argv.index("-np") + 1] = str(step.ntasks)
        if transport == "local":
            env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
            env.setdefault("OMPI_MCA_hwloc_base_binding_policy", "none")
        if ssh is not None:
            env.update(launchers.openmpi_ssh_env(ssh, env.get("PATH")))
        if os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    else:
        argv = launchers.hydra_argv(topology, hostfile, command, (), ssh=ssh, localhost=localhost)
        argv[argv.index("-n") + 1] = str(step.ntasks)
        argv[1:1] = ["-rmk", "user", *(["-launcher", "fork"] if ssh is None else [])]
    try:
        return _wait_all([_start(argv, env)], kill_on_bad_exit=False)
    finally:
        os.unlink(hostfile)


def _run_tasks(step: Step, env: dict[str, str], wrapper: list[str], hosts: Sequence[str], names: Sequence[str],
               script_env: Mapping[str, str], transport: str) -> int:
    children = []
    for node in range(step.nodes):
        tasks = step.tasks_on(node)
        if transport == "local" or node == 0:  # over ssh, node 0 is the script's own host
            for procid in tasks:
                task_env = {**env, TASK_ENV: f"{procid},{procid - tasks.start},{node}", "SLURMD_NODENAME": names[node]}
                children.append(_start([*wrapper, *step.command], task_env, task=(names[node], procid)))
        else:  # that node's runner reports its own tasks
            children.append(_start_node(node, tasks, names[node], hosts[node], env, wrapper, step, script_env))
    return _wait_all(children, step.kill_on_bad_exit)


def _report(children: Sequence[_Child]) -> None:
    """srun's line for each node's tasks that did not exit 0, e.g. ``srun: error: node-1: tasks 2-3: Exited with
    exit code 1``: tasks with the same ending on one node share a line."""
    groups: dict[tuple[str, int], list[int]] = {}
    for child in children:
        if child.task is not None and child.code:
            groups.setdefault((child.task[0], child.code), []).append(child.task[1])
    for (name, code), ids in groups.items():
        ids.sort()
        ranges, start = [], 0
        while start < len(ids):
            end = start
            while end + 1 < len(ids) and ids[end + 1] == ids[end] + 1:
                end += 1
            ranges.append(str(ids[start]) if end == start else f"{ids[start]}-{ids[end]}")
            start = end + 1
        signum = ending_signal(code)
        how = f"Exited with exit code {code}" if signum is None else signal.strsignal(signum) or f"signal {signum}"
        print(f"srun: error: {name}: task{'s' if len(ids) > 1 else ''} {','.join(ranges)}: {how}", file=sys.stderr,
              flush=True)


def _start_node(node: int, tasks: range, name: str, host: str, env: Mapping[str, str], wrapper: list[str],
                step: Step, script_env: Mapping[str, str]) -> _Child:
    """One ssh to *host* that starts the node's tasks (``node``); the environment travels on its stdin, not on a
    command line another user could read."""
    from bridge.mpi.spawn import which

    ssh = which("ssh", script_env.get("PATH")) or "/usr/bin/ssh"
    remote = [*wrapper[:3], "node", "--first", str(tasks.start), "--count", str(len(tasks)), "--node", str(node),
              "--name", name, "--", *wrapper, *step.command]
    import shlex

    argv = [ssh, "-F", script_env[SSH_CONFIG_ENV], host, shlex.join(remote)]
    return _start(argv, dict(script_env), stdin=json.dumps(dict(env)).encode())


class _Child:
    """A started process; *task* (node name, task id) when it is one task of the step, for srun's report."""

    def __init__(self, proc: subprocess.Popen[bytes], task: tuple[str, int] | None = None) -> None:
        self.proc = proc
        self.task = task
        self.code: int | None = None


def _start(argv: Sequence[str], env: Mapping[str, str], stdin: bytes | None = None,
           task: tuple[str, int] | None = None) -> _Child:
    import subprocess

    try:
        proc = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.PIPE if stdin is not None else None,
                                start_new_session=True)
    except FileNotFoundError:
        raise StepError(f"{argv[0]}: command not found") from None
    if stdin is not None:
        assert proc.stdin is not None  # a pipe, asked for above
        proc.stdin.write(stdin)
        proc.stdin.close()
    return _Child(proc, task)


def _wait_all(children: Sequence[_Child], kill_on_bad_exit: bool = False) -> int:
    """The highest exit code (a signal N as 128+N), forwarding the stop and checkpoint signals to every task;
    with -K the first task that fails ends the others."""
    from bridge.mpi.group import wait_all

    code = wait_all(children, kill_on_bad_exit)
    _report(children)
    return code


# --- on a node: its tasks, and each task ------------------------------------------------------------------

def node(argv: Sequence[str]) -> int:
    """``node --first F --count C --node I --name NAME -- WRAPPER...``: one node's tasks of a step started over
    ssh; the environment is the JSON document on stdin."""
    options, command = _node_options(argv)
    env = json.loads(sys.stdin.buffer.read() or b"{}")
    first, count, index = int(options["first"]), int(options["count"]), int(options["node"])
    children = []
    for procid in range(first, first + count):
        task_env = {**env, TASK_ENV: f"{procid},{procid - first},{index}", "SLURMD_NODENAME": options["name"]}
        children.append(_start(command, task_env, task=(options["name"], procid)))
    return _wait_all(children)


def _node_options(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    args = list(argv)
    while args and args[0] != "--":
        options[args[0].removeprefix("--")] = args[1]
        args = args[2:]
    return options, args[1:]


def _identity(env: Mapping[str, str], per_node: int) -> tuple[int, int, int]:
    """(procid, localid, nodeid) from whatever started this task: ours, Flux, Open MPI or Hydra."""
    if env.get(TASK_ENV):
        procid, localid, nodeid = (int(part) for part in env[TASK_ENV].split(","))
        return procid, localid, nodeid
    for variable in ("FLUX_TASK_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if env.get(variable, "").isdigit():
            procid = int(env[variable])
            return procid, procid % per_node, procid // per_node
    return 0, 0, 0


def task(argv: Sequence[str]) -> int:
    """``task --per-node K [--label NTASKS] -- COMMAND``: one task of a step, as srun's slurmstepd starts it."""
    args = list(argv)
    per_node, label_width = 1, None
    while args and args[0] != "--":
        if args[0] == "--per-node":
            per_node = int(args[1])
        elif args[0] == "--label":
            label_width = len(str(max(int(args[1]) - 1, 0)))
        args = args[2:]
    command = args[1:]
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # srun's interrupt ends the task with its command, no traceback
    env = dict(os.environ)
    procid, localid, nodeid = _identity(env, per_node)
    env.pop(TASK_ENV, None)
    env.update({"SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid), "SLURM_NODEID": str(nodeid)})
    if TASK_ENV not in os.environ:  # started by Flux or an MPI launcher: the node is where this runs
        names = expand(env["SLURM_STEP_NODELIST"]) if env.get("SLURM_STEP_NODELIST") else []
        local = env.get(TRANSPORT_ENV) == "local" and nodeid < len(names)
        env["SLURMD_NODENAME"] = names[nodeid] if local else os.uname().nodename
    # relayed line by line even without -l, as slurmstepd relays: tasks writing at once never split a line
    prefix = b"" if label_width is None else f"{procid:>{label_width}}: ".encode()
    return _labelled(command, env, prefix)


def _labelled(command: Sequence[str], env: Mapping[str, str], prefix: bytes) -> int:
    """Run *command*; every line it writes to stdout or stderr goes out whole, after *prefix* (``srun -l``)."""
    import subprocess

    from bridge.mpi.group import LineRelay

    relay = LineRelay(prefix)
    stdout, stderr = relay.pipe()
    try:
        # a PMI-1 wire descriptor (Flux's shell, Hydra) stays open: it is how the MPI program finds its launcher
        pmi_fd = env.get("PMI_FD", "")
        proc = subprocess.Popen(list(command), env=dict(env), stdout=stdout, stderr=stderr,
                                pass_fds=(int(pmi_fd),) if pmi_fd.isdigit() else ())
    except FileNotFoundError:
        sys.stderr.buffer.write(prefix + f"srun: error: {command[0]}: command not found\n".encode())
        return 127
    except PermissionError:
        sys.stderr.buffer.write(prefix + f"srun: error: {command[0]}: permission denied\n".encode())
        return 126
    finally:
        relay.started()
    code = proc.wait()
    relay.finish(timeout=None)  # as slurmstepd: the task has ended once all it wrote is out
    return shell_code(code)


def scontrol(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """``scontrol show hostnames|hostname [LIST]`` and ``scontrol show hostlist[sorted] LIST``: the hostlist
    module, with the job's node list as the default; nothing else of scontrol exists off Slurm."""
    env = os.environ if env is None else env
    args = list(argv)
    if len(args) in (2, 3) and args[0] == "show" and args[1] in ("hostnames", "hostname"):
        text = args[2] if len(args) == 3 else env.get("SLURM_JOB_NODELIST", "")
        if not text:
            raise StepError("scontrol show hostnames: no host list given and SLURM_JOB_NODELIST is not set")
        sys.stdout.write("".join(f"{host}\n" for host in expand(text)))
        return 0
    if len(args) == 3 and args[0] == "show" and args[1] in ("hostlist", "hostlistsorted"):
        names = expand(",".join(args[2].split()))
        sys.stdout.write(compress(sorted(names) if args[1] == "hostlistsorted" else names) + "\n")
        return 0
    raise StepError(f"scontrol {' '.join(args)[:60]}: off Slurm only 'scontrol show hostnames' and "
                    "'scontrol show hostlist' are available")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = (args[0], args[1:]) if args else ("", [])
    try:
        if command == "srun":
            return srun(rest)
        if command == "scontrol":
            return scontrol(rest)
        if command == "node":
            return node(rest)
        if command == "task":
            return task(rest)
        raise StepError(f"unknown command {command!r}")
    except StepError as exc:
        print(f"{command or 'hpcbridge step'}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the hostlist module's errors and the like: one line, like srun's own
        print(f"{command or 'hpcbridge step'}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
