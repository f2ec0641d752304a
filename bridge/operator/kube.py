"""What the operator reads from and writes to its own Kubernetes API: BridgeClusters and runtimes in, TrainJob
annotations, status conditions and Events out. The kubernetes client is blocking; the reconciler calls this
from worker threads."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from bridge.errors import BackendUnavailable, InvalidSpec

if TYPE_CHECKING:
    from bridge.api.cluster import BridgeCluster
    from bridge.api.loader import Resource

_T = TypeVar("_T")


def kube_call(what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """*fn*'s answer; an API error other than 404/409 (which callers tell apart) or a broken connection as
    BackendUnavailable naming *what* was asked."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status in (404, 409):
            raise
        raise BackendUnavailable("kubernetes", f"{what}: HTTP {exc.status} {exc.reason}") from None
    except (HTTPError, OSError) as exc:
        raise BackendUnavailable("kubernetes", f"{what}: {exc}") from None


TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
BRIDGE_GROUP, BRIDGE_VERSION = "hpcbridge.io", "v1alpha1"
COMPONENT = "hpcbridge-operator"
#: connections kept open to the API server (kopf's workers and the sync loops' status writers, with room)
CONNECTIONS = 96


class Gone(Exception):
    """The TrainJob was deleted, or replaced by another of the same name (another uid)."""


class KubeApi:
    """The operator's API client. ``clusters`` are re-read at most every *cluster_ttl* seconds."""

    def __init__(self, api_client: Any = None, cluster_ttl: float = 5.0, credentials_namespace: str | None = None,
                 secret_dir: str | None = None) -> None:
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            configuration = client.Configuration.get_default_copy()
            # one connection per thread that calls at once (kopf's workers, the status writers, the virtual
            # nodes): with urllib3's default of 10, a burst opens and discards TLS connections by the hundred
            configuration.connection_pool_maxsize = CONNECTIONS
            api_client = client.ApiClient(configuration)
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.cluster_ttl = cluster_ttl
        self._clusters: tuple[float, dict[str, BridgeCluster]] | None = None
        self._runtimes: dict[tuple[str, str, str], tuple[float, Resource | None]] = {}
        #: BridgeClusters with their credentials written, by name: (when, the object as listed, the result)
        self._credentialed: dict[tuple[str, str | None], tuple[float, BridgeCluster, BridgeCluster]] = {}
        self._namespaces: dict[str, tuple[float, dict[str, str]]] = {}
        self._lock = threading.Lock()
        #: where BridgeClusters' credential Secrets are read (and nowhere else)
        self.credentials_namespace = credentials_namespace or _own_namespace()
        #: credentials as files the SSH and REST transports read: private to this process's user
        self.secret_dir = secret_dir or tempfile.mkdtemp(prefix="hpcbridge-operator-credentials-")
        os.chmod(self.secret_dir, 0o700)

    def _call(self, what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return kube_call(what, fn, *args, **kwargs)

    # --- in

    def clusters(self) -> Mapping[str, BridgeCluster]:
        """BridgeClusters by name, each with its Secret-held credentials written to files when it is looked up
        (a Secret that cannot be read fails only TrainJobs for that cluster); one that does not validate is
        left out."""
        return _Clusters(self, self._cluster_objects())

    def cluster_specs(self) -> Mapping[str, BridgeCluster]:
        """BridgeClusters by name as listed, without their credentials: for what reads only their type and
        annotations (the virtual nodes), so a cluster whose Secret cannot be read still shows."""
        return dict(self._cluster_objects())

    def _cluster_objects(self, fresh: bool = False) -> dict[str, BridgeCluster]:
        from bridge.api.loader import parse_object

        with self._lock:
            if not fresh and self._clusters is not None and \
                    time.monotonic() - self._clusters[0] < self.cluster_ttl:
                return self._clusters[1]
        listing = self._call("list bridgeclusters", self.custom.list_cluster_custom_object, BRIDGE_GROUP,
                             BRIDGE_VERSION, "bridgeclusters")
        found: dict[str, BridgeCluster] = {}
        for item in listing.get("items", []):
            try:
                # the bridgeclusters listing holds BridgeClusters only
                obj = cast("BridgeCluster", parse_object(without_server_fields(item), f"BridgeCluster {item['metadata']['name']}"))
            except InvalidSpec:
                continue
            found[obj.name] = obj
        with self._lock:
            self._clusters = (time.monotonic(), found)
        return found

    def runtime(self, namespace: str, kind: str, name: str) -> Resource | None:
        """The runtime a TrainJob names, from the API; None when there is none (a built-in may stand in). Read
        at most every *cluster_ttl* seconds: a burst of TrainJobs on one runtime reads and parses it once."""
        key = (namespace if kind == "TrainingRuntime" else "", kind, name)
        with self._lock:
            kept = self._runtimes.get(key)
            if kept is not None and time.monotonic() - kept[0] < self.cluster_ttl:
                return kept[1]
        found = self._read_runtime(namespace, kind, name)
        with self._lock:
            self._runtimes[key] = (time.monotonic(), found)
        return found

    def _read_runtime(self, namespace: str, kind: str, name: str) -> Resource | None:
        from kubernetes.client.exceptions import ApiException

        from bridge.api.loader import parse_object

        try:
            if kind == "TrainingRuntime":
                item = self._call("get trainingruntime", self.custom.get_namespaced_custom_object, TRAINER_GROUP,
                                  TRAINER_VERSION, namespace, "trainingruntimes", name)
            else:
                item = self._call("get clustertrainingruntime", self.custom.get_cluster_custom_object,
                                  TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return parse_object(without_server_fields(item), f"{kind} {name}")

    def credentialed(self, cluster: BridgeCluster) -> BridgeCluster:
        """``with_credentials``, its Secrets read at most every *cluster_ttl* seconds per cluster and tenant."""
        from bridge.tenancy import tenant_of

        key = (cluster.name, tenant_of(cluster))
        with self._lock:
            kept = self._credentialed.get(key)
            if kept is not None and (kept[1] is cluster or kept[1] == cluster) and \
                    time.monotonic() - kept[0] < self.cluster_ttl:
                return kept[2]
        result = self.with_credentials(cluster)
        with self._lock:
            self._credentialed[key] = (time.monotonic(), cluster, result)
        return result

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """A Namespace's labels (what tenant selectors match; a tenant cannot set them), read at most every
        *cluster_ttl* seconds. A namespace that cannot be read has none."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            kept = self._namespaces.get(namespace)
            if kept is not None and time.monotonic() - kept[0] < self.cluster_ttl:
                return kept[1]
        try:
            found = self._call(f"read namespace {namespace}", self.core.read_namespace, namespace)
            labels = dict(found.metadata.labels or {})
        except ApiException:
            labels = {}
        with self._lock:
            self._namespaces[namespace] = (time.monotonic(), labels)
        return labels

    def with_credentials(self, cluster: BridgeCluster) -> BridgeCluster:
        """*cluster* with every ``...SecretRef`` of its connection replaced by the file it names, written from
        the Secret (mode 0600, replaced atomically). The Secret's content is never logged or put in a message."""
        import base64

        from kubernetes.client.exceptions import ApiException

        from bridge.tenancy import tenant_of

        conn = cluster.spec.slurm
        if conn is None:
            return cluster
        update: dict[str, Any] = {}
        for ref_field, file_field, alias in (("key_secret_ref", "key_file", "keySecretRef"),
                                             ("known_hosts_secret_ref", "known_hosts_file", "knownHostsSecretRef"),
                                             ("token_secret_ref", "token_file", "tokenSecretRef")):
            ref = getattr(conn, ref_field)
            if ref is None:
                continue
            where = f"BridgeCluster {cluster.name}: spec.slurm.{alias}"
            if ref.namespace not in (None, self.credentials_namespace):
                raise InvalidSpec(f"{where}.namespace", ref.namespace, "the operator reads credentials only from "
                                  f"Secrets in its own namespace {self.credentials_namespace}")
            try:
                secret = self._call(f"read secret {self.credentials_namespace}/{ref.name}",
                                    self.core.read_namespaced_secret, ref.name, self.credentials_namespace)
            except ApiException as exc:  # 404: perhaps applied in a moment; retried
                raise BackendUnavailable("kubernetes", f"{where}: Secret {self.credentials_namespace}/{ref.name}: "
                                         f"HTTP {exc.status} {exc.reason}") from None
            encoded = (secret.data or {}).get(ref.key)
            if encoded is None:
                raise BackendUnavailable("kubernetes", f"{where}: Secret {self.credentials_namespace}/{ref.name} "
                                         f"has no key {ref.key!r}")
            tenant = tenant_of(cluster)
            path = os.path.join(self.secret_dir, f"{cluster.name}.{tenant}.{file_field}" if tenant else
                                f"{cluster.name}.{file_field}")
            _write_private(path, base64.b64decode(encoded))
            update[file_field] = path
            update[ref_field] = None
        if not update:
            return cluster
        slurm = conn.model_copy(update=update)
        return cluster.model_copy(update={"spec": cluster.spec.model_copy(update={"slurm": slurm})})

    # --- out

    def write_conditions(self, namespace: str, name: str, uid: str, conditions: list[dict[str, Any]]) -> None:
        self._patch("write trainjob status", self.custom.patch_namespaced_custom_object_status, namespace, name,
                    {"metadata": {"uid": uid}, "status": {"conditions": conditions}})

    def _patch(self, what: str, fn: Callable[..., Any], namespace: str, name: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            # metadata.uid in the patch is a precondition: a TrainJob re-created under the same name is not touched
            self._call(what, fn, TRAINER_GROUP, TRAINER_VERSION, namespace, "trainjobs", name, body,
                       _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status in (404, 409):
                raise Gone(f"{namespace}/{name}") from None
            raise

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event on the TrainJob (what `kubectl describe` shows). Never fails the caller."""
        import datetime

        stamp = datetime.datetime.now(datetime.UTC)
        body = {"metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": {"apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}", "kind": "TrainJob",
                                   "name": name, "namespace": namespace, "uid": uid},
                "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        try:
            self._call("post event", self.core.create_namespaced_event, namespace, body)
        except Exception:  # an event is a courtesy; the status is the record
            pass


def without_server_fields(item: dict[str, Any]) -> dict[str, Any]:
    """An API object as our models read it: without status, and metadata without the server's bookkeeping."""
    metadata = {key: value for key, value in (item.get("metadata") or {}).items()
                if key in ("name", "namespace", "uid", "labels", "annotations", "generation")}
    return {key: value for key, value in item.items() if key not in ("status", "metadata")} | {"metadata": metadata}


class _Clusters(Mapping[str, "BridgeCluster"]):
    """BridgeClusters by name; looking one up writes its credentials (``KubeApi.with_credentials``). A name the
    cached listing lacks is looked up in a fresh one before it is called unknown: a BridgeCluster created a
    moment before its first TrainJob must not refuse that TrainJob for good."""

    def __init__(self, api: KubeApi, objects: dict[str, BridgeCluster]) -> None:
        self.api, self.objects = api, objects
        self.fresh = False

    def __getitem__(self, name: str) -> BridgeCluster:
        if name not in self.objects and not self.fresh:
            self.objects, self.fresh = self.api._cluster_objects(fresh=True), True
        return self.api.credentialed(self.objects[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.objects)

    def __len__(self) -> int:
        return len(self.objects)


def _write_private(path: str, data: bytes) -> None:
    """*data* at *path*, readable by this user only, replacing the file in one rename (a transport reading it
    meanwhile sees the old or the new content, never half)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _own_namespace() -> str:
    """The namespace this operator runs in: its pod's (the ServiceAccount's), else $POD_NAMESPACE, else the
    namespace manifests/operator installs it in."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as handle:
            return handle.read().strip()
    except OSError:
        return os.environ.get("POD_NAMESPACE") or "hpcbridge-system"
