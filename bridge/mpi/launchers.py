"""Argv builders for the programs that start a job's processes: pure functions, one per launcher."""

from __future__ import annotations

import os
import sys
from collections import namedtuple
from collections.abc import Mapping, Sequence

from bridge.envnames import TF_ROLES_ENV
from bridge.mpi.discovery import Topology


class SSHSettings(namedtuple("SSHSettings", "config wrapper")):
    """How an MPI launcher reaches the other hosts outside a scheduler (explicit hosts, JobSet pods): *config*
    is the ssh client config (it pins identity and known_hosts), *wrapper* an executable that runs
    ``ssh -F config "$@"`` (the launchers take an executable, not arguments)."""

    __slots__ = ()


def openmpi_argv(topology: Topology, hostfile: str, command: Sequence[str], forward_env: Sequence[str],
                 ssh: SSHSettings | None = None, mpirun: str = "mpirun", tag_output: bool = False) -> list[str]:
    """*tag_output*: each chunk a rank writes comes out after ``[jobid,rank]<stdout>:`` (group.OPENMPI_TAG)."""
    argv = [mpirun, "--hostfile", hostfile, "-np", str(len(topology.hosts) * topology.slots)]
    if tag_output:
        argv.append("--tag-output")
    if ssh is not None:
        # plm rsh also inside a Slurm allocation, where Open MPI would otherwise launch orted with srun; the
        # agent comes from openmpi_ssh_env
        argv += ["--mca", "plm", "rsh"]
    for name in forward_env:
        argv += ["-x", name]
    return [*argv, *command]


def openmpi_ssh_env(ssh: SSHSettings, path: str | None = None) -> dict[str, str]:
    """mpirun's own settings for reaching the peers. The agent is plain ``ssh``, and the wrapper (node 0's files,
    named ssh) comes first on mpirun's PATH: mpirun copies its MCA settings, from the command line or the
    environment, onto every orted's command line, and orted aborts on an agent path it cannot find on its own
    host. No tree spawn: mpirun itself starts every daemon (the peers hold no client key)."""
    path = os.environ.get("PATH", os.defpath) if path is None else path
    return {"PATH": f"{os.path.dirname(ssh.wrapper)}{os.pathsep}{path}", "OMPI_MCA_plm_rsh_agent": "ssh",
            "OMPI_MCA_plm_rsh_no_tree_spawn": "1"}


def hydra_argv(topology: Topology, hostfile: str, command: Sequence[str], forward_env: Sequence[str],
               ssh: SSHSettings | None = None, mpiexec: str | None = None, localhost: str | None = None,
               tag_output: bool = False) -> list[str]:
    """Hydra's mpiexec; *localhost* is the name the proxies reach this host by (default: its hostname);
    *tag_output*: each chunk a rank writes comes out after ``[rank] `` (group.HYDRA_TAG)."""
    import shutil

    program = mpiexec or (shutil.which("mpiexec.hydra") and "mpiexec.hydra") or "mpiexec"
    argv = [program, "-f", hostfile, "-n", str(len(topology.hosts) * topology.slots)]
    if tag_output:
        argv.append("-prepend-rank")
    if localhost:
        argv += ["-localhost", localhost]
    if ssh is not None:
        argv += ["-launcher", "ssh", "-launcher-exec", ssh.wrapper]
    if forward_env:
        argv += ["-genvlist", ",".join(forward_env)]
    return [*argv, *command]


def find_torchrun() -> list[str]:
    """torchrun from PATH, else the one installed beside this Python (a venv that is not activated), else
    ``python -m torch.distributed.run`` (what torchrun runs): torch on PYTHONPATH installs no torchrun."""
    import shutil

    beside = os.path.join(os.path.dirname(sys.executable), "torchrun")
    found = shutil.which("torchrun") or (beside if os.access(beside, os.X_OK) else None)
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def torchrun_argv(topology: Topology, command: Sequence[str], port: int, job_id: str,
                  torchrun: str | None = None) -> list[str]:
    """Static rendezvous: every node knows its rank, and node 0 hosts the store (all local nodes share one host,
    so the rank, not the address, says which one hosts it). Not c10d's dynamic rendezvous: its shutdown, after
    the workers end, writes to node 0's store, and a node whose peer 0 had already exited then failed or hung
    (torch 2.15, about one run in three across two hosts).

    ``--no-python`` because the command is an argv (``python3 train.py``), not a script for torchrun to wrap.
    """
    return [
        *([torchrun] if torchrun else find_torchrun()),
        f"--nnodes={len(topology.hosts)}",
        f"--nproc-per-node={topology.slots}",
        f"--node-rank={topology.rank}",
        f"--master-addr={topology.master}",
        f"--master-port={port}",
        f"--rdzv-id={job_id or 'hpcbridge'}",
        "--no-python",
        *command,
    ]


def torch_env(topology: Topology, port: int) -> dict[str, str]:
    """Kubeflow's PET_* variables, for commands that call torchrun themselves (torchrun reads them)."""
    return {
        "PET_NNODES": str(len(topology.hosts)),
        "PET_NPROC_PER_NODE": str(topology.slots),
        "PET_NODE_RANK": str(topology.rank),
        "PET_MASTER_ADDR": topology.master,
        "PET_MASTER_PORT": str(port),
    }


def node_gpus(env: Mapping[str, str]) -> list[str]:
    """The GPUs this node's processes can use, as CUDA will name them: CUDA_VISIBLE_DEVICES's entries when it
    is set (Slurm's gres, Flux's gpu-affinity, the local cluster; "-1" or "" is none; CUDA stops at the first
    invalid entry), else ordinals for the devices the NVIDIA container runtime put in this container
    (NVIDIA_VISIBLE_DEVICES, as Kubernetes' device plugin sets it; inside, CUDA numbers them from 0)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = []
        for item in visible.split(","):
            item = item.strip()
            if not item or item.startswith("-"):
                break
            devices.append(item)
        return devices
    container = (env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    if not container or container in ("all", "none", "void"):
        return []  # "all" names no count; the others none
    return [str(index) for index in range(len([item for item in container.split(",") if item.strip()]))]


def worker_gpus(gpus: Sequence[str], workers: int) -> list[str | None]:
    """Each of a node's *workers* its own share of *gpus*, as CUDA_VISIBLE_DEVICES: the devices split evenly
    in order; None for every worker (each sees all) when there are fewer devices than workers or none."""
    if not gpus or len(gpus) < workers:
        return [None] * workers
    share = len(gpus) // workers
    return [",".join(gpus[index * share:(index + 1) * share]) for index in range(workers)]


def xgboost_env(topology: Topology, port: int, local: int) -> dict[str, str]:
    """What Kubeflow's XGBoost plugin gives a pod, for one of this node's workers: the tracker on node 0 at the
    plan's port, the worker count (every node's workers) and this worker's task id ``node*G+local``. Ids are
    zero-padded to one width, so a tracker sorting by task (string order) ranks them as numbered."""
    workers = len(topology.hosts) * topology.slots
    width = len(str(workers - 1))
    return {"DMLC_TRACKER_URI": topology.master, "DMLC_TRACKER_PORT": str(port),
            "DMLC_TASK_ID": str(topology.rank * topology.slots + local).zfill(width),
            "DMLC_NUM_WORKER": str(workers)}


#: the tracker node 0's launch runs: a Python of the job's (it has xgboost), not hpc-bridge's own
XGBOOST_TRACKER_CODE = """\
import sys
from xgboost.tracker import RabitTracker
tracker = RabitTracker(n_workers=int(sys.argv[1]), host_ip="0.0.0.0", port=int(sys.argv[2]), sortby="task")
tracker.start()
tracker.wait_for()
"""


def xgboost_tracker_argv(command: Sequence[str], workers: int, port: int) -> list[str]:
    """The tracker's command line: with the command's own Python when it runs one (that Python has xgboost),
    else this one."""
    program = command[0] if command and os.path.basename(command[0]).startswith("python") else sys.executable
    return [program, "-c", XGBOOST_TRACKER_CODE, str(workers), str(port)]


def jax_env(topology: Topology, port: int, gpus: Sequence[str]) -> dict[str, str]:
    """What Kubeflow's JAX plugin gives each pod, for this node's one process: the process count, its id and
    the coordinator (node 0, the plan's port); a script passes them to ``jax.distributed.initialize`` (which
    does not read the first two itself). With GPUs visible (node_gpus), JAX_LOCAL_DEVICE_IDS names all of them,
    else JAX's own Slurm/Open MPI detection would give each process its local rank's GPU only."""
    env = {"JAX_NUM_PROCESSES": str(len(topology.hosts)), "JAX_PROCESS_ID": str(topology.rank),
           "JAX_COORDINATOR_ADDRESS": f"{topology.master}:{port}"}
    if gpus:
        env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(index) for index in range(len(gpus)))
    return env


#: the port of node 0's TensorFlow server; node N listens on this + N (nodes of the local cluster share a host)
TF_PORT_ENV = "HPCBRIDGE_TF_PORT"
TF_DEFAULT_PORT = 2223


def tf_config(roles: str, topology: Topology, port: int) -> str:
    """TF_CONFIG for this node: the cluster (each role's ``host:port`` in rank order) and this node's task."""
    import json

    from bridge.errors import InvalidSpec

    cluster: dict[str, list[str]] = {}
    task = None
    rank = 0
    for part in roles.split(","):
        role, _, count = part.partition("=")
        if not role or not count.isdigit():
            raise InvalidSpec(TF_ROLES_ENV, roles, f"{part!r} is not ROLE=COUNT")
        for index in range(int(count)):
            if rank >= len(topology.hosts):
                raise InvalidSpec(TF_ROLES_ENV, roles, f"names more nodes than the job's {len(topology.hosts)}")
            cluster.setdefault(role, []).append(f"{topology.address(rank)}:{port + rank}")
            if rank == topology.rank:
                task = {"type": role, "index": index}
            rank += 1
    if rank != len(topology.hosts):
        raise InvalidSpec(TF_ROLES_ENV, roles, f"names {rank} nodes; the job has {len(topology.hosts)}")
    return json.dumps({"cluster": cluster, "task": task}, separators=(",", ":"))


#: shells whose ``-c`` script may start torchrun itself
SHELLS = ("sh", "bash", "dash", "ksh", "zsh")


def calls_torchrun(command: Sequence[str]) -> bool:
    """Whether the command starts torchrun itself: torchrun, torchtune's ``tune run`` (which hands its
    torchrun arguments on), or a shell script that runs torchrun as one of its commands (the Kubeflow SDK's
    CustomTrainer writes the function to a file and runs ``torchrun <file>`` from ``bash -c``); each reads the
    PET_* variables, and another torchrun around it would make every node a job of its own."""
    name = os.path.basename(command[0]) if command else ""
    if name == "torchrun" or (name == "tune" and list(command[1:2]) == ["run"]):
        return True
    flags = command[1] if len(command) > 2 else ""
    if name in SHELLS and flags.startswith("-") and not flags.startswith("--") and "c" in flags:
        return script_runs_torchrun(command[2])
    return False


def script_runs_torchrun(script: str) -> bool:
    """Whether a shell script runs torchrun as a command: first on a line or after ``;``, ``&``, ``|``, ``(``,
    ``exec``, ``then``, ``do`` or ``else``, after any ``NAME=value`` assignments, by name or by path."""
    import re

    return re.search(r"(?:^|[;&|(]|\b(?:exec|then|do|else)\b)[ \t]*(?:[A-Za-z_]\w*=\S*[ \t]+)*"
                     r"(?:[^\s;&|()]*/)?torchrun(?=[ \t]|$)", script, re.MULTILINE) is not None


def flux_run_argv(topology: Topology, command: Sequence[str], gpus_per_node: int = 0) -> list[str]:
    """MPI ranks started by Flux's shell. Each node's GPUs are asked for per node: without them Flux's
    gpu-affinity gives every task CUDA_VISIBLE_DEVICES=-1; with them each rank sees all of its node's, as under
    mpirun, and picks its own by local rank. --tasks-per-node and --gpus-per-node are per-resource options:
    flux run refuses them together with --ntasks or the per-task ones."""
    argv = ["flux", "run", f"--nodes={len(topology.hosts)}", f"--tasks-per-node={topology.slots}"]
    if gpus_per_node:
        argv.append(f"--gpus-per-node={gpus_per_node}")
    return [*argv, *command]


def srun_argv(topology: Topology, command: Sequence[str], mpi: str | None = None) -> list[str]:
    argv = ["srun", f"--nodes={len(topology.hosts)}", f"--ntasks-per-node={topology.slots}", "--kill-on-bad-exit=1"]
    if mpi:
        argv.append(f"--mpi={mpi}")
    return [*argv, *command]
