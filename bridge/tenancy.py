"""Tenants: which HPC identity a Kubernetes namespace's TrainJobs run as, and what they may ask for.

The operator serves many namespaces on one shared HPC system. The cluster admin who writes a BridgeCluster is
trusted; namespace tenants and what their TrainJobs say are not. A BridgeCluster maps namespaces to tenants
(``spec.tenants``: a Unix user, its accounts, partitions and QOS, its credentials), or serves an explicit list
of namespaces under its own single identity (``spec.allowedNamespaces``). Everything else is refused, and
nothing is submitted for it.

A tenant's identity reaches the adapters as a cluster overlay (``as_tenant``): the same BridgeCluster with the
tenant's user and credentials in its connection, so every command for the tenant's jobs (submit, find,
cancel, logs) runs as that user and the backend itself keeps tenants apart. The CLI never goes through here: it
runs as the Unix user who types it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bridge.annotations import PREFIX, SBATCH_PASSTHROUGH_PREFIX, TENANT_LABEL
from bridge.api.cluster import BridgeCluster, Tenant
from bridge.errors import InvalidSpec

#: sbatch options a TrainJob from Kubernetes may pass through (``hpcbridge.io/sbatch.<option>``): those that
#: shape the job inside what its identity and mapping already allow. Anything that picks where or as whom it
#: runs (--clusters, --reservation, --nodelist, --account, --uid…), what it reads or exports (--input,
#: --export-file, --container, --chdir) or who is told (--mail-user) is refused. The CLI keeps every option.
TENANT_SBATCH_OPTIONS = frozenset({
    "begin", "cores-per-socket", "cpu-freq", "deadline", "distribution", "gres-flags", "hint",
    "kill-on-invalid-dep", "mail-type", "mem-bind", "mincpus", "nice", "no-requeue", "open-mode", "requeue",
    "signal", "sockets-per-node", "spread-job", "threads-per-core", "time-min", "tmp",
})


@dataclass(frozen=True)
class Request:
    """Where a TrainJob comes from when the operator runs it: its namespace and that namespace's labels."""

    namespace: str
    labels: Mapping[str, str] | None = None


def tenant_for(cluster: BridgeCluster, request: Request) -> Tenant:
    """The tenant *request*'s namespace is on *cluster*; InvalidSpec (field ``metadata.namespace``) when none.

    A namespace in ``allowedNamespaces`` is a tenant of its own name with the cluster's identity and the
    cluster's ``accountMapping`` account."""
    namespace = request.namespace
    if cluster.spec.type == "local":
        raise InvalidSpec(f"BridgeCluster {cluster.name}: spec.type", "local",
                          "the operator never runs a local cluster: tenant code would run inside the operator's pod, "
                          "next to its credentials")
    for tenant in cluster.spec.tenants or ():
        if tenant.maps(namespace, dict(request.labels or {})):
            return tenant
    allowed = cluster.spec.allowed_namespaces
    if cluster.spec.tenants is None and allowed is not None and namespace in allowed:
        account = (cluster.spec.account_mapping or {}).get(namespace)
        return Tenant.model_validate({"name": namespace, "namespaces": [namespace],
                                      "accounts": [account] if account else []})
    if cluster.spec.tenants is None and allowed is None:
        why = "serves no namespace: it has neither spec.tenants nor spec.allowedNamespaces"
    else:
        why = "maps no tenant to this namespace (spec.tenants" + \
              (", spec.allowedNamespaces)" if allowed is not None else ")")
    raise InvalidSpec("metadata.namespace", namespace, f"cluster {cluster.name!r} {why}")


def as_tenant(cluster: BridgeCluster, tenant: Tenant) -> BridgeCluster:
    """*cluster* as *tenant*'s identity sees it: its user and credentials in the connection, its target
    namespace on Kubernetes. A tenant of the cluster's own identity (``allowedNamespaces``) changes nothing but
    the label."""
    spec = cluster.spec
    update: dict[str, Any] = {}
    credentials = tenant.credentials
    if spec.slurm is not None and tenant.user:
        conn: dict[str, Any] = {"user": tenant.user}
        if credentials and credentials.key_secret_ref:
            conn |= {"key_secret_ref": credentials.key_secret_ref, "key_file": None}
        if credentials and credentials.token_secret_ref:
            conn |= {"token_secret_ref": credentials.token_secret_ref, "token_file": None}
        update["slurm"] = spec.slurm.model_copy(update=conn)
    elif spec.type == "slurm" and tenant.user:
        from bridge.api.cluster import SlurmConnection

        update["slurm"] = SlurmConnection(user=tenant.user)
    if spec.type == "kubernetes":
        from bridge.api.cluster import KubernetesConnection

        kube = spec.kubernetes or KubernetesConnection()
        # a JobSet runs in the TrainJob's own namespace unless the admin maps the tenant elsewhere
        namespace = tenant.target_namespace or (tenant.namespaces[0] if len(tenant.namespaces) == 1 and
                                                tenant.namespace_selector is None else None)
        update["kubernetes"] = kube.model_copy(update={"namespace": namespace})
    labels = {**(cluster.metadata.labels or {}), TENANT_LABEL: tenant.name}
    return cluster.model_copy(update={"spec": spec.model_copy(update=update),
                                      "metadata": cluster.metadata.model_copy(update={"labels": labels})})


def resolve(cluster: BridgeCluster, request: Request) -> tuple[Tenant, BridgeCluster]:
    """The tenant *request*'s namespace is on *cluster*, and the cluster as that tenant acts on it
    (``tenant_for``, then ``as_tenant``)."""
    tenant = tenant_for(cluster, request)
    return tenant, as_tenant(cluster, tenant)


def tenant_of(cluster: BridgeCluster) -> str | None:
    """The tenant an overlay cluster acts for (``as_tenant``); None for a cluster as configured."""
    return (cluster.metadata.labels or {}).get(TENANT_LABEL)


def check_passthrough(option: str, value: str, tenant: Tenant) -> None:
    """An ``hpcbridge.io/sbatch.<option>`` from a tenant's TrainJob: only the documented allowlist."""
    if option not in TENANT_SBATCH_OPTIONS:
        raise InvalidSpec(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}{option}]", value,
                          f"--{option} is not among the sbatch options a TrainJob from Kubernetes may pass (tenant "
                          f"{tenant.name}); allowed: {', '.join(sorted(TENANT_SBATCH_OPTIONS))}")


def choose(knob: str, asked: str | None, allowed: list[str], default: str | None, tenant: Tenant,
           cluster: BridgeCluster) -> str | None:
    """A tenant's account, partition or QOS: one of *allowed* (the first by default), else the cluster's
    *default* with no choice."""
    where = f"metadata.annotations[{PREFIX}{knob}]"
    if allowed:
        if asked is None:
            return allowed[0]
        if asked not in allowed:
            raise InvalidSpec(where, asked, f"tenant {tenant.name} on cluster {cluster.name!r} may use "
                                            f"{', '.join(allowed)}")
        return asked
    if asked is not None and asked != default:
        raise InvalidSpec(where, asked, f"tenant {tenant.name} on cluster {cluster.name!r} has no {knob} to choose"
                                        + (f" (it runs with {default})" if default else ""))
    return default
