"""Who are my peers and which one am I: read from what the scheduler put in the environment.

Each source returns a ``Topology``; nothing here starts processes. Recorded environments in the unit
tests pin every source.
"""

from __future__ import annotations

import os
import re
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence

from bridge.errors import InvalidSpec
from bridge.mpi.hostfile import Peer

#: True for the type checker only (which reads any TYPE_CHECKING so): importing typing would add to the
#: start-up of every node of every job
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, NamedTuple

    class _Topology(NamedTuple):
        hosts: tuple[str, ...]
        rank: int
        slots: int
        addresses: tuple[str, ...] = ()
else:
    _Topology = namedtuple("Topology", "hosts rank slots addresses", defaults=((),))

SOURCES = ("slurm", "flux", "jobset", "hostfile", "explicit", "local")


class Topology(_Topology):
    """The job's hosts in rank order (tuple of names), this node's rank, the slots on every host, and where
    the hosts' addresses differ from their names (bridge.mpi.rendezvous), those addresses in the same order."""

    __slots__ = ()

    @property
    def peers(self) -> list[Peer]:
        return [Peer(host, self.slots) for host in self.hosts]

    def address(self, rank: int) -> str:
        """How the other nodes reach node *rank*: its address where one is known, else its name."""
        return self.addresses[rank] if self.addresses else self.hosts[rank]

    @property
    def master(self) -> str:
        """Node 0's address: where torchrun's master, the JAX coordinator and the XGBoost tracker listen."""
        return self.address(0)


def parse_tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed SLURM_TASKS_PER_NODE, e.g. ``2(x3),1`` → [2, 2, 2, 1]."""
    counts: list[int] = []
    for position, item in enumerate(text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            raise InvalidSpec("SLURM_TASKS_PER_NODE", text, f"cannot parse item {position + 1} ({item!r})")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _env_int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None or not value.strip().isdigit():
        raise InvalidSpec(name, value, "expected a non-negative integer from the scheduler's environment")
    return int(value)


def from_slurm(env: Mapping[str, str], slots: int) -> Topology:
    from bridge.mpi.hostlist import expand

    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise InvalidSpec("SLURM_JOB_NODELIST", None, "not inside a Slurm allocation")
    hosts = tuple(expand(nodelist))
    rank = _env_int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    return Topology(hosts, rank, slots)


def from_flux(env: Mapping[str, str], slots: int,
              run: Callable[..., subprocess.CompletedProcess[Any]] | None = None) -> Topology:
    from bridge.mpi.hostlist import expand

    if run is None:
        import subprocess

        run = subprocess.run

    # Inside a batch/alloc subinstance the instance's hostlist is the allocation.
    result = run(["flux", "getattr", "hostlist"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise InvalidSpec("FLUX_URI", env.get("FLUX_URI"), f"flux getattr hostlist failed: {result.stderr.strip()}")
    hosts = tuple(expand(result.stdout.strip()))
    rank = _env_int(env, "FLUX_TASK_RANK") if "FLUX_TASK_RANK" in env else 0
    return Topology(hosts, rank, slots)


def from_hostfile(path: str, slots: int, rank: int | None, own_host: str | None = None) -> Topology:
    """A Kubeflow-style hostfile (``host slots=N`` or ``host:N``); rank from the flag or our hostname."""
    hosts: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            if line:
                hosts.append(re.split(r"[\s:]", line, maxsplit=1)[0])
    if not hosts:
        raise InvalidSpec("hostfile", path, "has no hosts")
    return Topology(tuple(hosts), rank if rank is not None else _rank_of(hosts, own_host), slots)


def from_jobset(env: Mapping[str, str], slots: int, nodes: int, hostname: str | None = None,
                subdomain: str | None = None, hosts: Sequence[str] = (), hostfile: str | None = None,
                leader: str | None = None) -> Topology:
    """A JobSet's pods, named ``<jobset>-<rjob>-<jobIndex>-<podIndex>``.

    The peers are the *hosts* the renderer listed, else the hostfile ConfigMap (``/etc/mpi/hostfile``), else
    the pod-name pattern of this pod's own replicated job (``nodes`` pods; rank = the Job's completion index).
    *leader* (the MPI launcher's pod) is moved first: rank 0 starts the launcher, wherever the hostfile lists it.
    Otherwise the rank is this pod's place among the peers.
    """
    hostname = hostname or _hostname()
    listed: list[str] = list(hosts)
    if not listed and hostfile:
        listed = list(from_hostfile(hostfile, slots, 0).hosts)
    if not listed:
        match = re.fullmatch(r"(?P<prefix>.+)-(?P<job>\d+)-(?P<pod>\d+)", hostname.split(".")[0])
        if not match:
            raise InvalidSpec("hostname", hostname, "not a JobSet pod hostname <jobset>-<job>-<jobIndex>-<podIndex>")
        prefix = match.group("prefix")
        jobset = env.get("JOBSET_NAME") or prefix.rsplit("-", 1)[0]
        domain = subdomain or jobset
        listed = [f"{prefix}-{match.group('job')}-{i}.{domain}" for i in range(nodes)]
        if not leader:
            rank = _env_int(env, "JOB_COMPLETION_INDEX") if "JOB_COMPLETION_INDEX" in env else int(match.group("pod"))
            return Topology(tuple(listed), rank, slots)
    if leader:
        short = leader.split(".")[0]
        first = next((host for host in listed if host == leader or host.split(".")[0] == short), None)
        if first is None:
            raise InvalidSpec("--leader", leader, f"is not among the peers {listed[:8]}")
        listed.remove(first)
        listed.insert(0, first)
    return Topology(tuple(listed), _rank_of(listed, hostname), slots)


def explicit(hosts: Sequence[str], slots: int, rank: int | None, own_host: str | None = None) -> Topology:
    if not hosts:
        raise InvalidSpec("--host", None, "explicit discovery needs at least one --host")
    return Topology(tuple(hosts), rank if rank is not None else _rank_of(hosts, own_host), slots)


def local(nodes: int, slots: int, rank: int | None, env: Mapping[str, str]) -> Topology:
    if rank is None:
        rank = _env_int(env, "HPCBRIDGE_NODE_RANK") if "HPCBRIDGE_NODE_RANK" in env else 0
    return Topology(tuple(["localhost"] * nodes), rank, slots)


def _hostname() -> str:
    """This host's name (socket.gethostname without importing socket: it is the kernel's nodename)."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket

    return socket.gethostname()


def _rank_of(hosts: Sequence[str], own_host: str | None) -> int:
    own = own_host or _hostname()
    candidates = {own, own.split(".")[0]}
    for index, host in enumerate(hosts):
        if host in candidates or host.split(".")[0] in candidates:
            return index
    raise InvalidSpec("--node-rank", None, f"this host ({own}) is not among the peers {list(hosts)[:8]}; pass --node-rank")


def discover(source: str, *, slots: int, nodes: int | None = None, hosts: Sequence[str] = (),
             rank: int | None = None, hostfile: str | None = None, env: Mapping[str, str] | None = None,
             leader: str | None = None) -> Topology:
    env = os.environ if env is None else env
    if source == "slurm":
        topology = from_slurm(env, slots)
    elif source == "flux":
        topology = from_flux(env, slots)
    elif source == "jobset":
        topology = from_jobset(env, slots, nodes or 1, hosts=hosts, hostfile=hostfile, leader=leader)
    elif source == "hostfile":
        topology = from_hostfile(hostfile or "/etc/mpi/hostfile", slots, rank)
    elif source == "explicit":
        topology = explicit(hosts, slots, rank)
    elif source == "local":
        topology = local(nodes or 1, slots, rank, env)
    else:
        raise InvalidSpec("--discovery", source, f"unknown source; use one of {', '.join(SOURCES)}")
    if nodes is not None and len(topology.hosts) != nodes:
        raise InvalidSpec("--nodes", nodes, f"the {source} allocation has {len(topology.hosts)} hosts")
    if not 0 <= topology.rank < len(topology.hosts):
        raise InvalidSpec("node rank", topology.rank, f"outside 0..{len(topology.hosts) - 1}")
    return topology
