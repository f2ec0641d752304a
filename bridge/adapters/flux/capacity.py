"""What a Flux instance could give a plan now: ``flux resource list``'s free and allocated resource sets
(R's short form, ``rank[0-1]/core[0-3],gpu0``) counted per rank against the plan's NodeNeed."""

from __future__ import annotations

import re
from collections.abc import Mapping

from bridge.adapters.base import Amounts, Capacity, ClusterSize, NodeNeed
from bridge.errors import BackendUnavailable

_TOKEN = re.compile(r"rank(?P<ranks>\d+|\[[\d,\-]+\])/(?P<children>.+)")
_CHILD = re.compile(r"(?P<kind>[a-z]+)(?P<ids>\d+|\[[\d,\-]+\])")


def _idset(text: str) -> list[int]:
    ids: list[int] = []
    for part in text.strip("[]").split(","):
        first, _, last = part.partition("-")
        ids.extend(range(int(first), int(last or first) + 1))
    return ids


def per_rank(rlist: str) -> dict[int, dict[str, int]]:
    """``rank[0-1]/core[0-1],gpu0 rank2/core[0-3]`` → {0: {core: 2, gpu: 1}, 1: {...}, 2: {core: 4}}."""
    counts: dict[int, dict[str, int]] = {}
    for token in rlist.split():
        match = _TOKEN.fullmatch(token)
        if not match:
            raise BackendUnavailable("flux", f"flux resource list printed a resource set it should not: {token!r}")
        children = {child.group("kind"): len(_idset(child.group("ids")))
                    for child in _CHILD.finditer(match.group("children"))}
        for rank in _idset(match.group("ranks")):
            for kind, number in children.items():
                counts.setdefault(rank, {})[kind] = counts.get(rank, {}).get(kind, 0) + number
    return counts


def count(states: Mapping[str, str], need: NodeNeed, whole_nodes: bool) -> Capacity:
    """*states*: the rlist of each state (free, allocated, down). A batch job (*whole_nodes*) takes its nodes
    exclusively, so only a rank with nothing allocated is free for it."""
    free = per_rank(states.get("free", ""))
    allocated = per_rank(states.get("allocated", ""))
    fitting = now = 0
    for rank in sorted(set(free) | set(allocated)):
        cores = free.get(rank, {}).get("core", 0) + allocated.get(rank, {}).get("core", 0)
        gpus = free.get(rank, {}).get("gpu", 0) + allocated.get(rank, {}).get("gpu", 0)
        if cores < need.cpus or gpus < need.gpus:
            continue
        fitting += 1
        if whole_nodes and rank in allocated:
            continue
        if free.get(rank, {}).get("core", 0) >= need.cpus and free.get(rank, {}).get("gpu", 0) >= need.gpus:
            now += 1
    down = len(per_rank(states.get("down", "")))
    how = "whole nodes" if whole_nodes else "cores on nodes"
    return Capacity(now, fitting, f"{now} of {fitting + down} ranks free ({how}) for {need.text().split(', ')[0]}"
                                  f"{', ' + str(need.gpus) + ' GPU' if need.gpus else ''}"
                                  f"{f'; {down} down' if down else ''}")


def size(states: Mapping[str, str]) -> ClusterSize:
    """The instance's ranks, cores and GPUs, in all (free, allocated and down) and usable (free or allocated).
    ``flux resource list`` counts no memory: it stays unknown."""
    by_state = {state: per_rank(states.get(state, "")) for state in ("free", "allocated", "down")}

    def amounts(names: tuple[str, ...]) -> Amounts:
        ranks: dict[int, dict[str, int]] = {}
        for name in names:
            for rank, counts in by_state[name].items():
                for kind, number in counts.items():
                    ranks.setdefault(rank, {})[kind] = ranks.get(rank, {}).get(kind, 0) + number
        return Amounts(len(ranks), sum(c.get("core", 0) for c in ranks.values()), None,
                       sum(c.get("gpu", 0) for c in ranks.values()))

    usable = amounts(("free", "allocated"))
    total = amounts(("free", "allocated", "down"))
    return ClusterSize(total, usable, f"flux resource list: {usable.nodes} of {total.nodes} ranks up; no memory "
                                      "counted")
