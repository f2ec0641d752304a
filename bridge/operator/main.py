"""kopf wiring: watch TrainJobs whose ``spec.managedBy`` is hpc-bridge's and hand them to the Reconciler.

Handlers are thin: kopf keeps a finalizer on every such TrainJob (so deleting one cancels its backend job
first), retries what the Reconciler calls temporary and stops on what it calls permanent. kopf's own progress
and diff-base go into ``operator.hpcbridge.io`` annotations, since the Trainer CRD's status schema has no room for them.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bridge.annotations import CLUSTER_ANNOTATION, FINALIZER, MIGRATE_ANNOTATION, OPERATOR_PREFIX
from bridge.api.trainjob import MANAGED_BY_BRIDGE
from bridge.errors import InvalidSpec
from bridge.extras import MissingExtra
from bridge.operator import kubelet_api, leader, memory, versions
from bridge.operator.kube import TRAINER_GROUP, TRAINER_VERSION, KubeApi
from bridge.operator.metrics import Metrics, read_token
from bridge.operator.reconciler import Permanent, Reconciler, Temporary
from bridge.operator.sync import Timing

try:
    import kopf
    import kubernetes  # noqa: F401 - imported here only to fail before start-up: KubeApi imports it when it starts
except ImportError:
    raise MissingExtra("operator", "the operator") from None

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

_reconciler: Reconciler | None = None


def _names_a_cluster(meta: kopf.Meta) -> str | None:
    return ((meta.get("annotations") or {}).get(CLUSTER_ANNOTATION) or
            (meta.get("labels") or {}).get(CLUSTER_ANNOTATION))


@kopf.index(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes")
def cluster_runtimes(name: str, meta: kopf.Meta, **_: Any) -> dict[str, str] | None:
    """ClusterTrainingRuntimes that name a BridgeCluster: name -> cluster."""
    cluster = _names_a_cluster(meta)
    return {name: cluster} if cluster else None


@kopf.index(TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes")
def namespaced_runtimes(name: str, namespace: str | None, meta: kopf.Meta,
                        **_: Any) -> dict[tuple[str | None, str], str] | None:
    """TrainingRuntimes that name a BridgeCluster: (namespace, name) -> cluster."""
    cluster = _names_a_cluster(meta)
    return {(namespace, name): cluster} if cluster else None


def _ours(spec: kopf.Spec, meta: kopf.Meta, namespace: str | None, **indexes: Any) -> bool:
    """hpc-bridge's TrainJobs: ``spec.managedBy: hpcbridge.io/bridge``; or, with no managedBy at all (the Kubeflow
    SDK cannot set it; upstream Trainer's CRD would have defaulted it to Trainer's own), one that names a
    BridgeCluster itself or through its runtime."""
    # kopf passes the indexes above by name among its keyword arguments
    cluster_runtimes: kopf.Index[Any, str] = indexes["cluster_runtimes"]
    namespaced_runtimes: kopf.Index[Any, str] = indexes["namespaced_runtimes"]
    managed_by = spec.get("managedBy")
    if managed_by == MANAGED_BY_BRIDGE:
        return True
    if managed_by:
        return False
    if _names_a_cluster(meta):
        return True
    ref = spec.get("runtimeRef") or {}
    if ref.get("kind") == "TrainingRuntime":
        return bool(namespaced_runtimes.get((namespace, ref.get("name"))))
    return bool(cluster_runtimes.get(ref.get("name")))


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    prefix = OPERATOR_PREFIX.rstrip("/")
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=prefix,
                                                                            key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own Events say what happened; kopf's only its failures
    # handlers that wait on one cluster's group commit go out in one group with one lookup by uid: with more of
    # them at once, a restart with thousands of TrainJobs asks each backend fewer times (each lookup lists
    # every job of the backend's user, so the restart's cost is lookups times jobs)
    settings.execution.max_workers = 64
    settings.watching.server_timeout = 300
    # the initial listing (and each re-list after a watch expires) read in pages: with thousands of TrainJobs one
    # unpaged list holds every body at once, and the heap it grew stays the process's
    settings.watching.chunk_size = 500
    settings.batching.batch_window = 0.01  # kopf waits this long for more events of an object (default 0.1 s)


def _call(fn: Callable[[dict[str, Any]], Mapping[str, str | None] | None], body: dict[str, Any],
          patch: kopf.Patch | None = None) -> None:
    try:
        annotations = fn(body)
    except Temporary as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from None
    except Permanent as exc:
        raise kopf.PermanentError(str(exc)) from None
    if annotations and patch is not None:  # written with kopf's own patch of the TrainJob
        patch.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)


@kopf.on.resume(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", id="resume", when=_ours)
@kopf.on.create(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", id="create", when=_ours)
def _run(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    assert _reconciler is not None
    _call(_reconciler.run, dict(body), patch)


@kopf.on.field(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", id="suspend", field="spec.suspend", when=_ours)
def _suspend(body: kopf.Body, old: object, new: object, reason: str, patch: kopf.Patch, **_: Any) -> None:
    assert _reconciler is not None
    if reason != "update" or bool(old) == bool(new):
        return  # created (suspended or not) is the create handler's
    _call(_reconciler.suspend if new else _reconciler.run, dict(body), patch)


@kopf.on.field(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", id="migrate",
               field=("metadata", "annotations", MIGRATE_ANNOTATION), when=_ours)
def _migrate(body: kopf.Body, new: object, reason: str, patch: kopf.Patch, **_: Any) -> None:
    assert _reconciler is not None
    if reason != "update" or not new:
        return  # created with it: the create handler runs the TrainJob where it names
    _call(_reconciler.migrate, dict(body), patch)


@kopf.on.delete(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", id="delete", when=_ours)
def _delete(body: kopf.Body, **_: Any) -> None:
    assert _reconciler is not None
    _call(_reconciler.delete, dict(body))


@kopf.on.cleanup()
def _cleanup(**_: Any) -> None:
    if _reconciler is not None:
        _reconciler.shutdown()


#: where ``--metrics-token-file`` may come from instead (a Deployment's env)
METRICS_TOKEN_ENV = "HPCBRIDGE_METRICS_TOKEN_FILE"


def listen_address(value: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``, ``:PORT`` or ``PORT`` as (host, port); no host is 127.0.0.1, so nothing
    outside the pod reaches a listener unless its address says so."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "", value
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSpec(flag, value, "must be HOST:PORT (or PORT, on 127.0.0.1) with a port from 1 to 65535")
    return host or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: whatever it resolves to, it is not known to be loopback


def liveness_endpoint(value: str) -> str:
    """kopf's liveness endpoint: a URL as given (kopf listens on localhost when it names no host), or
    ``HOST:PORT`` / ``PORT`` as http://HOST:PORT/healthz, 127.0.0.1 when no host is given."""
    if "://" in value:
        return value
    host, port = listen_address(value, "--liveness")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"


def serve_metrics(metrics: Metrics, address: str, token_file: str | None = None) -> ThreadingHTTPServer:
    """Metrics on *address*: on loopback as asked; beyond loopback only with a bearer token file, else
    InvalidSpec (the TrainJobs, clusters and states it lists are no one else's business). Returns the server."""
    host, port = listen_address(address, "--metrics")
    if token_file:
        try:
            read_token(token_file)
        except FileNotFoundError:
            # the Deployments mount the token's Secret as optional: until it is created every scrape is refused
            logging.getLogger("hpcbridge.operator").warning(
                "metrics: bearer token file %s does not exist yet; refusing scrapes until it does", token_file)
        except OSError as exc:
            raise InvalidSpec("--metrics-token-file", token_file, f"cannot be read: {exc.strerror}") from None
        except ValueError as exc:
            raise InvalidSpec("--metrics-token-file", token_file, str(exc)) from None
    elif not is_loopback(host):
        raise InvalidSpec("--metrics", address, "listens beyond loopback without a bearer token: give "
                                                f"--metrics-token-file (or {METRICS_TOKEN_ENV}), or listen on 127.0.0.1")
    return metrics.serve(host, port, token_file)


def run(namespaces: Sequence[str] = (), default_cluster: str | None = None, timing: Timing | None = None,
        liveness: str | None = None, metrics: str | None = None, metrics_token_file: str | None = None,
        leader_elect: str | None = None, lease_duration: float | None = None, probes: str | None = None) -> int:
    """Run the operator until it is stopped (SIGTERM/SIGINT): every namespace, or only *namespaces*; Prometheus
    metrics on http://*metrics*/metrics when given (``host:port``; 127.0.0.1 unless a host is named, and a
    host beyond loopback needs *metrics_token_file*, or $HPCBRIDGE_METRICS_TOKEN_FILE). With *leader_elect*
    (the Lease's ``NAMESPACE/NAME``) it stands by until it holds the Lease (bridge.operator.leader); *probes*
    (``HOST:PORT``) serves /healthz and /readyz for that. Returns 1, before anything else, where an installed
    CRD has a version this operator does not understand."""
    global _reconciler
    token_file = metrics_token_file or os.environ.get(METRICS_TOKEN_ENV) or None
    if probes and not leader_elect:
        raise InvalidSpec("--probes", probes, "serves the leader election's probes: give --leader-elect too")
    probe_address = listen_address(probes, "--probes") if probes else None
    memory.keep_heap_small()  # before the threads start (each would take an arena of its own)
    api = KubeApi()
    kopf.configure(verbose=False)
    try:
        versions.check_installed(api.api_client)
    except versions.UnsupportedCrd as exc:
        logging.getLogger("hpcbridge.operator").error("refusing to start: %s", exc)
        return 1
    _reconciler = Reconciler(api, default_cluster=default_cluster, timing=timing or Timing())
    # metric labels name only configured BridgeClusters (KubeApi caches the list), never a tenant's free text
    _reconciler.metrics.clusters = api.clusters
    if metrics:
        serve_metrics(_reconciler.metrics, metrics, token_file)
    election = leader.start(api.api_client, leader_elect, lease_duration, probe_address) if leader_elect else None
    kubelet_api.start(api, _reconciler)  # virtual nodes, stand-in pods, their kubelet API: the leader's
    try:
        kopf.run(standalone=True, clusterwide=not namespaces, namespaces=list(namespaces),
                 liveness_endpoint=liveness_endpoint(liveness) if liveness else None)
    finally:
        if election is not None:  # after kopf has stopped: nothing of this process writes any more
            election.release()
    return 0
