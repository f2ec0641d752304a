"""What a Slurm cluster could give a plan now: one ``sinfo`` (or slurmrestd's nodes and partitions) read
into rows, one per node and partition, and counted against the plan's NodeNeed."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from bridge.adapters.base import Amounts, Capacity, ClusterSize, NodeNeed
from bridge.annotations import PARTITION_ANNOTATION
from bridge.errors import BackendUnavailable

#: sinfo -O fields, each ended by "|" (Slurm >= 20.11 takes a separator after the colon)
FIELDS = ("NodeList", "Partition", "StateCompact", "CPUsState", "Memory", "AllocMem", "Gres", "GresUsed", "Time",
          "Available", "Size")
SINFO = ["sinfo", "--noheader", "--Node", "--Format", ",".join(f"{field}:|" for field in FIELDS)]
#: node states whose jobs may start there later (busy), and now (idle; mixed where enough is free)
_SCHEDULABLE = {"idle", "mix", "mixed", "alloc", "allocated", "comp", "completing", "resv", "reserved", "plnd",
                "planned"}
_STARTS_NOW = {"idle", "mix", "mixed"}
_GPU_ITEM = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


class NodeRow(NamedTuple):
    node: str
    partition: str
    default: bool
    state: str
    idle_cpus: int
    cpus: int
    memory_mib: int
    alloc_memory_mib: int
    gpus: int
    used_gpus: int
    #: the partition's time limit in seconds (None: unlimited) and most nodes per job (None: unlimited)
    time_limit: int | None
    max_nodes: int | None
    partition_up: bool


def _gpus(text: str) -> int:
    """GPUs in a gres string: ``gpu:a100:2``, ``gpu:2(S:0-1)``, ``gpu:a100:0(IDX:N/A)``; 0 for ``(null)``."""
    return sum(int(match.group(1)) for item in text.split(",") if (match := _GPU_ITEM.match(item.strip())))


def _time_limit(text: str) -> int | None:
    """sinfo's ``infinite``, ``D-HH:MM:SS``, ``HH:MM:SS`` or ``MM:SS``."""
    text = text.strip()
    if text in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def parse(text: str) -> list[NodeRow]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) < len(FIELDS):
            raise BackendUnavailable("slurm", f"sinfo printed a line it should not: {line[:120]!r}")
        node, partition, state, cpu_state, memory, alloc_memory, gres, gres_used, limit, available, size = \
            (cell.strip() for cell in cells[:len(FIELDS)])
        try:
            _, idle, _, total = (int(part) for part in cpu_state.split("/"))
            max_nodes = size.split("-")[-1]
            rows.append(NodeRow(node, partition.rstrip("*"), partition.endswith("*"), state.rstrip("*~#!%$@^-+").lower(),
                                idle, total, int(memory or 0), int(alloc_memory or 0), _gpus(gres), _gpus(gres_used),
                                _time_limit(limit), None if max_nodes in ("infinite", "") else int(max_nodes),
                                available == "up"))
        except ValueError:
            raise BackendUnavailable("slurm", f"sinfo printed a line it should not: {line[:120]!r}") from None
    return rows


def count(rows: Sequence[NodeRow], need: NodeNeed, nodes: int, partition: str | None,
          time_limit: int | None) -> Capacity:
    """Nodes of the plan's partition (else the default one) that fit one of its nodes, now and at all."""
    name = partition or next((row.partition for row in rows if row.default), None)
    if name is None and rows:
        return Capacity(0, 0, "the cluster does not say which partition is its default (slurmrestd v0.0.40 to "
                              f"v0.0.42 do not); name one ({PARTITION_ANNOTATION} or the cluster's "
                              "defaults.partition)")
    mine = [row for row in rows if row.partition == name]
    if not mine:
        known = sorted({row.partition for row in rows})
        return Capacity(0, 0, f"no partition {name!r} (partitions: {', '.join(known) or 'none'})",
                        limit=f"no partition {name!r}")
    first = mine[0]
    limit = None
    if not first.partition_up:
        limit = f"partition {name} is not up"
    elif first.time_limit is not None and time_limit is not None and time_limit > first.time_limit:
        limit = f"partition {name} allows {first.time_limit}s, the job asks {time_limit}s"
    elif first.max_nodes is not None and nodes > first.max_nodes:
        limit = f"partition {name} allows {first.max_nodes} nodes per job, the job asks {nodes}"
    fitting = [row for row in mine if row.state in _SCHEDULABLE and row.cpus >= need.cpus and row.gpus >= need.gpus
               and (need.memory_mib is None or row.memory_mib >= need.memory_mib)]
    free = [row for row in fitting if row.state in _STARTS_NOW and row.idle_cpus >= need.cpus
            and row.gpus - row.used_gpus >= need.gpus
            and (need.memory_mib is None or row.memory_mib - row.alloc_memory_mib >= need.memory_mib)]
    detail = f"partition {name}: {len(free)} of {len(mine)} nodes free for {need.text()}"
    return Capacity(len(free), len(fitting), detail, limit)


def beyond_partition(rows: Sequence[NodeRow], need: NodeNeed, nodes: int, partition: str | None,
                     time_limit: int | None) -> str | None:
    """Which of its partition's limits the job exceeds (more nodes or CPUs than the partition has, more time or
    nodes per job than it allows), else None. Where the cluster does not enforce partition limits at submission
    (EnforcePartLimits=NO, Slurm's default) sbatch queues such a job to pend, where one within them that no node
    could take is refused."""
    name = partition or next((row.partition for row in rows if row.default), None)
    mine = [row for row in rows if row.partition == name]
    if not mine:
        return None
    if nodes > len(mine):
        return f"partition {name} has {len(mine)} nodes, the job asks {nodes}"
    if need.cpus * nodes > sum(row.cpus for row in mine):
        return f"partition {name} has {sum(row.cpus for row in mine)} CPUs, the job asks {need.cpus * nodes}"
    return count(rows, need, nodes, partition, time_limit).limit


def size(rows: Sequence[NodeRow], source: str) -> ClusterSize:
    """The cluster's nodes, CPUs, memory and GPUs, each node once (sinfo prints a node once per partition);
    usable: the nodes whose jobs may start there (idle, mixed, allocated...), not down, drained or failed."""
    nodes = {row.node: row for row in rows}

    def amounts(chosen: list[NodeRow]) -> Amounts:
        return Amounts(len(chosen), sum(row.cpus for row in chosen), sum(row.memory_mib for row in chosen),
                       sum(row.gpus for row in chosen))

    usable = [row for row in nodes.values() if row.state in _SCHEDULABLE]
    return ClusterSize(amounts(list(nodes.values())), amounts(usable),
                       f"{source}: {len(usable)} of {len(nodes)} nodes usable")


def rest_rows(nodes: Iterable[dict[str, Any]], partitions: Iterable[dict[str, Any]]) -> list[NodeRow]:
    """slurmrestd v0.0.38's nodes and partitions as the rows sinfo gives."""
    info = {}
    default = None
    for part in partitions:
        name = part.get("name", "")
        flags = [flag.lower() for flag in part.get("flags", [])]
        if "default" in flags:
            default = name
        maximum = (part.get("maximum_time") if isinstance(part.get("maximum_time"), int) else None)
        nodes_max = part.get("max_nodes") if isinstance(part.get("max_nodes"), int) else None
        info[name] = (None if maximum in (None, -1) or maximum > 10**9 else maximum * 60,
                      None if nodes_max in (None, -1) or nodes_max > 10**9 else nodes_max,
                      "up" in str(part.get("state", "up")).lower())
    rows = []
    for node in nodes:
        state = str(node.get("state", "")).lower()
        for name in node.get("partitions", []):
            limit, max_nodes, up = info.get(name, (None, None, True))
            cpus = int(node.get("cpus", 0))
            rows.append(NodeRow(node.get("name", ""), name, name == default, state,
                                int(node.get("idle_cpus", cpus - int(node.get("alloc_cpus", 0)))), cpus,
                                int(node.get("real_memory", 0)), int(node.get("alloc_memory", 0)),
                                _gpus(node.get("gres", "")), _gpus(node.get("gres_used", "")), limit, max_nodes, up))
    return rows
