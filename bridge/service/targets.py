"""The clusters jobs go to, and the adapter that speaks to each."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bridge.errors import InvalidSpec, did_you_mean
from bridge.service.retries import NO_RETRY, Retry

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, ClusterSize
    from bridge.api.cluster import BridgeCluster
    from bridge.tenancy import Request as TenantRequest


def clusters() -> dict[str, BridgeCluster]:
    """Configured clusters by name, the built-in ``local`` included."""
    from bridge.api.catalog import load_clusters

    return load_clusters()


def backend_cluster(backend: str) -> BridgeCluster:
    """A cluster of *backend* type with the documented defaults (``render --to``, ``convert --to``)."""
    from bridge.adapters import REGISTRY
    from bridge.api.cluster import BridgeCluster

    if backend not in REGISTRY:
        raise InvalidSpec("--to", backend, f"use one of {', '.join(REGISTRY)}")
    return BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                         "metadata": {"name": backend}, "spec": {"type": backend}})


def get_adapter(cluster: BridgeCluster) -> Adapter:
    from bridge.adapters import get_adapter as _get

    return _get(_defaults_for_this_machine(cluster))


def cluster_adapter(name: str | None) -> Adapter:
    """The adapter of a configured cluster: *name*, else $HPCBRIDGE_CLUSTER, else the only remote one."""
    configured = clusters()
    name = name or os.environ.get("HPCBRIDGE_CLUSTER")
    if not name:
        remote = [n for n, c in configured.items() if c.spec.type != "local"]
        if len(remote) != 1:
            raise InvalidSpec("--cluster", None, f"name the cluster; configured: {', '.join(sorted(configured))}")
        name = remote[0]
    if name not in configured:
        hint = did_you_mean(name, configured)
        raise InvalidSpec("--cluster", name, f"no such cluster; {hint + ' ' if hint else ''}configured: "
                                             f"{', '.join(sorted(configured))}")
    return get_adapter(configured[name])


def _defaults_for_this_machine(cluster: BridgeCluster) -> BridgeCluster:
    """Clusters whose jobs run where this hpc-bridge runs — the local cluster, and Flux reached without SSH —
    launch with this very interpreter and find ``flux`` where this process does, unless the config says
    otherwise: an entry that gives only a URI works as written (examples/clusters.yaml)."""
    spec = cluster.spec
    flux = spec.flux
    on_this_machine = spec.type == "local" or (spec.type == "flux" and not (flux and flux.host)
                                               and not (flux and flux.uri and flux.uri.startswith("ssh://")))
    if not on_this_machine:
        return cluster
    update: dict[str, Any] = {}
    if not spec.defaults.launch_command:
        update["defaults"] = spec.defaults.model_copy(
            update={"launch_command": [sys.executable, "-m", "bridge", "launch"]})
    if spec.type == "flux" and (flux is None or not os.path.isabs(flux.flux_command)):
        import shutil

        found = shutil.which(flux.flux_command if flux else "flux")
        if found:
            from bridge.api.cluster import FluxConnection

            update["flux"] = (flux or FluxConnection()).model_copy(update={"flux_command": found})
    return cluster.model_copy(update={"spec": spec.model_copy(update=update)}) if update else cluster


def tenant_adapter(cluster: BridgeCluster, request: TenantRequest,
                   adapter_for: Callable[[BridgeCluster], Adapter] | None = None) -> Adapter:
    """The adapter that acts for the tenant *request*'s namespace maps to on *cluster* (its identity, its
    credentials); InvalidSpec when the cluster maps no tenant to it."""
    from bridge import tenancy

    return (adapter_for or get_adapter)(tenancy.resolve(cluster, request)[1])


def check(cluster: BridgeCluster) -> str:
    return get_adapter(cluster).check()


def cluster_size(adapter: Adapter, retry: Retry = NO_RETRY) -> ClusterSize:
    """What the cluster behind *adapter* has in all and usable (nodes, CPUs, memory, GPUs; None where its backend
    cannot say): a virtual node's capacity."""
    return retry.call(adapter.size)
