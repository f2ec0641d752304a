"""Which runtime and which cluster a TrainJob runs with, and the uid it runs under."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from bridge.annotations import CLUSTER_ANNOTATION
from bridge.api.cluster import BridgeCluster
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import TrainJob
from bridge.errors import InvalidSpec, did_you_mean
from bridge.plan.model import UID_NAMESPACE


def derive_uid(trainjob: TrainJob) -> str:
    """The TrainJob's uid, or for a file without one a uid derived from namespace/name.

    Deriving it (instead of a random one) is what makes ``submit`` of the same file idempotent and lets
    ``render`` print byte-for-byte what ``submit`` sends.
    """
    if trainjob.metadata.uid:
        return trainjob.metadata.uid
    return str(uuid.uuid5(UID_NAMESPACE, f"{trainjob.namespace}/{trainjob.name}"))


def find_runtime(trainjob: TrainJob, runtimes: Iterable[TrainingRuntime | ClusterTrainingRuntime],
                 ) -> TrainingRuntime | ClusterTrainingRuntime:
    """The runtime ``spec.runtimeRef`` names (namespaced TrainingRuntimes must share the TrainJob's namespace)."""
    ref = trainjob.spec.runtime_ref
    kind = ref.resolved_kind
    candidates = []
    for runtime in runtimes:
        if runtime.kind != kind or runtime.name != ref.name:
            continue
        if kind == "TrainingRuntime" and (runtime.metadata.namespace or "default") != trainjob.namespace:
            continue
        candidates.append(runtime)
    if not candidates:
        from bridge.api.catalog import builtin_runtime_names

        available = sorted({r.name for r in runtimes if r.kind == kind}
                           | {n for k, n in getattr(runtimes, "seen", ()) if k == kind}
                           | (set(builtin_runtime_names()) if kind == "ClusterTrainingRuntime" else set()))
        close = did_you_mean(ref.name, available)
        hint = (f"; {close}" if close else "") + (f"; known: {', '.join(available)}" if available else "")
        unreadable = getattr(runtimes, "unreadable", ())
        if unreadable:
            hint += f"; {len(unreadable)} runtime file(s) could not be read, the first: {unreadable[0]}"
        raise InvalidSpec("spec.runtimeRef.name", ref.name, f"no {kind} with this name{hint}")
    return candidates[-1]


def requested_cluster(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime | None, override: str | None, default: str) -> str:
    """The cluster name asked for: the explicit choice, else the TrainJob's annotation, else the runtime's,
    else *default*; ``auto`` asks the orchestration layer to place the job (bridge.placement)."""
    name = override
    if name is None:
        name = (trainjob.metadata.annotations or {}).get(CLUSTER_ANNOTATION)
    if name is None and runtime is not None:
        meta = runtime.metadata
        name = (meta.annotations or {}).get(CLUSTER_ANNOTATION) or (meta.labels or {}).get(CLUSTER_ANNOTATION)
    return name or default


def select_cluster(trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime | None,
                   clusters: Mapping[str, BridgeCluster], override: str | None = None,
                   default: str = "local", override_field: str = "--cluster") -> BridgeCluster:
    """The target cluster: the explicit choice, else the TrainJob's annotation, else the runtime's, else
    *default* (``local`` for the CLI; the operator's own). An unknown name is blamed on where it was written:
    *override_field* (how the caller's user gave *override*: a flag) or the annotation."""
    name = requested_cluster(trainjob, runtime, override, default)
    field = f"metadata.annotations[{CLUSTER_ANNOTATION}]"
    if not name:
        raise InvalidSpec(field, None, f"name the cluster to run on, on the TrainJob or its runtime; configured: "
                                       f"{', '.join(sorted(clusters)) or 'none'}")
    if name not in clusters:
        hint = did_you_mean(name, clusters)
        raise InvalidSpec(override_field if override else field, name,
                          f"no such cluster; {hint + ' ' if hint else ''}configured: {', '.join(sorted(clusters))}")
    return clusters[name]
