"""The shared staging cache of a cluster, as ``cache list`` and ``cache prune`` show it, and a job's stage step
as a live status line follows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bridge.errors import InvalidSpec
from bridge.service.targets import clusters

if TYPE_CHECKING:
    from bridge.plan import LaunchPlan
    from bridge.staging.cache import CacheEntry


def staging_dir(cluster_name: str | None) -> str:
    """A cluster's shared staging directory (default: the local cluster's, under the state dir), as this
    machine sees it: ``cache list``/``prune`` read it here, so on a remote cluster run them on a node that
    mounts it."""
    from bridge.plan import traits_of
    from bridge.records import state_root

    configured = clusters()
    name = cluster_name or "local"
    if name not in configured:
        raise InvalidSpec("--cluster", name, f"no such cluster; configured: {', '.join(sorted(configured))}")
    spec = configured[name].spec
    if spec.staging_dir:
        return spec.staging_dir
    if traits_of(configured[name]).stages_on_this_machine:
        return str(state_root() / "staging")
    raise InvalidSpec("--cluster", name, "this cluster has no spec.stagingDir (Kubernetes stages into each "
                      "job's initializer volume)")


def _entry_row(entry: CacheEntry) -> dict[str, Any]:
    import datetime as dt

    return {"key": entry.key, "uri": entry.uri, "version": entry.version, "bytes": entry.bytes,
            "files": entry.files, "path": str(entry.path),
            "lastUsed": dt.datetime.fromtimestamp(entry.last_used, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def cache_entries(directory: str) -> list[dict[str, Any]]:
    from bridge.staging.cache import StageCache

    return [_entry_row(entry) for entry in StageCache(directory).entries()]


def cache_prune(directory: str, older_than: float | None, dry_run: bool = False) -> list[dict[str, Any]]:
    from bridge.staging.cache import StageCache

    return [_entry_row(entry) for entry in StageCache(directory).prune(older_than, dry_run=dry_run)]


def staging_phase(plan: LaunchPlan, uid: str) -> Callable[[], dict[str, Any] | None] | None:
    """The phase document of job *uid*'s stage step (bridge.staging.phase) at each call: read from the
    stagingDir where the job stages on this machine (the local cluster), else as the backend's polls last read
    it through its transport (Slurm here, over SSH; Flux; not over slurmrestd, which has no shell to read it
    with); None for a plan that stages nothing there (no initializers, or Kubernetes' volumes)."""
    staging = plan.staging
    if staging is None or not staging.dir:
        return None
    from bridge.plan import backend_traits
    from bridge.staging.phase import read_phase, watch_phase

    directory, tenant = staging.dir, staging.tenant
    if not backend_traits(plan.backend).stages_on_this_machine:
        return watch_phase(directory, uid, tenant)
    return lambda: read_phase(directory, uid, tenant)
