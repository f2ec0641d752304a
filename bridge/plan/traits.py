"""What planning needs to know about each backend, declared once: the facts a plan is checked and shaped by,
keyed by cluster type, so that no planning step compares a backend's name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bridge.api.cluster import BridgeCluster

# What a plan may ask for, checked before any renderer runs (README "Security"): no renderer allocates in
# proportion to a number nobody checked. Nodes: Kubernetes supports clusters of at most 5,000 nodes (and a
# larger MPI hostfile no longer fits a ConfigMap); the local cluster emulates nodes as process groups on this
# machine; Slurm and Flux count nodes in 32-bit fields, and no machine they run has 100,000.
MAX_NODES_DEFAULT = 100_000
#: a time limit an HPC scheduler can hold (Slurm keeps minutes in 32 bits; ~68 years)
MAX_TIME_LIMIT_SECONDS = 2**31 - 1


@dataclass(frozen=True)
class BackendTraits:
    """The facts about one backend that planning reads. The defaults are an HPC scheduler's that takes
    hpc-bridge's batch artifacts but not sbatch's own options (a backend the table does not name)."""

    #: the most nodes one plan may ask for
    max_nodes: int = MAX_NODES_DEFAULT
    #: the longest time limit it holds; None: no bound beyond the TrainJob's own field
    max_time_limit_seconds: int | None = MAX_TIME_LIMIT_SECONDS
    #: it runs Kubeflow's objects as Kubeflow does (a JobSet of pods from images): the pod spec and runtime
    #: patches are honoured, the image's entrypoint runs when no command is given, the cluster's default image
    #: fills in, initializers run as the runtime's jobs, a gang policy needs the cluster's gang scheduler, Kueue
    #: queues apply and another controller may manage the TrainJob. Otherwise values land in batch directives, a
    #: jobspec or a local path, and what only Kubernetes honours is noted or refused
    runs_pods: bool = False
    #: sbatch's options are its own: passed through as written, a converted script's node layout kept; elsewhere
    #: each is mapped to a field, dropped with a note when it changes nothing, or refused
    takes_sbatch_options: bool = False
    #: a dependency names this backend's own job ids (afterok:<id>, hpc-bridge's grammar); otherwise Slurm's
    own_job_dependencies: bool = False
    #: whether a ``singleton`` dependency means anything here
    singleton_dependency: bool = True
    #: without a spec.stagingDir, initializers stage into hpc-bridge's state directory on this machine
    stages_on_this_machine: bool = False


#: the backends planning knows by cluster type; any other type gets ``BackendTraits()``
BACKEND_TRAITS: Mapping[str, BackendTraits] = {
    "local": BackendTraits(max_nodes=64, own_job_dependencies=True, stages_on_this_machine=True),
    "slurm": BackendTraits(takes_sbatch_options=True),
    # Flux's dependencies (RFC 26) are after, afterany, afterok and afternotok: no singleton
    "flux": BackendTraits(own_job_dependencies=True, singleton_dependency=False),
    "kubernetes": BackendTraits(max_nodes=5_000, max_time_limit_seconds=None, runs_pods=True,
                                own_job_dependencies=True),
}


def backend_traits(backend: str) -> BackendTraits:
    """The traits of the backend a cluster type (a plan's ``backend``) names."""
    return BACKEND_TRAITS.get(backend, BackendTraits())


def traits_of(cluster: BridgeCluster) -> BackendTraits:
    """The traits of *cluster*'s backend."""
    return backend_traits(cluster.spec.type)
