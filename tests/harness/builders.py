"""Objects the unit suites build over and over, built one way: import these instead of writing another."""

from __future__ import annotations

from bridge.api.cluster import API_VERSION, BridgeCluster


def cluster(kind: str = "slurm", name: str = "hpc", **spec) -> BridgeCluster:
    """A BridgeCluster of type *kind* named *name*; *spec* adds to its spec (``tenants=…``, ``defaults=…``)."""
    return BridgeCluster.model_validate({"apiVersion": API_VERSION, "kind": "BridgeCluster",
                                         "metadata": {"name": name}, "spec": {"type": kind, **spec}})
