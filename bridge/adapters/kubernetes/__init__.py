"""Kubernetes backend: JobSets in Kubeflow's conventions. The client is imported only to talk.

A job is ``namespace/name``; every object it creates carries the TrainJob uid as a label, so submit is
idempotent and one list call per namespace serves a whole poll.
"""

from __future__ import annotations

import base64
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from bridge.adapters.base import (
    Adapter,
    Artifact,
    ArtifactFile,
    Capabilities,
    Capacity,
    ClusterSize,
    Identity,
    JobRef,
    JobState,
    JobStatus,
    OptionSpec,
)
from bridge.adapters.kubernetes.policy import check_pod_policy
from bridge.adapters.kubernetes.render import JOBSET_API, jobset_name, render_manifests, ssh_secret_name
from bridge.adapters.kubernetes.scheduling import POD_GROUP_API
from bridge.adapters.kubernetes.status import (
    creation_warning,
    failed_job_exit_code,
    jobset_state,
    live_pods,
    pod_exit_code,
    quota_message,
    trainer_steps,
)
from bridge.annotations import (
    ACCOUNT_ANNOTATION,
    CANCELLED_ANNOTATION,
    FEATURE_LABEL_PREFIX,
    JOBSET_NAME_LABEL,
    KEYS_ANNOTATION,
    KUEUE_JOB_UID_LABEL,
    PARTITION_ANNOTATION,
    UID_LABEL,
)
from bridge.errors import BackendRejected, BackendUnavailable
from bridge.plan import LaunchPlan
from bridge.tenancy import tenant_of

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi, V1Pod

    from bridge.api.cluster import BridgeCluster, PodPolicy

_T = TypeVar("_T")

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
#: apiVersion → (group, version, plural) of the gang schedulers' PodGroups
_POD_GROUP_APIS = {f"{group}/{version}": (group, version, plural) for group, version, plural in POD_GROUP_API.values()}


def _log_container(pod: V1Pod) -> str:
    """The container whose log is the pod's: the trainer's ``node``, else the pod's first (an initializer's,
    named after its job)."""
    names = [c.name for c in ((pod.spec.containers or []) if pod.spec else [])]
    return "node" if "node" in names or not names else names[0]


class KubernetesAdapter(Adapter):
    backend = "kubernetes"
    # signals: stopping pods sends SIGTERM, then SIGKILL after their grace period; no other signal
    capabilities = Capabilities(signals=False, unique_names=True)
    options = (
        OptionSpec("partition", f"nodeSelector {PARTITION_ANNOTATION}: <partition>"),
        OptionSpec("constraint", f"nodeSelector {FEATURE_LABEL_PREFIX}<feature>: \"true\" per &-joined feature"),
        OptionSpec("qos", "priorityClassName"),
        OptionSpec("account", f"label {ACCOUNT_ANNOTATION} on the JobSet and its pods"),
        OptionSpec("exclusive", "pod anti-affinity: no other hpc-bridge pod on the same node"),
    )

    #: how long why pending JobSets wait (read from their pods and the namespace's warnings) stands for them
    #: while the same JobSets pend: a long-lived adapter (the operator's) then asks one JobSet list per cycle
    PENDING_REASONS_TTL = 10.0

    def __init__(self, cluster: BridgeCluster, api_client: ApiClient | None = None) -> None:
        super().__init__(cluster)
        self._api_client = api_client
        #: namespace -> (when read, JobSet name -> (reason, message) found then, or None where none was)
        self._pending_read: dict[str, tuple[float, dict[str, tuple[str | None, str | None] | None]]] = {}

    def render(self, plan: LaunchPlan) -> Artifact:
        """Exactly what submit creates, in the namespace it creates it in, once the pods pass the cluster's
        pod policy."""
        manifests = render_manifests(plan, self._namespace(plan.namespace), self._pod_policy())
        return Artifact("kubernetes", "jobset", plan,
                        (ArtifactFile(f"{plan.name}.jobset.yaml", manifests, "application/yaml"),))

    def _pod_policy(self) -> PodPolicy | None:
        conn = self.cluster.spec.kubernetes
        return conn.pod_policy if conn else None

    # --- clients -------------------------------------------------------------------------------------

    @property
    def api(self) -> ApiClient:
        if self._api_client is None:
            from bridge.adapters.kubernetes.client import api_client

            self._api_client = api_client(self.cluster.spec.kubernetes)
        return self._api_client

    def _core(self) -> CoreV1Api:
        from bridge.adapters.kubernetes.client import client

        return client.CoreV1Api(self.api)

    def _custom(self) -> CustomObjectsApi:
        from bridge.adapters.kubernetes.client import client

        return client.CustomObjectsApi(self.api)

    def _call(self, what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        from bridge.adapters.kubernetes.client import CLIENT_ERRORS, translate

        try:
            return fn(*args, **kwargs)
        except CLIENT_ERRORS as exc:  # API answers and transport failures; a bug in our code stays a bug
            raise translate(exc, what) from None

    # --- submit --------------------------------------------------------------------------------------

    def _namespace(self, plan_namespace: str) -> str:
        """Where the JobSets of a TrainJob of *plan_namespace* are: ``spec.kubernetes.namespace`` (a tenant's
        target namespace in the operator's overlay of the cluster), else the TrainJob's own."""
        conn = self.cluster.spec.kubernetes
        return (conn.namespace if conn and conn.namespace else None) or plan_namespace

    def find(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        """One JobSet list per namespace, filtered server-side by the set of uids."""
        found: dict[str, JobStatus] = {}
        by_namespace: dict[str, list[str]] = {}
        for identity in identities:
            by_namespace.setdefault(self._namespace(identity.namespace), []).append(identity.uid)
        for namespace, uids in by_namespace.items():
            unique = sorted(set(uids))
            for first in range(0, len(unique), 100):  # keeps the selector well inside URL limits
                selector = f"{UID_LABEL} in ({','.join(unique[first:first + 100])})"
                listing = self._call("list jobsets", self._custom().list_namespaced_custom_object, GROUP, VERSION,
                                     namespace, PLURAL, label_selector=selector)
                for item in listing.get("items", []):
                    name, uid = item["metadata"]["name"], item["metadata"]["labels"][UID_LABEL]
                    ref = JobRef(self.cluster.name, "kubernetes", f"{namespace}/{name}", uid, name)
                    found[uid] = self._jobset_status(ref, item)
        return found

    def submit(self, artifact: Artifact) -> JobRef:
        return self._create_all(artifact)

    def dry_run(self, artifact: Artifact) -> None:
        """Every object submit would create, created with ``dryRun=All``: the API server runs its validation and
        every admission webhook (JobSet's, a policy engine's, Kueue's) and its quota, and stores nothing."""
        self._create_all(artifact, dry_run=True)

    def _create_all(self, artifact: Artifact, dry_run: bool = False) -> JobRef:
        plan = artifact.plan
        sent: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        namespace = self._namespace(plan.namespace)
        # the policy once more, before anything exists: an artifact rendered elsewhere passes it here too
        check_pod_policy(plan, namespace, self._pod_policy())
        objects = list(yaml.load_all(artifact.main, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
        core, custom = self._core(), self._custom()
        created: list[tuple[str, str]] = []
        for obj in objects:
            obj["metadata"]["namespace"] = namespace
            kind = obj["kind"]
            if kind == "Secret" and obj.get("type") == "kubernetes.io/ssh-auth":
                obj["data"] = _ssh_secret_data(plan.name)  # keys are made here, never rendered or logged
                obj["metadata"].get("annotations", {}).pop(KEYS_ANNOTATION, None)
                self._create(partial(core.create_namespaced_secret, **sent), namespace, obj, "create secret",
                             core.read_namespaced_secret)
            elif kind == "ConfigMap":
                self._create(partial(core.create_namespaced_config_map, **sent), namespace, obj,
                             "create configmap", core.read_namespaced_config_map)
            elif kind == "PodGroup" and obj.get("apiVersion") in _POD_GROUP_APIS:
                api = _POD_GROUP_APIS[obj["apiVersion"]]
                # a default binds this object's API to each lambda (ruff B023), which mypy cannot type
                self._create(lambda ns, body, a=api: custom.create_namespaced_custom_object(  # type: ignore[misc]
                                 a[0], a[1], ns, a[2], body, **sent),
                             namespace, obj, "create podgroup (is the gang scheduler's CRD installed?)",
                             lambda name, ns, a=api: custom.get_namespaced_custom_object(  # type: ignore[misc]
                                 a[0], a[1], ns, a[2], name))
                kind = obj["apiVersion"]  # _own patches it by its API
            elif obj.get("apiVersion") == JOBSET_API and kind == "JobSet":
                jobset = self._create(lambda ns, body: custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, body, **sent), namespace, obj, "create jobset",
                    lambda name, ns: custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
                if not dry_run:
                    self._own(namespace, created, jobset)
                return JobRef(self.cluster.name, "kubernetes", f"{namespace}/{obj['metadata']['name']}", plan.uid,
                              obj["metadata"]["name"])
            else:
                raise BackendRejected("kubernetes", f"unexpected object {kind} in the artifact")
            created.append((kind, obj["metadata"]["name"]))
        raise BackendRejected("kubernetes", "the artifact has no JobSet")

    def _create(self, fn: Callable[[str, dict[str, Any]], Any], namespace: str, body: dict[str, Any], what: str,
                read: Callable[[str, str], Any] | None = None) -> Any:
        """What the API answered (a dict for a custom object, a client model otherwise); an object of ours
        that exists already (an interrupted submit): as a dict, or None."""
        from bridge.adapters.kubernetes.client import ApiException

        try:
            return fn(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                from bridge.adapters.kubernetes.client import translate

                raise translate(exc, what) from None
        # the name is taken: ours from an interrupted submit (same uid) is kept; anyone else's is a refusal
        name, uid = body["metadata"]["name"], body["metadata"]["labels"][UID_LABEL]
        existing = self._call(f"read {body['kind']}", read, name, namespace) if read else None
        labels = (existing.get("metadata", {}) if isinstance(existing, dict)
                  else (existing.metadata.to_dict() if existing is not None else {})).get("labels") or {}
        if existing is not None and labels.get(UID_LABEL) != uid:
            # the other TrainJob's uid is not said: it may be another tenant's
            raise BackendRejected("kubernetes", f"{body['kind']} {namespace}/{name} already exists and belongs to "
                                                "another TrainJob")
        return existing if isinstance(existing, dict) else None

    def _own(self, namespace: str, created: list[tuple[str, str]], jobset: dict[str, Any] | None) -> None:
        """Make the JobSet own its Secret, ConfigMap and PodGroup, so deleting it deletes them."""
        if not jobset:
            return
        owner = [{"apiVersion": JOBSET_API, "kind": "JobSet", "name": jobset["metadata"]["name"],
                  "uid": jobset["metadata"]["uid"], "controller": False, "blockOwnerDeletion": False}]
        core = self._core()
        for kind, name in created:
            patch = {"metadata": {"ownerReferences": owner}}
            if kind == "Secret":
                self._call("own secret", core.patch_namespaced_secret, name, namespace, patch)
            elif kind in _POD_GROUP_APIS:
                group, version, plural = _POD_GROUP_APIS[kind]
                self._call("own podgroup", self._custom().patch_namespaced_custom_object, group, version, namespace,
                           plural, name, patch)
            else:
                self._call("own configmap", core.patch_namespaced_config_map, name, namespace, patch)

    # --- follow --------------------------------------------------------------------------------------

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        """One JobSet list per namespace; why pending ones wait, a pod list, only when other JobSets pend than
        at the last read or PENDING_REASONS_TTL after it."""
        by_namespace: dict[str, list[JobRef]] = {}
        for ref in refs:
            by_namespace.setdefault(ref.job_id.split("/", 1)[0], []).append(ref)
        statuses: dict[JobRef, JobStatus] = {}
        for namespace, group in by_namespace.items():
            listing = self._call("list jobsets", self._custom().list_namespaced_custom_object, GROUP, VERSION,
                                 namespace, PLURAL, label_selector=UID_LABEL)
            jobsets = {item["metadata"]["name"]: item for item in listing.get("items", [])}
            pending, failed, cancelled = [], [], []
            for ref in group:
                jobset = jobsets.get(ref.job_id.split("/", 1)[1])
                if jobset is None:
                    statuses[ref] = JobStatus(ref, JobState.UNKNOWN, reason="NotFound")
                    continue
                statuses[ref] = self._jobset_status(ref, jobset)
                if statuses[ref].state == JobState.PENDING:
                    pending.append(ref)
                elif statuses[ref].state == JobState.FAILED:
                    failed.append(ref)
                elif statuses[ref].state == JobState.CANCELLED:
                    cancelled.append(ref)
            queued = [ref for ref in pending if statuses[ref].reason == "Queued"]
            if queued:
                self._queue_reasons(namespace, queued, statuses, jobsets)
            pending = [ref for ref in pending if ref not in queued]
            if pending:
                self._pending_reasons(namespace, pending, statuses, jobsets)
            else:
                self._pending_read.pop(namespace, None)
            if failed:
                self._exit_codes(namespace, failed, statuses, jobsets)
            if cancelled:
                self._stopping(namespace, cancelled, statuses)
        return statuses

    def _stopping(self, namespace: str, refs: list[JobRef], statuses: dict[JobRef, JobStatus]) -> None:
        """A cancelled JobSet has ended only once its pods have: until then (SIGTERM sent, their grace running)
        it is Running, reason Stopping, so that nothing runs it again elsewhere while its last step still writes.
        One pod list per namespace."""
        names = ",".join(ref.job_id.split("/", 1)[1] for ref in refs)
        pods = self._call("list pods", self._core().list_namespaced_pod, namespace,
                          label_selector=f"{JOBSET_NAME_LABEL} in ({names})").items
        for ref in refs:
            if live := live_pods(pods, ref.job_id.split("/", 1)[1]):
                statuses[ref] = JobStatus(ref, JobState.RUNNING, reason="Stopping",
                                          message=f"cancelled; {live} pod(s) still stopping")

    def _exit_codes(self, namespace: str, refs: list[JobRef], statuses: dict[JobRef, JobStatus], jobsets: dict[str, dict[str, Any]]) -> None:
        """A failed JobSet's exit code: its trainer step's pod's command's (the MPI launcher's, which carries the
        failing rank's), else the first non-zero code of any of its pods; with no pod left (the Job controller
        deletes a failed Job's pods), the code its failed Job's condition names. One pod list and at most one Job
        list per namespace, whatever the number of failed JobSets."""
        names = ",".join(ref.job_id.split("/", 1)[1] for ref in refs)
        pods = self._call("list pods", self._core().list_namespaced_pod, namespace,
                          label_selector=f"{JOBSET_NAME_LABEL} in ({names})")
        jobs = None
        for ref in refs:
            name = ref.job_id.split("/", 1)[1]
            steps = trainer_steps(jobsets.get(name) or {})
            code = pod_exit_code(pods.items, name, steps)
            if code is None:
                if jobs is None:
                    from bridge.adapters.kubernetes.client import client

                    jobs = self._call("list jobs", client.BatchV1Api(self.api).list_namespaced_job, namespace,
                                      label_selector=f"{JOBSET_NAME_LABEL} in ({names})").items
                code = failed_job_exit_code(name, jobs, steps)
            if code is not None:
                status = statuses[ref]
                statuses[ref] = JobStatus(ref, status.state, reason=status.reason, message=status.message,
                                          exit_code=code)

    def _jobset_status(self, ref: JobRef, jobset: dict[str, Any]) -> JobStatus:
        state, reason, message = jobset_state(jobset)
        if not ref.uid:
            uid = ((jobset.get("metadata") or {}).get("labels") or {}).get(UID_LABEL, "")
            ref = JobRef(ref.cluster, ref.backend, ref.job_id, uid, ref.name)
        return JobStatus(ref, state, reason=reason, message=message,
                         exit_code=0 if state == JobState.SUCCEEDED else None)

    def _queue_reasons(self, namespace: str, refs: list[JobRef], statuses: dict[JobRef, JobStatus], jobsets: dict[str, dict[str, Any]]) -> None:
        """Why a queued JobSet waits, as Kueue says it on its Workload (``QuotaReserved`` False: "insufficient
        unused quota for cpu…"), with the ClusterQueue its LocalQueue feeds. One Workload list per namespace
        and one read per LocalQueue; where Kueue's objects cannot be read, the LocalQueue alone is said."""
        from bridge.adapters.kubernetes.client import CLIENT_ERRORS

        custom = self._custom()
        uids = {((jobsets[ref.job_id.split("/", 1)[1]].get("metadata") or {}).get("uid") or ""): ref for ref in refs}
        try:
            workloads = custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads",
                label_selector=f"{KUEUE_JOB_UID_LABEL} in ({','.join(uid for uid in uids if uid)})")["items"]
        except CLIENT_ERRORS:
            return
        cluster_queues: dict[str, str | None] = {}
        for workload in workloads:
            ref = uids.get(((workload.get("metadata") or {}).get("labels") or {}).get(KUEUE_JOB_UID_LABEL, ""))
            if ref is None:
                continue
            local = (workload.get("spec") or {}).get("queueName") or ""
            if local not in cluster_queues:
                try:
                    cluster_queues[local] = (custom.get_namespaced_custom_object(
                        KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", local).get("spec") or {}).get(
                        "clusterQueue")
                except CLIENT_ERRORS:
                    cluster_queues[local] = None
            where = f"ClusterQueue {cluster_queues[local]}" if cluster_queues[local] else f"LocalQueue {local}"
            statuses[ref] = JobStatus(ref, JobState.PENDING, reason="Queued", message=quota_message(workload, where))

    def _pending_reasons(self, namespace: str, refs: list[JobRef], statuses: dict[JobRef, JobStatus],
                         jobsets: dict[str, dict[str, Any]]) -> None:
        """Why pending JobSets wait: read again when a JobSet pends that did not at the last read, or
        PENDING_REASONS_TTL after it; in between each keeps the reason read then (a JobSet scheduled meanwhile is
        no longer pending and takes none)."""
        read_at, found = self._pending_read.get(namespace, (0.0, {}))
        now = time.monotonic()
        if now - read_at < self.PENDING_REASONS_TTL and all(ref.job_id in found for ref in refs):
            for ref in refs:
                if (kept := found[ref.job_id]) is not None:
                    statuses[ref] = replace(statuses[ref], reason=kept[0], message=kept[1])
            return
        before = {ref: statuses[ref] for ref in refs}
        self._scheduling_reasons(namespace, refs, statuses, jobsets)
        self._pending_read[namespace] = (now, {
            ref.job_id: None if statuses[ref] is before[ref] else (statuses[ref].reason, statuses[ref].message)
            for ref in refs})

    def _scheduling_reasons(self, namespace: str, refs: list[JobRef], statuses: dict[JobRef, JobStatus],
                            jobsets: dict[str, dict[str, Any]]) -> None:
        """Why a pending JobSet waits: the scheduler's reason on one of its pods; with no pod at all, the last
        warning about the JobSet or its Jobs (JobCreationFailed, a Job's FailedCreate when a quota or an
        admission webhook refuses its pods), read in one event list for the namespace only then."""
        names = ",".join(ref.job_id.split("/", 1)[1] for ref in refs)
        pods = self._call("list pods", self._core().list_namespaced_pod, namespace,
                          label_selector=f"{JOBSET_NAME_LABEL} in ({names})")
        podless = []
        for ref in refs:
            name = ref.job_id.split("/", 1)[1]
            mine = [pod for pod in pods.items if (pod.metadata.labels or {}).get(JOBSET_NAME_LABEL) == name]
            if not mine:
                podless.append(ref)
            for pod in mine:
                for condition in (pod.status.conditions or []) if pod.status else []:
                    if condition.type == "PodScheduled" and condition.status == "False":
                        statuses[ref] = JobStatus(ref, JobState.PENDING, reason=condition.reason,
                                                  message=condition.message)
                        break
        if podless:
            self._creation_warnings(namespace, podless, statuses, jobsets)

    def _creation_warnings(self, namespace: str, refs: list[JobRef], statuses: dict[JobRef, JobStatus],
                           jobsets: dict[str, dict[str, Any]]) -> None:
        events = self._call("list events", self._core().list_namespaced_event, namespace,
                            field_selector="type=Warning").items
        for ref in refs:
            name = ref.job_id.split("/", 1)[1]
            last = creation_warning(events, name, jobsets.get(name) or {})
            if last is not None:
                statuses[ref] = JobStatus(ref, JobState.PENDING, reason=last.reason, message=last.message)

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        """Suspends the JobSet and marks it cancelled: its pods get SIGTERM, then SIGKILL after their grace
        period, and the JobSet stays as the record of the job (Cancelled) until ``remove`` deletes it."""
        if signal not in (None, "TERM", "KILL"):
            raise self.unsupported("cancel --signal", f"pods are stopped with SIGTERM (then SIGKILL), not SIG{signal}")
        from bridge.adapters.kubernetes.client import ApiException

        namespace, name = ref.job_id.split("/", 1)
        patch = {"metadata": {"annotations": {CANCELLED_ANNOTATION: "true"}}, "spec": {"suspend": True}}
        try:
            current = self._custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            if jobset_state(current)[0].finished:
                return  # it ended on its own: its record stays as it is
            self._custom().patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
        except ApiException as exc:
            if exc.status != 404:  # already gone: nothing left to stop
                from bridge.adapters.kubernetes.client import translate

                raise translate(exc, "suspend jobset") from None

    def remove(self, ref: JobRef) -> None:
        """Deletes the JobSet and what it owns (a rerun reuses the name); returns when it is gone."""
        from bridge.adapters.kubernetes.client import ApiException, client, translate

        namespace, name = ref.job_id.split("/", 1)
        custom = self._custom()
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                   body=client.V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as exc:
            if exc.status != 404:
                raise translate(exc, "delete jobset") from None
        # objects created before the JobSet owned them (an interrupted submit) go explicitly; the SSH Secret by
        # its name, since the operator may read Secrets only by name (it may not list them)
        core = self._core()
        if ref.uid:
            self._remove_secret(namespace, ssh_secret_name(name, ref.uid), ref.uid)
        items = self._call("list configmaps", core.list_namespaced_config_map, namespace,
                           label_selector=f"{UID_LABEL}={ref.uid}").items if ref.uid else []
        for item in items:
            try:
                core.delete_namespaced_config_map(item.metadata.name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise translate(exc, "delete configmaps") from None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise translate(exc, "read jobset") from None
            time.sleep(0.5)
        raise BackendUnavailable("kubernetes", f"JobSet {namespace}/{name} was not deleted within 60s")

    def _remove_secret(self, namespace: str, name: str, uid: str) -> None:
        """Deletes Secret *namespace*/*name* if it is the one made for TrainJob *uid* (and no other took the name
        meanwhile: the delete is conditional on the Secret's own uid)."""
        from bridge.adapters.kubernetes.client import ApiException, client, translate

        core = self._core()
        try:
            secret = core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise translate(exc, "read secret") from None
        if (secret.metadata.labels or {}).get(UID_LABEL) != uid:
            return  # another TrainJob's (the name is reused by a rerun), or not ours at all
        try:
            core.delete_namespaced_secret(name, namespace, body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=secret.metadata.uid)))
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or replaced since it was read: not ours to delete
                raise translate(exc, "delete secret") from None

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        """Logs of the JobSet's pods — the trainer's ``node`` container, an initializer's container of its
        job's name — as the API server serves them (needs kubelets).

        With *follow*, every pod's log streams at once, line by line with the pod's name in front, until
        every pod's container has ended."""
        namespace, name = ref.job_id.split("/", 1)
        pods = self._call("list pods", self._core().list_namespaced_pod, namespace,
                          label_selector=f"{JOBSET_NAME_LABEL}={name}")
        if not follow:
            for pod in sorted(pods.items, key=lambda p: p.metadata.name):
                text = self._pod_log(pod.metadata.name, namespace, _log_container(pod))
                if text is not None:
                    yield f"==> {pod.metadata.name} <==\n{text}"
            return
        yield from self._follow(ref, namespace, name)

    def _pod_log(self, pod: str, namespace: str, container: str = "node") -> str | None:
        """The pod's log, or None when the pod is gone since it was listed (a failed JobSet's pods are deleted
        as it ends: their logs went with them)."""
        from bridge.adapters.kubernetes.client import CLIENT_ERRORS, ApiException, translate

        try:
            log: str = self._core().read_namespaced_pod_log(pod, namespace, container=container)
            return log
        except ApiException as exc:
            if exc.status == 404 and self._pod_gone(pod, namespace):
                return None
            raise translate(exc, "read log") from None
        except CLIENT_ERRORS as exc:
            raise translate(exc, "read log") from None

    def _pod_gone(self, pod: str, namespace: str) -> bool:
        """Whether *pod* no longer exists (a 404 for its log can also mean the node serves no logs: kwok)."""
        from bridge.adapters.kubernetes.client import ApiException

        try:
            self._core().read_namespaced_pod(pod, namespace)
        except ApiException as exc:
            gone: bool = exc.status == 404
            return gone
        return False

    def _follow(self, ref: JobRef, namespace: str, name: str, interval: float = 1.0) -> Iterator[str]:
        """Every pod's log as it comes, line by line, until the job has ended and every stream with it. Pods
        are picked up as their container starts: right after submit there are none yet, and an MPI launcher's
        pod only comes once the others are ready."""
        import queue
        import threading

        lines: queue.Queue[str | Exception | None] = queue.Queue()

        def pump(pod: str, container: str) -> None:
            try:
                response = self._call("follow log", self._core().read_namespaced_pod_log, pod, namespace,
                                      container=container, follow=True, _preload_content=False)
                for raw in response.stream():
                    lines.put(raw.decode("utf-8", errors="replace"))
            except Exception as exc:  # noqa: BLE001 - handed to the reading thread, which raises it
                lines.put(exc)
            finally:
                lines.put(None)

        followed: set[str] = set()
        streaming = 0
        while True:
            pods = self._call("list pods", self._core().list_namespaced_pod, namespace,
                              label_selector=f"{JOBSET_NAME_LABEL}={name}").items
            for pod in sorted(pods, key=lambda p: p.metadata.name):
                container = _log_container(pod)
                statuses = [c for c in (pod.status.container_statuses or []) if c.name == container] \
                    if pod.status else []
                started = statuses and statuses[0].state and (statuses[0].state.running or statuses[0].state.terminated)
                if pod.metadata.name not in followed and started:
                    followed.add(pod.metadata.name)
                    streaming += 1
                    threading.Thread(target=pump, args=(pod.metadata.name, container), daemon=True).start()
            ended = self.poll([ref])[ref].state.finished
            deadline = time.monotonic() + interval
            while (remaining := deadline - time.monotonic()) > 0 or (ended and streaming):
                try:
                    item = lines.get(timeout=max(remaining, 0.05))
                except queue.Empty:
                    if ended and not streaming:
                        break
                    continue
                if item is None:
                    streaming -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
            if ended and not streaming:
                return

    def ref(self, job_id: str, identity: Identity | None = None) -> JobRef:
        namespace, _, name = job_id.rpartition("/")
        ns = namespace or self._namespace(identity.namespace if identity else "default")
        if not namespace and identity is not None and name == identity.name:
            # the TrainJob's name: its JobSet's, where it runs
            name = jobset_name(identity.namespace, name, ns, tenant=tenant_of(self.cluster) is not None)
        return JobRef(self.cluster.name, "kubernetes", f"{ns}/{name}", identity.uid if identity else "", name)

    def list_jobs(self) -> list[JobStatus]:
        ns = self._namespace("default")
        listing = self._call("list jobsets", self._custom().list_namespaced_custom_object, GROUP, VERSION, ns,
                             PLURAL, label_selector=UID_LABEL)
        return [self._jobset_status(JobRef(self.cluster.name, "kubernetes", f"{ns}/{i['metadata']['name']}",
                                           i["metadata"]["labels"][UID_LABEL], i["metadata"]["name"]), i)
                for i in listing.get("items", [])]

    def capacity(self, plan: LaunchPlan) -> Capacity:
        """Nodes and active pods, one listing each, against one trainer pod of the JobSet *plan* renders."""
        from bridge.adapters.kubernetes import capacity
        from bridge.adapters.kubernetes.render import jobset, trainer_pod_spec

        pod_spec = trainer_pod_spec(jobset(plan)[0])
        api = self._core().api_client
        nodes = self._call("list nodes", self._core().list_node)
        pods = self._call("list pods", self._core().list_pod_for_all_namespaces, field_selector=capacity.ACTIVE_PODS)
        return capacity.count([api.sanitize_for_serialization(node) for node in nodes.items],
                              [api.sanitize_for_serialization(pod) for pod in pods.items], pod_spec)

    def size(self) -> ClusterSize:
        from bridge.adapters.kubernetes import capacity

        nodes = self._call("list nodes", self._core().list_node).items
        return capacity.size([self._core().api_client.sanitize_for_serialization(node) for node in nodes])

    def check(self) -> str:
        from bridge.adapters.kubernetes.client import client

        version = self._call("version", client.VersionApi(self.api).get_code)
        return f"Kubernetes {version.git_version}"


def _ssh_secret_data(name: str) -> dict[str, str]:
    """Fresh keys, base64 for the API: the client keypair in Kubeflow's Secret layout (ssh-privatekey,
    ssh-publickey) and the host keypair every pod's sshd presents (pinned in known_hosts by the launcher)."""
    from bridge.adapters.kubernetes.render import HOST_KEY_SECRET_KEY
    from bridge.mpi.ssh import CLIENT_KEY, HOST_KEY, create_job_keys

    with tempfile.TemporaryDirectory(prefix="hpcbridge-keys-") as tmp:
        keys = create_job_keys(Path(tmp) / "keys", name)
        files = {"ssh-privatekey": CLIENT_KEY, "ssh-publickey": f"{CLIENT_KEY}.pub",
                 HOST_KEY_SECRET_KEY: HOST_KEY, f"{HOST_KEY_SECRET_KEY}.pub": f"{HOST_KEY}.pub"}
        return {key: base64.b64encode((keys / file).read_bytes()).decode() for key, file in files.items()}
