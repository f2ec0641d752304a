"""Pods that stand for a TrainJob's backend job on its cluster's virtual node (``bridge.operator.virtual_node``):
one per TrainJob node, named and labelled as Kubeflow's JobSet would name and label the pods of the TrainJob's
``node`` replicated job, so ``kubectl get pods -l jobset.sigs.k8s.io/jobset-name=<trainjob>``, the Kubeflow SDK
and ``kubectl logs`` find them.

Their phase and container state mirror the backend job's, written by the operator as a kubelet writes a pod's
status. They are owned by the TrainJob (deleting it deletes them); deleting a pod does not cancel the job. Nothing
runs in them: they are bound to the virtual node, which no kubelet serves but the operator's API.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bridge.annotations import (
    COMPLETION_INDEX_LABEL,
    HOSTS_ANNOTATION,
    JOB_CLUSTER_ANNOTATION,
    JOB_ID_ANNOTATION,
    JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    MANAGED_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINJOB_NAME_LABEL,
    UID_LABEL,
)
from bridge.errors import BridgeError
from bridge.operator.kube import kube_call
from bridge.operator.virtual_node import MANAGED_BY

if TYPE_CHECKING:
    from bridge.adapters.base import JobStatus
    from bridge.operator.sync import Tracked

log = logging.getLogger("hpcbridge.operator")

#: the replicated job and container name Kubeflow's runtimes give the trainer (the SDK reads container ``node``)
NODE = "node"

#: backend state -> (pod phase, container state)
_PHASES = {"Pending": ("Pending", "waiting"), "Suspended": ("Pending", "waiting"),
           "Unknown": ("Pending", "waiting"), "Running": ("Running", "running"),
           "Completing": ("Running", "running"), "Succeeded": ("Succeeded", "terminated"),
           "Failed": ("Failed", "terminated"), "Cancelled": ("Failed", "terminated"),
           "Timeout": ("Failed", "terminated")}
_TERMINATED_REASONS = {"Succeeded": "Completed", "Failed": "Error", "Cancelled": "Cancelled",
                       "Timeout": "DeadlineExceeded"}


def standin_image(cluster_type: str) -> str:
    """What a stand-in's container shows as its image: never pulled (no kubelet runs the pod), only read."""
    return f"hpc-bridge/{cluster_type}-job"


def pod_name(trainjob: str, index: int) -> str:
    """The name of node *index*'s pod: JobSet names a Job ``<jobset>-<replicated job>-<job index>`` and an indexed
    Job's pods start with ``<job>-<completion index>-`` (then a random suffix, which a stand-in has no need of)."""
    return f"{trainjob}-{NODE}-0-{index}"


def render_pod(item: Tracked, index: int, node: str, cluster: str, cluster_type: str) -> dict[str, Any]:
    """The stand-in pod of node *index* of the TrainJob *item* (without status)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": pod_name(item.name, index), "namespace": item.namespace,
            "labels": {JOBSET_NAME_LABEL: item.name, REPLICATED_JOB_LABEL: NODE, JOB_INDEX_LABEL: "0",
                       COMPLETION_INDEX_LABEL: str(index), TRAINJOB_NAME_LABEL: item.name, UID_LABEL: item.uid,
                       MANAGED_LABEL: MANAGED_BY},
            "annotations": {JOB_ID_ANNOTATION: item.ref.job_id, JOB_CLUSTER_ANNOTATION: cluster},
            "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                 "name": item.name, "uid": item.uid}]},
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [{"name": NODE, "image": standin_image(cluster_type)}],
            # the virtual node's taint, and never evicted while the operator is away (NotReady, unreachable)
            "tolerations": [{"operator": "Exists"}]}}


def render_status(status: JobStatus, cluster_type: str, now: datetime.datetime) -> dict[str, Any]:
    """A pod status that says what the backend says of the job: Pending while queued, Running, Succeeded or
    Failed with the job's exit code."""
    state = status.state.value
    phase, kind = _PHASES.get(state, ("Pending", "waiting"))
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    container: dict[str, Any]
    if kind == "waiting":
        container = {"waiting": {"reason": status.reason or "Queued",
                                 "message": status.message or f"{cluster_type} job {status.ref.job_id} is {state}"}}
    elif kind == "running":
        container = {"running": {"startedAt": stamp}}
    else:
        code = status.exit_code if status.exit_code is not None else (0 if state == "Succeeded" else 1)
        container = {"terminated": {"exitCode": code, "reason": _TERMINATED_REASONS[state], "finishedAt": stamp,
                                    **({"message": status.message} if status.message else {})}}
    running = kind == "running"
    return {"status": {
        "phase": phase, "startTime": stamp,
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
                       {"type": "Ready", "status": str(running), "lastTransitionTime": stamp}],
        "containerStatuses": [{"name": NODE, "image": standin_image(cluster_type), "imageID": "",
                               "ready": running, "started": running, "restartCount": 0, "state": container}]}}


class StandinPods:
    """Writes the stand-in pods of TrainJobs on clusters that have a virtual node (``node_for`` says which)."""

    def __init__(self, api: Any, node_for: Callable[[str], str | None], cluster_type: Callable[[str], str]) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api.api_client)
        self.node_for, self.cluster_type = node_for, cluster_type
        self._written: dict[tuple[str, str], str] = {}  # (namespace, name) → node: what the kubelet API lists
        #: (namespace, name) → what the pod shows (``shown``) as last written or read: a pod already so is not
        #: written again (a restart mirrors every followed TrainJob anew: at 10,000, 20,000 writes of pods the
        #: operator before had written)
        self._shown: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._lock = threading.Lock()

    def written(self) -> list[tuple[str, str, str]]:
        """The stand-in pods written since the operator started: namespace, name, node."""
        with self._lock:
            return [(namespace, name, node) for (namespace, name), node in self._written.items()]

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._written.pop((namespace, name), None)
            self._shown.pop((namespace, name), None)

    def mirror(self, item: Tracked, status: JobStatus) -> None:
        """The pods of *item* created where missing and their status set from *status*. Never fails the caller:
        the TrainJob's own status is the record; its pods are a view of it."""
        cluster = status.ref.cluster
        node = self.node_for(cluster)
        if node is None or item.ref is None:
            return
        from kubernetes.client.exceptions import ApiException

        try:
            self._write(item, status, node, cluster)
        except (BridgeError, ApiException) as exc:  # ApiException: 404, the TrainJob and its pods just went
            log.warning("TrainJob %s/%s: stand-in pods not written: %s", item.namespace, item.name, exc)

    def _write(self, item: Tracked, status: JobStatus, node: str, cluster: str) -> None:
        from kubernetes.client.exceptions import ApiException

        kind = self.cluster_type(cluster)
        body = render_status(status, kind, datetime.datetime.now(datetime.UTC))
        hosts_value = ",".join(status.nodes) if status.nodes else None
        hosts = {"metadata": {"annotations": {HOSTS_ANNOTATION: hosts_value}}} if hosts_value else None
        for index in range(max(item.nodes, 1)):
            name = pod_name(item.name, index)
            key = (item.namespace, name)
            with self._lock:
                was = self._shown.get(key)
            if was is None and item.attached:
                # a job the operator before followed: its pods are read once (one request each) rather than
                # written again
                was = self._read(item.namespace, name)
            wanted = shown(item.uid, item.ref.job_id, hosts_value, body["status"])
            for attempt in (was, None):  # None: as if unknown (deleted since it was written: made again)
                try:
                    if attempt != wanted:
                        self._write_pod(item, index, node, cluster, kind, attempt, wanted, hosts, body)
                    break
                except ApiException as exc:
                    if exc.status != 404 or attempt is None:
                        raise
            with self._lock:
                self._shown[key] = wanted
                self._written[key] = node

    def _write_pod(self, item: Tracked, index: int, node: str, cluster: str, kind: str, was: tuple[Any, ...] | None,
                   wanted: tuple[Any, ...], hosts: dict[str, Any] | None, body: dict[str, Any]) -> None:
        """Node *index*'s pod made to show *wanted*, writing only what differs from what it shows (*was*)."""
        from kubernetes.client.exceptions import ApiException

        name = pod_name(item.name, index)
        if was is None or was[0] != item.uid:
            try:
                kube_call(f"create pod {item.namespace}/{name}", self.core.create_namespaced_pod, item.namespace,
                          render_pod(item, index, node, cluster, kind))
            except ApiException as exc:
                if exc.status != 409:  # 409: there already
                    raise
        if hosts is not None and (was is None or was[2] != wanted[2]):
            kube_call(f"annotate pod {item.namespace}/{name}", self.core.patch_namespaced_pod, name,
                      item.namespace, hosts)
        if was is None or was[3:] != wanted[3:]:
            kube_call(f"write pod {item.namespace}/{name} status", self.core.patch_namespaced_pod_status, name,
                      item.namespace, body)

    def _read(self, namespace: str, name: str) -> tuple[Any, ...] | None:
        """What the pod *name* shows now (None: there is none), read by name: its fields, not a model of it."""
        import json

        from kubernetes.client.exceptions import ApiException

        try:
            answer = kube_call(f"read pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace,
                               _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None
        pod = json.loads(answer.data)
        meta = pod.get("metadata") or {}
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        return shown(labels.get(UID_LABEL), notes.get(JOB_ID_ANNOTATION), notes.get(HOSTS_ANNOTATION),
                     pod.get("status") or {})


def shown(uid: str | None, job_id: str | None, hosts: str | None, status: dict[str, Any]) -> tuple[Any, ...]:
    """What a stand-in pod shows of its job, times left out: the TrainJob uid and job id it carries, its hosts,
    its phase, whether it is Ready (the node controller marks pods of a node that went NotReady while no operator
    ran) and its container's state (kind, reason, message, exit code)."""
    statuses = status.get("containerStatuses") or [{}]
    state = statuses[0].get("state") or {}
    kind = next(iter(state), None)
    detail = state.get(kind) or {} if kind else {}
    ready = next((c.get("status") for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
    return (uid, job_id, hosts or None, status.get("phase"), ready, kind, detail.get("reason"),
            detail.get("message"), detail.get("exitCode"))
