"""``--cluster auto``: the configured cluster that can start a TrainJob soonest, and why each other is not it.

Every candidate resolves the TrainJob for itself (a cluster that cannot run it at all says why, by the same
InvalidSpec a submit there would raise) and answers one batched capacity query (Adapter.capacity), all at once.
A cluster with enough free nodes for the job starts it now; among those, the one with the most free nodes to
spare wins (load spreads; configuration order breaks ties). Otherwise the job waits where the fewest nodes are
missing. The built-in local cluster is a candidate only when no other is configured: auto means a real cluster.
Part of the orchestration layer: the CLI and the operator reach it through service.prepare.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from bridge.api.cluster import BridgeCluster
from bridge.errors import BackendRejected, BackendUnavailable, InvalidSpec

#: what *assess* makes of a cluster: anything with the cluster's ``adapter`` and the job's ``plan`` there
Assessed = TypeVar("Assessed")



class _Capacity(Protocol):
    """What is read of an adapter's answer (bridge.adapters.base.Capacity, a layer above)."""

    @property
    def free(self) -> int: ...
    @property
    def fitting(self) -> int: ...
    @property
    def detail(self) -> str: ...
    @property
    def limit(self) -> str | None: ...


#: the cluster name that asks for placement (``--cluster auto``, or the annotation on a TrainJob or runtime)
AUTO = "auto"


@dataclass(frozen=True)
class Candidate:
    cluster: str
    backend: str
    #: "starts now", "waits", "cannot run" or "unreachable"
    verdict: str
    reason: str
    #: for ranking: the free nodes left over when it starts now, the nodes missing when it waits
    spare: int = 0
    missing: int = 0

    @property
    def eligible(self) -> bool:
        return self.verdict in ("starts now", "waits")

    def line(self) -> str:
        return f"{self.cluster} ({self.backend}): {self.verdict} — {self.reason}"


def _judge(name: str, cluster: BridgeCluster, assess: Callable[[BridgeCluster], Any]) -> tuple[Candidate, Any]:
    backend = cluster.spec.type
    try:
        assessed = assess(cluster)
    except InvalidSpec as exc:
        return Candidate(name, backend, "cannot run", str(exc)), None
    try:
        capacity = assessed.adapter.capacity(assessed.plan)
    except (BackendUnavailable, BackendRejected) as exc:
        return Candidate(name, backend, "unreachable", str(exc)), None
    return _verdict(name, backend, assessed.plan.nodes, capacity), assessed


def _verdict(name: str, backend: str, nodes: int, capacity: _Capacity) -> Candidate:
    if capacity.limit:
        return Candidate(name, backend, "cannot run", f"{capacity.limit}; {capacity.detail}")
    if capacity.fitting < nodes:
        return Candidate(name, backend, "cannot run", f"needs {nodes} nodes, {capacity.fitting} could ever take one; "
                                                      f"{capacity.detail}")
    if capacity.free >= nodes:
        return Candidate(name, backend, "starts now", f"needs {nodes}; {capacity.detail}", spare=capacity.free - nodes)
    return Candidate(name, backend, "waits", f"needs {nodes}; {capacity.detail}", missing=nodes - capacity.free)


def place(clusters: Mapping[str, BridgeCluster],
          assess: Callable[[BridgeCluster], Assessed]) -> tuple[Assessed, list[Candidate]]:
    """What *assess* made of the chosen cluster, and every candidate, best first. *assess* gives an object with
    the cluster's ``adapter`` and the job's ``plan`` there (or raises InvalidSpec where the job cannot run);
    the capacity queries run in parallel."""
    names = [name for name, cluster in clusters.items() if cluster.spec.type != "local"] or list(clusters)
    if not names:
        raise InvalidSpec("--cluster", AUTO, "no clusters are configured to choose from")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
        results = dict(zip(names, pool.map(lambda name: _judge(name, clusters[name], assess), names), strict=True))
    order = {name: index for index, name in enumerate(names)}
    judged = sorted((candidate for candidate, _ in results.values()),
                    key=lambda c: (not c.eligible, c.verdict != "starts now", c.missing, -c.spare, order[c.cluster]))
    best = judged[0]
    if not best.eligible:
        raise InvalidSpec("--cluster", AUTO, "no configured cluster can run this job: "
                          + "; ".join(c.line() for c in judged))
    return results[best.cluster][1], judged


def notes(judged: list[Candidate]) -> tuple[str, ...]:
    """What ``--dry-run`` (and submit) print: the choice, then every candidate with its reason."""
    return (f"placement: chose {judged[0].cluster} ({judged[0].verdict})",
            *(f"placement: candidate {c.line()}" for c in judged))
