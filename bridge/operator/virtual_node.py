"""A Node for each BridgeCluster whose backend runs no pods (Slurm, Flux…): Kubernetes sees the HPC cluster as one
virtual node, which the stand-in pods of its TrainJobs are bound to and whose kubelet API (served by the operator,
``bridge.operator.kubelet_api``) answers ``kubectl logs`` for them.

The Node is tainted so that nothing else is scheduled there, labelled with its cluster's name and type, Ready while
the operator runs (its Lease in kube-node-lease renewed every few seconds, as a kubelet's), and names the
operator's kubelet port and address. Its capacity is the backend's (``service.cluster_size``: nodes as the
extended resource ``hpcbridge.io/nodes``, CPUs, memory, GPUs), asked when the Node is registered and every
*size_every* seconds on a worker thread so a slow backend never holds up a heartbeat; what the backend cannot say
is left out rather than guessed, and the Node's annotation ``operator.hpcbridge.io/capacity`` says where the
figures came from or why there are none. A cluster's admin opts out with the BridgeCluster annotation
``hpcbridge.io/virtual-node: "false"``.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from bridge import __version__
from bridge.annotations import (
    CAPACITY_ANNOTATION,
    CLUSTER_ANNOTATION,
    MANAGED_LABEL,
    NODE_CLUSTER_TYPE_LABEL,
    NODES_RESOURCE,
    VIRTUAL_NODE_ANNOTATION,
)
from bridge.errors import BridgeError, InvalidSpec
from bridge.operator.kube import kube_call
from bridge.plan.traits import traits_of

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, ClusterSize
    from bridge.api.cluster import BridgeCluster

log = logging.getLogger("hpcbridge.operator")
_T = TypeVar("_T")

#: the value of MANAGED_LABEL on what the virtual node feature creates
MANAGED_BY = "virtual-node"
LEASE_NAMESPACE = "kube-node-lease"
#: how long the node lifecycle controller waits for a lease renewal before it calls the node NotReady
LEASE_SECONDS = 40
#: how many stand-in pods the Node holds; the scheduler never places anything there (the taint)
PODS = "10000"

#: where the operator's settings for the virtual nodes come from (its Deployment's env)
ADDRESS_ENV = "HPCBRIDGE_KUBELET_ADDRESS"
PORT_ENV = "HPCBRIDGE_KUBELET_PORT"
ENABLED_ENV = "HPCBRIDGE_VIRTUAL_NODES"
DEFAULT_PORT = 10250


@dataclass(frozen=True)
class Endpoint:
    """Where the API server reaches the operator's kubelet API: the node's InternalIP and kubelet port."""

    address: str
    port: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Endpoint:
        """$HPCBRIDGE_KUBELET_ADDRESS (default: $POD_IP, else this host's address) and $HPCBRIDGE_KUBELET_PORT
        (default 10250)."""
        port_text = env.get(PORT_ENV) or str(DEFAULT_PORT)
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise InvalidSpec(PORT_ENV, port_text, "must be a port from 1 to 65535")
        address = env.get(ADDRESS_ENV) or env.get("POD_IP") or _own_address()
        return cls(address, int(port_text))


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Virtual nodes are on unless $HPCBRIDGE_VIRTUAL_NODES says ``false`` (or ``off``, ``0``)."""
    return (env.get(ENABLED_ENV) or "true").strip().lower() not in ("false", "off", "0", "no")


def node_name(cluster: str) -> str:
    return f"hpcbridge-{cluster}"


def wants_node(cluster: BridgeCluster) -> bool:
    """A cluster whose backend runs no pods of its own, unless its admin opted out."""
    opted = (cluster.metadata.annotations or {}).get(VIRTUAL_NODE_ANNOTATION, "true").strip().lower()
    return not traits_of(cluster).runs_pods and opted not in ("false", "off", "0", "no")


def _stamp(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def render_node(cluster: BridgeCluster, endpoint: Endpoint) -> dict[str, Any]:
    """The Node object (without status) that stands for *cluster*."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name(cluster.name),
                         "labels": {CLUSTER_ANNOTATION: cluster.name, NODE_CLUSTER_TYPE_LABEL: cluster.spec.type,
                                    MANAGED_LABEL: MANAGED_BY, "kubernetes.io/hostname": node_name(cluster.name),
                                    "kubernetes.io/os": "linux", "type": "virtual-kubelet"}},
            "spec": {"taints": [{"key": CLUSTER_ANNOTATION, "value": cluster.name, "effect": "NoSchedule"}]}}


def resources(size: ClusterSize | None) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """The Node's capacity and allocatable from the backend's *size* (None: not known yet): the cluster's nodes,
    CPUs, memory and GPUs in all and usable. A figure the backend does not give is None, which a patch removes
    from the Node: never a guess."""
    def of(amounts: Any) -> dict[str, str | None]:
        figures: dict[str, str | None] = {NODES_RESOURCE: None, "cpu": None, "memory": None, "nvidia.com/gpu": None}
        if amounts is not None:
            figures.update({NODES_RESOURCE: _text(amounts.nodes), "cpu": _text(amounts.cpus),
                            "memory": None if amounts.memory_mib is None else f"{amounts.memory_mib}Mi",
                            "nvidia.com/gpu": _text(amounts.gpus)})
        return {**figures, "pods": PODS}

    return of(size.total if size else None), of(size.usable if size else None)


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def capacity_note(size: ClusterSize | None, problem: str | None, now: datetime.datetime) -> str:
    """The Node's capacity annotation: what was counted, from where and when; or why nothing is known."""
    if size is None:
        return f"unknown: {problem or 'not asked yet'}"
    kept = f"; the last answer, kept while the backend is not answering: {problem}" if problem else ""
    return f"{size.total.text()} ({size.detail}) at {_stamp(now)}{kept}"


def render_status(cluster: BridgeCluster, endpoint: Endpoint, now: datetime.datetime,
                  size: ClusterSize | None = None) -> dict[str, Any]:
    """The Node's status: Ready, its capacity (the backend's *size*), the operator's address and kubelet port."""
    stamp = _stamp(now)
    capacity, allocatable = resources(size)
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": stamp,
             "lastTransitionTime": stamp,
             "message": f"hpc-bridge stands for {cluster.spec.type} cluster {cluster.name}"}
    return {"status": {
        "capacity": capacity, "allocatable": allocatable, "conditions": [ready],
        "addresses": [{"type": "InternalIP", "address": endpoint.address},
                      {"type": "Hostname", "address": node_name(cluster.name)}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": endpoint.port}},
        "nodeInfo": {"kubeletVersion": f"hpcbridge-{__version__}", "operatingSystem": "linux",
                     "architecture": "amd64", "containerRuntimeVersion": f"{cluster.spec.type}://",
                     "kernelVersion": "", "osImage": "", "kubeProxyVersion": "", "machineID": "",
                     "systemUUID": "", "bootID": ""}}}


def render_lease(name: str, node_uid: str, now: datetime.datetime) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
                     "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


class VirtualNodes:
    """Keeps one Node per eligible BridgeCluster registered, its status and Lease current, and removes the Nodes
    it made for clusters that are gone or opted out. ``sync_once`` does one round; ``start`` runs rounds every
    *interval* seconds on a thread."""

    def __init__(self, api: Any, endpoint: Endpoint, clusters: Callable[[], Mapping[str, BridgeCluster]],
                 interval: float = 10.0, status_every: float = 60.0, size_every: float = 60.0,
                 adapter_for: Callable[[str], Adapter] | None = None) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api.api_client)
        self.leases = client.CoordinationV1Api(api.api_client)
        self.endpoint, self.clusters, self.interval, self.status_every = endpoint, clusters, interval, status_every
        self.size_every = size_every
        #: the adapter that asks a cluster its size (by name): given, else one per cluster kept here
        self.adapter_for = adapter_for or _AdapterPerCluster(api).get
        #: cluster name -> Node name, for those registered
        self.nodes: dict[str, str] = {}
        self._status_at: dict[str, datetime.datetime] = {}
        #: the backend's last answer per cluster, why the last ask failed, when it was asked, and those in flight
        self.sizes: dict[str, ClusterSize] = {}
        self._size_problem: dict[str, str] = {}
        self._size_at: dict[str, datetime.datetime] = {}
        self._asking: set[str] = set()
        self._askers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="node-size")
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="virtual-nodes", daemon=True)

    def node_for(self, cluster: str) -> str | None:
        """The Node that stands for *cluster*, where one is registered."""
        with self._lock:
            return self.nodes.get(cluster)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._askers.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sync_once()
            except BridgeError as exc:
                log.warning("virtual nodes: %s", exc)
            except Exception:  # never let one bad answer stop the heartbeats
                log.exception("virtual nodes")
            self.stopping.wait(self.interval)

    def sync_once(self, now: datetime.datetime | None = None) -> None:
        now = now or datetime.datetime.now(datetime.UTC)
        wanted = {name: cluster for name, cluster in self.clusters().items() if wants_node(cluster)}
        for cluster in wanted.values():
            try:  # one cluster's trouble must not keep the others' Nodes from their heartbeats
                self._keep(cluster, now)
            except BridgeError as exc:
                log.warning("virtual node of BridgeCluster %s: %s", cluster.name, exc)
        for name, node in self._ours().items():
            if name not in wanted:
                self._remove(name, node)

    def _ours(self) -> dict[str, str]:
        listing = kube_call("list nodes", self.core.list_node, label_selector=f"{MANAGED_LABEL}={MANAGED_BY}")
        return {(item.metadata.labels or {}).get(CLUSTER_ANNOTATION, ""): item.metadata.name
                for item in listing.items}

    def _keep(self, cluster: BridgeCluster, now: datetime.datetime) -> None:
        from kubernetes.client.exceptions import ApiException

        name = node_name(cluster.name)
        body = render_node(cluster, self.endpoint)
        try:
            node = kube_call(f"patch node {name}", self.core.patch_node, name, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            node = kube_call(f"create node {name}", self.core.create_node, body)
            log.info("virtual node %s registered for cluster %s", name, cluster.name)
        with self._lock:
            fresh = cluster.name not in self.nodes
            self.nodes[cluster.name] = name
            due = fresh or (now - self._status_at.get(cluster.name, now)).total_seconds() >= self.status_every
        if due:
            self._write_status(cluster, now)
        self._renew(name, node.metadata.uid, now)
        self._ask_size_when_due(cluster, now)

    def _write_status(self, cluster: BridgeCluster, now: datetime.datetime) -> None:
        name = node_name(cluster.name)
        with self._lock:
            size = self.sizes.get(cluster.name)
        kube_call(f"patch node {name} status", self.core.patch_node_status, name,
                  render_status(cluster, self.endpoint, now, size))
        with self._lock:
            self._status_at[cluster.name] = now

    def _ask_size_when_due(self, cluster: BridgeCluster, now: datetime.datetime) -> None:
        """Ask the backend its size on a worker when the Node has none yet or its last is *size_every* old."""
        with self._lock:
            asked = self._size_at.get(cluster.name)
            if cluster.name in self._asking or (asked is not None and
                                                (now - asked).total_seconds() < self.size_every):
                return
            self._asking.add(cluster.name)
            self._size_at[cluster.name] = now
        try:
            self._askers.submit(self.refresh_size, cluster)
        except RuntimeError:  # stopping: the pool takes no more work
            with self._lock:
                self._asking.discard(cluster.name)

    def refresh_size(self, cluster: BridgeCluster) -> None:
        """Ask *cluster*'s backend its size through the service and write it on the Node (status and the
        capacity annotation); on trouble the last answer stays and the annotation says why. Never raises."""
        from bridge import service

        try:
            size: ClusterSize | None = service.cluster_size(self.adapter_for(cluster.name))
            problem = None
        except Exception as exc:  # noqa: BLE001 - an unknown size must not stop the Node's heartbeats
            size, problem = None, str(exc) if isinstance(exc, BridgeError) else f"{type(exc).__name__}: {exc}"
            log.warning("virtual node of BridgeCluster %s: size unknown: %s", cluster.name, problem)
        now = datetime.datetime.now(datetime.UTC)
        with self._lock:
            self._asking.discard(cluster.name)
            if size is not None:
                self.sizes[cluster.name] = size
                self._size_problem.pop(cluster.name, None)
            else:
                self._size_problem[cluster.name] = problem or ""
            shown, why = self.sizes.get(cluster.name), self._size_problem.get(cluster.name)
        name = node_name(cluster.name)
        try:
            kube_call(f"annotate node {name}", self.core.patch_node, name,
                      {"metadata": {"annotations": {CAPACITY_ANNOTATION: capacity_note(shown, why, now)}}})
            self._write_status(cluster, now)
        except Exception as exc:  # noqa: BLE001 - the next round writes it
            log.warning("virtual node %s: capacity not written: %s", name, exc)

    def _renew(self, name: str, node_uid: str, now: datetime.datetime) -> None:
        from kubernetes.client.exceptions import ApiException

        lease = render_lease(name, node_uid, now)
        try:
            kube_call(f"renew lease {name}", self.leases.patch_namespaced_lease, name, LEASE_NAMESPACE,
                      {"spec": lease["spec"]})
        except ApiException as exc:
            if exc.status != 404:
                raise
            kube_call(f"create lease {name}", self.leases.create_namespaced_lease, LEASE_NAMESPACE, lease)

    def _remove(self, cluster: str, node: str) -> None:
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            self.nodes.pop(cluster, None)
            self._status_at.pop(cluster, None)
            self._size_at.pop(cluster, None)
            self.sizes.pop(cluster, None)
        try:
            kube_call(f"delete node {node}", self.core.delete_node, node)
            log.info("virtual node %s removed: cluster %s is gone or opted out", node, cluster)
        except ApiException as exc:
            if exc.status != 404:
                raise


class _AdapterPerCluster:
    """One adapter per BridgeCluster, built from its credentialed spec through the service, and built again
    when the spec changes: what asks a cluster its size when no sync loop's adapter is handed in."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.kept: dict[str, tuple[BridgeCluster, Adapter]] = {}
        self.lock = threading.Lock()

    def get(self, cluster: str) -> Adapter:
        from bridge import service

        spec = self.api.clusters()[cluster]
        with self.lock:
            kept = self.kept.get(cluster)
            if kept is not None and kept[0] == spec:
                return kept[1]
        adapter = service.get_adapter(spec)
        with self.lock:
            self.kept[cluster] = (spec, adapter)
        return adapter
