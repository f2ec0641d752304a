"""Where a job's nodes meet (torchrun's master, the JAX coordinator, the XGBoost tracker) and whether they can.

The address handed to a framework must be one the other nodes reach. Slurm's node list names nodes by their
NodeName, which need not resolve anywhere: a node's address is its NodeAddr (several nodes of one machine,
a cluster without DNS for its node names). So on Slurm the launch asks ``scontrol show node`` once for node 0's
NodeAddr (every node's, for TF_CONFIG) and hands that out; an MPI hostfile keeps the names, since mpirun under
Slurm starts its daemons through srun, which takes names. Pods' names are DNS names; Flux's and the local
cluster's hosts are used as they are.

A meeting that cannot form must not hang a job: every node but node 0 probes the meeting point by TCP while its
framework starts, and when nothing has answered within HPCBRIDGE_RENDEZVOUS_TIMEOUT seconds (default 300,
JAX's own default; 0 turns the check off) it stops its framework and fails with one line naming the address,
the port and why. Its exit ends the job (srun --kill-on-bad-exit, a JobSet's failure policy).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence

from bridge.envnames import TF_ROLES_ENV
from bridge.errors import InvalidSpec

#: True for the type checker only (which reads any TYPE_CHECKING so): importing typing would add to the
#: start-up of every node of every job
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, NamedTuple

    from bridge.mpi.discovery import Topology
    from bridge.mpi.spec import LaunchSpec

    class _Meeting(NamedTuple):
        host: str
        port: int
        timeout: float
        what: str
        rank: int
else:
    _Meeting = namedtuple("Meeting", "host port timeout what rank")

#: seconds a node waits for the meeting point to answer before it fails the job; 0: never checked
RENDEZVOUS_TIMEOUT_ENV = "HPCBRIDGE_RENDEZVOUS_TIMEOUT"
DEFAULT_TIMEOUT = 300.0


class Meeting(_Meeting):
    """Where this node's framework meets node 0's (*host*:*port*, *what* listens there), for how long."""

    __slots__ = ()

    def failure(self, reason: str) -> str:
        return (f"hpcbridge launch: node {self.rank} cannot reach the rendezvous at {self.host}:{self.port} "
                f"({self.what} on node 0): {reason} after {self.timeout:g} s ({RENDEZVOUS_TIMEOUT_ENV})")


def needs_addresses(spec: LaunchSpec, env: Mapping[str, str]) -> bool:
    """Whether this launch hands a framework an address to meet at."""
    return spec.launcher == "torchrun" or spec.framework in ("jax", "xgboost") or bool(env.get(TF_ROLES_ENV))


def parse_node_addresses(text: str) -> dict[str, str]:
    """NodeName → NodeAddr from ``scontrol show node --oneliner`` (one node a line)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        addr = re.search(r"\sNodeAddr=(\S+)", line)
        if name and addr:
            found[name.group(1)] = addr.group(1)
    return found


def slurm_addresses(names: Sequence[str], env: Mapping[str, str],
                    run: Callable[..., subprocess.CompletedProcess[Any]] | None = None) -> dict[str, str]:
    """Each Slurm node's NodeAddr, in one query; {} when scontrol cannot tell (the names are then kept)."""
    import subprocess

    try:
        result = (run or subprocess.run)(["scontrol", "show", "node", "--oneliner", ",".join(names)],
                                         capture_output=True, text=True, check=False, env=dict(env), timeout=30)
    except (OSError, ValueError, subprocess.SubprocessError):  # not installed, or no answer in time
        return {}
    return parse_node_addresses(result.stdout) if result.returncode == 0 else {}


def with_addresses(spec: LaunchSpec, topology: Topology, env: Mapping[str, str],
                   run: Callable[..., subprocess.CompletedProcess[Any]] | None = None) -> Topology:
    """*topology* with the addresses its framework is handed: on Slurm each node's NodeAddr where it differs
    from the node's name (node 0's only, unless TF_CONFIG lists every node)."""
    if spec.discovery != "slurm" or not needs_addresses(spec, env):
        return topology
    names = list(dict.fromkeys(topology.hosts)) if env.get(TF_ROLES_ENV) else [topology.hosts[0]]
    found = slurm_addresses(names, env, run)
    if not found:
        return topology
    return topology._replace(addresses=tuple(found.get(host, host) for host in topology.hosts))


def timeout_from(env: Mapping[str, str]) -> float:
    value = env.get(RENDEZVOUS_TIMEOUT_ENV)
    if value is None or not value.strip():
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise InvalidSpec(RENDEZVOUS_TIMEOUT_ENV, value, "expected seconds, a number >= 0 (0: no check)")
    return seconds


def meeting(spec: LaunchSpec, topology: Topology, env: Mapping[str, str]) -> Meeting | None:
    """What this node checks before its framework may wait forever: node 0's torchrun master or JAX
    coordinator, seen from any other node. None on node 0, for other launches, or with the check off. Not the
    XGBoost tracker: it takes any connection for a worker's, and a probe's failed handshake would upset it."""
    if spec.launcher == "torchrun":
        what = "torchrun master"
    elif spec.framework == "jax":
        what = "JAX coordinator"
    else:
        return None
    timeout = timeout_from(env)
    if topology.rank == 0 or not timeout:
        return None
    return Meeting(topology.master, spec.rdzv_port, timeout, what, topology.rank)


def probe(host: str, port: int, timeout: float) -> str | None:
    """None when *host*:*port* accepts a TCP connection, else why not (the connection is closed at once)."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"{host} does not resolve"
    except OSError as exc:
        return (exc.strerror or str(exc) or type(exc).__name__).lower()


def await_meeting(point: Meeting, stopped: Callable[[], bool],
                  check: Callable[[str, int, float], str | None] = probe,
                  clock: Callable[[], float] | None = None, pause: Callable[[float], None] | None = None) -> str | None:
    """None once the meeting point answers (or the framework ended by itself: its own code tells); else, once
    *point.timeout* seconds have passed, the last reason it did not."""
    import time

    clock = clock or time.monotonic
    pause = pause or time.sleep
    deadline = clock() + point.timeout
    while True:
        left = deadline - clock()
        reason = check(point.host, point.port, min(2.0, max(0.1, left)))
        if reason is None or stopped():
            return None
        if clock() >= deadline:
            return reason
        pause(min(0.25, max(0.0, deadline - clock())))


def exit_if_unmet(point: Meeting | None, stopped: Callable[[], bool], stop: Callable[[], None]) -> int | None:
    """With a meeting point: wait for it; when it never answers, print the one line, *stop* the framework and
    give the node's exit code (1). None when the framework goes on."""
    if point is None:
        return None
    reason = await_meeting(point, stopped)
    if reason is None:
        return None
    import sys

    print(point.failure(reason), file=sys.stderr, flush=True)
    stop()
    return 1

