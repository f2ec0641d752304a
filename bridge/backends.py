"""The backends hpc-bridge knows, by name: the one line a new backend adds.

A name here is a ``BridgeCluster`` ``spec.type`` (the schema and the generated CRD take their list from it) and
the adapter class the orchestration layer loads for a cluster of that type, as ``"module:class"``. It is text,
not an import, so that reading it costs nothing: the CLI imports only the backend it uses.
"""

from __future__ import annotations

#: backend name → "module:class"; importing a backend module must not import another backend's client
REGISTRY: dict[str, str] = {
    "local": "bridge.adapters.local:LocalAdapter",
    "slurm": "bridge.adapters.slurm:SlurmAdapter",
    "flux": "bridge.adapters.flux:FluxAdapter",
    "kubernetes": "bridge.adapters.kubernetes:KubernetesAdapter",
}
