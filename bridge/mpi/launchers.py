"""Argv builders for the programs that start a job's processes: pure functions, one per launcher."""

from __future__ import annotations

import os
import sys
from collections import namedtuple
from collections.abc import Sequence

from bridge.convert.kubeflow_v1 import TF_ROLES_ENV
from bridge.mpi.discovery import Topology


class SSHSettings(namedtuple("SSHSettings", "config wrapper")):
    """How an MPI launcher reaches the other hosts outside a scheduler (explicit hosts, JobSet pods): *config*
    is the ssh client config (it pins identity and known_hosts), *wrapper* an executable that runs
    ``ssh -F config "$@"`` (the launchers take an executable, not arguments)."""

    __slots__ = ()


def openmpi_argv(topology: Topology, hostfile: str, command: Sequence[str], forward_env: Sequence[str],
                 ssh: SSHSettings | None = None, mpirun: str = "mpirun") -> list[str]:
    argv = [mpirun, "--hostfile", hostfile, "-np", str(len(topology.hosts) * topology.slots)]
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
               ssh: SSHSettings | None = None, mpiexec: str | None = None, localhost: str | None = None) -> list[str]:
    """Hydra's mpiexec; *localhost* is the name the proxies reach this host by (default: its hostname)."""
    import shutil

    program = mpiexec or (shutil.which("mpiexec.hydra") and "mpiexec.hydra") or "mpiexec"
    argv = [program, "-f", hostfile, "-n", str(len(topology.hosts) * topology.slots)]
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


def jax_env(topology: Topology, port: int, visible_devices: str | None) -> dict[str, str]:
    """What Kubeflow's JAX plugin gives each pod, for this node's one process: the process count, its id and
    the coordinator (node 0, the plan's port); a script passes them to ``jax.distributed.initialize`` (which
    does not read the first two itself). With GPUs visible, JAX_LOCAL_DEVICE_IDS names all of them, else
    JAX's own Slurm/Open MPI detection would give each process its local rank's GPU only."""
    env = {"JAX_NUM_PROCESSES": str(len(topology.hosts)), "JAX_PROCESS_ID": str(topology.rank),
           "JAX_COORDINATOR_ADDRESS": f"{topology.master}:{port}"}
    devices = [item for item in (visible_devices or "").split(",") if item.strip()]
    if devices:
        env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(index) for index in range(len(devices)))
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
            cluster.setdefault(role, []).append(f"{topology.hosts[rank]}:{port + rank}")
            if rank == topology.rank:
                task = {"type": role, "index": index}
            rank += 1
    if rank != len(topology.hosts):
        raise InvalidSpec(TF_ROLES_ENV, roles, f"names {rank} nodes; the job has {len(topology.hosts)}")
    return json.dumps({"cluster": cluster, "task": task}, separators=(",", ":"))


def calls_torchrun(command: Sequence[str]) -> bool:
    return bool(command) and os.path.basename(command[0]) == "torchrun"


def flux_run_argv(topology: Topology, command: Sequence[str]) -> list[str]:
    # --tasks-per-node is a per-resource option: flux run refuses it together with --ntasks
    return ["flux", "run", f"--nodes={len(topology.hosts)}", f"--tasks-per-node={topology.slots}", *command]


def srun_argv(topology: Topology, command: Sequence[str], mpi: str | None = None) -> list[str]:
    argv = ["srun", f"--nodes={len(topology.hosts)}", f"--ntasks-per-node={topology.slots}", "--kill-on-bad-exit=1"]
    if mpi:
        argv.append(f"--mpi={mpi}")
    return [*argv, *command]
