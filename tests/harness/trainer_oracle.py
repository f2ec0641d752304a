"""Kubeflow Trainer as the oracle for the JobSets hpc-bridge renders.

For one TrainJob file: its runtimes (if the file has any) and the TrainJob are applied to a cluster running
the upstream Trainer controller (``KubeCluster.start_trainer``), which creates its JobSet; the same file is
rendered with ``hpcbridge render --to kubernetes`` and that JobSet is created with a server-side dry run in
another namespace, so both have been through the same API server defaulting and JobSet webhooks. The two are
compared value by value; the differences hpc-bridge makes on purpose (``KNOWN_DIFFERENCES``, also listed in
the README) are removed first, and anything left is named by its path.
"""

from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")

#: what hpc-bridge adds or does differently on purpose, as paths (``*`` matches one path segment's text):
#: its identity on the JobSet and every pod; the job's environment (HPCBRIDGE_*); and the time limit, which
#: Kubeflow's controller enforces itself while a JobSet hpc-bridge submits has no controller watching it, so
#: each Job carries it as its activeDeadlineSeconds
KNOWN_DIFFERENCES = (
    "spec.replicatedJobs[*].template.spec.activeDeadlineSeconds",
    "metadata.labels.hpcbridge.io/uid",
    "metadata.labels.trainer.kubeflow.org/trainjob-name",
    "spec.replicatedJobs[*].template.spec.template.metadata.labels.hpcbridge.io/uid",
    "spec.replicatedJobs[*].template.spec.template.metadata.labels.trainer.kubeflow.org/trainjob-name",
    "spec.replicatedJobs[*].template.spec.template.spec.containers[*].env[HPCBRIDGE_JOB_UID]",
    "spec.replicatedJobs[*].template.spec.template.spec.containers[*].env[HPCBRIDGE_JOB_NAME]",
    "spec.replicatedJobs[*].template.spec.template.spec.containers[*].env[HPCBRIDGE_JOB_NAMESPACE]",
    "spec.replicatedJobs[*].template.spec.template.spec.containers[*].env[HPCBRIDGE_CLUSTER]",
    "spec.replicatedJobs[*].template.spec.template.spec.containers[*].env[HPCBRIDGE_DATASET_DIR]",
    "spec.replicatedJobs[*].template.spec.template.spec.containers[*].env[HPCBRIDGE_MODEL_DIR]",
    # the MPI pods' extras for `hpcbridge launch`: the job's sshd host keys and the client key under the name the
    # launch reads (Secret items 3-5), and the hostfile on every pod, not only on the launcher
    # the SSH Secret's name carries a digest of the TrainJob's uid (Kubeflow's <name>-mpi-ssh-auth is guessable)
    "spec.replicatedJobs[*].template.spec.template.spec.volumes[mpi-ssh-auth].secret.secretName",
    "spec.replicatedJobs[*].template.spec.template.spec.volumes[mpi-ssh-auth].secret.items[3]",
    "spec.replicatedJobs[*].template.spec.template.spec.volumes[mpi-ssh-auth].secret.items[4]",
    "spec.replicatedJobs[*].template.spec.template.spec.volumes[mpi-ssh-auth].secret.items[5]",
    "spec.replicatedJobs[*].template.spec.template.spec.volumes[mpi-hostfile]",
    "spec.replicatedJobs[*].template.spec.template.spec.containers[*].volumeMounts[mpi-hostfile]",
    # hpc-bridge's built-in runtimes fail a job on its first failed pod and restart nothing (HPC semantics)
    "spec.replicatedJobs[*].template.spec.backoffLimit",
    "spec.replicatedJobs[*].template.spec.podFailurePolicy",
    "spec.replicatedJobs[*].template.spec.template.spec.restartPolicy",
)
#: the MPI worker pods serve the job's sshd through `hpcbridge launch` instead of the runtime's own sshd
MPI_WORKER_ARGV = "spec.replicatedJobs[node].template.spec.template.spec.containers[node].argv"
#: Kubeflow applies no pod policy: the cluster hpc-bridge renders for allows every pod field (its default policy
#: refuses some of the corpus's, e.g. a runtime patch's serviceAccountName)
PERMISSIVE_POD_POLICY = {"serviceAccountNames": ["*"], "volumes": ["secret", "configMap", "persistentVolumeClaim",
                                                                   "projected", "hostPath", "other"],
                         "privileged": True, "allowPrivilegeEscalation": True, "hostNetwork": True, "hostPID": True,
                         "hostIPC": True, "capabilities": ["*"], "runAsRoot": True}


@dataclass
class Outcome:
    name: str
    verdict: str  # "identical", "different", or what went wrong
    differences: list[str] = field(default_factory=list)


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf by path; lists of named items (containers, env, replicatedJobs…) keyed by name."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        # an empty mapping says nothing ({} and absent are the same object to the API server)
        for key, child in value.items():
            out.update(flatten(child, f"{path}.{key}" if path else key))
    elif isinstance(value, list):
        if not value:
            out[path] = []
        named = all(isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)
        for index, item in enumerate(value):
            key = item["name"] if named else str(index)
            out.update(flatten(item, f"{path}[{key}]"))
    else:
        out[path] = value
    return out


def _known(path: str) -> bool:
    for pattern in KNOWN_DIFFERENCES:
        regex = re.escape(pattern).replace(r"\*", r"[^\]]*")
        if re.match(rf"^{regex}(?:$|[.\[])", path):
            return True
    return False


def comparable(jobset: dict[str, Any]) -> dict[str, Any]:
    """What a JobSet's author decides: its labels, annotations and spec (not names, uids, status, owners).

    Each container's command and args become one ``argv``, unwrapped from ``hpcbridge launch ... --`` where
    hpc-bridge runs the command through its bootstrap: the command itself must be Kubeflow's."""
    from bridge.adapters.kubernetes.render import launched_command

    metadata = jobset.get("metadata") or {}
    spec = copy.deepcopy(jobset.get("spec") or {})
    for job in spec.get("replicatedJobs") or []:
        pod = ((job.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            argv = launched_command(container)
            container.pop("command", None)
            container.pop("args", None)
            if argv:
                container["argv"] = argv
    return {"metadata": {key: metadata[key] for key in ("labels", "annotations") if metadata.get(key)},
            "spec": spec}


def compare(oracle: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    a, b = flatten(comparable(oracle)), flatten(comparable(ours))
    with_launcher = any(job.get("name") == "launcher" for job in (ours.get("spec") or {}).get("replicatedJobs") or [])
    problems = []
    for path in sorted(set(a) | set(b)):
        if with_launcher and (path == MPI_WORKER_ARGV or path.startswith(MPI_WORKER_ARGV + "[")):
            continue
        if _known(path) or a.get(path) == b.get(path):
            continue
        if path not in b:
            problems.append(f"{path}: {_show(a[path])} from Kubeflow, missing from hpc-bridge")
        elif path not in a:
            problems.append(f"{path}: {_show(b[path])} added by hpc-bridge")
        else:
            problems.append(f"{path}: {_show(a[path])} from Kubeflow, {_show(b[path])} from hpc-bridge")
    return problems


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


class Oracle:
    """One cluster with the Trainer controller; TrainJob files checked against it one by one."""

    def __init__(self, cluster, trainer_src: Path, kubeflow_ns: str = "kf", render_ns: str = "hb") -> None:
        from kubernetes import client

        self.cluster, self.src = cluster, trainer_src
        self.runtimes_dir = trainer_src / "manifests" / "base" / "runtimes"
        self.api = cluster.api_client()
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.kf_ns, self.hb_ns = kubeflow_ns, render_ns
        for ns in (kubeflow_ns, render_ns):
            self.core.create_namespace({"metadata": {"name": ns}})
        self._shipped_applied = False

    def apply_shipped_runtimes(self) -> None:
        """Trainer's own runtimes, as a cluster admin installs them (what a TrainJob's runtimeRef names)."""
        if self._shipped_applied:
            return
        for path in sorted(self.runtimes_dir.rglob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if doc and doc.get("kind") == "ClusterTrainingRuntime":
                    self._create_runtime(doc)
        self._shipped_applied = True

    def _create_runtime(self, doc: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            if doc["kind"] == "ClusterTrainingRuntime":
                self.custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", doc)
            else:
                doc = {**doc, "metadata": {**doc["metadata"], "namespace": self.kf_ns}}
                self.custom.create_namespaced_custom_object(GROUP, VERSION, self.kf_ns, "trainingruntimes", doc)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def kubeflow_jobset(self, path: Path, timeout: float = 60.0) -> dict[str, Any]:
        """Apply the file's runtimes and TrainJob; the JobSet Kubeflow's controller creates for it."""
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        for doc in docs:
            if doc["kind"] in ("ClusterTrainingRuntime", "TrainingRuntime"):
                self._create_runtime(doc)
        trainjob = next(d for d in docs if d["kind"] == "TrainJob")
        trainjob = {**trainjob, "metadata": {**trainjob["metadata"], "namespace": self.kf_ns}}
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.custom.create_namespaced_custom_object(GROUP, VERSION, self.kf_ns, "trainjobs", trainjob)
                break
            except ApiException as exc:
                # Trainer's webhook looks the runtime up in its informer cache, which may not have seen the one
                # just created: "specified clusterTrainingRuntime must be created before the TrainJob"
                if exc.status != 403 or "must be created before" not in (exc.body or "") \
                        or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        name = trainjob["metadata"]["name"]

        while True:
            try:
                return self.custom.get_namespaced_custom_object(*JOBSET[:2], self.kf_ns, JOBSET[2], name)
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def our_objects(self, path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """hpc-bridge's JobSet for the file, after the same API server defaulting (a server-side dry run),
        and the other objects it renders (the MPI hostfile ConfigMap and SSH Secret)."""
        from bridge import service
        from bridge.api.cluster import BridgeCluster

        permissive = BridgeCluster.model_validate({
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "kubernetes"},
            "spec": {"type": "kubernetes", "kubernetes": {"podPolicy": PERMISSIVE_POD_POLICY}}})
        prepared = service.prepare(service.read_input(str(path)), cluster="kubernetes",
                                   configured={"kubernetes": permissive}, runtimes=[str(self.runtimes_dir)])
        objects = [doc for f in prepared.artifact.files for doc in yaml.safe_load_all(f.content) if doc]
        jobset = next(doc for doc in objects if doc.get("kind") == "JobSet")
        jobset = {**jobset, "metadata": {**jobset["metadata"], "namespace": self.hb_ns}}
        defaulted = self.custom.create_namespaced_custom_object(*JOBSET[:2], self.hb_ns, JOBSET[2], jobset,
                                                                dry_run="All")
        return defaulted, [doc for doc in objects if doc.get("kind") != "JobSet"]

    def compare_mpi_objects(self, objects: list[dict[str, Any]]) -> list[str]:
        """The hostfile ConfigMap's data, and the SSH Secret's name, type and immutability (its keys are made
        at submit, never rendered), against the objects Kubeflow's controller made."""
        problems = []
        for obj in objects:
            name = obj["metadata"]["name"]
            if obj["kind"] == "ConfigMap":
                theirs = self.core.read_namespaced_config_map(name, self.kf_ns)
                if dict(theirs.data or {}) != obj.get("data"):
                    problems.append(f"ConfigMap {name}: data {theirs.data!r} from Kubeflow, {obj.get('data')!r} "
                                    "from hpc-bridge")
            elif obj["kind"] == "Secret":
                # Kubeflow's name for it; ours carries a digest of the uid (KNOWN_DIFFERENCES)
                trainjob = obj["metadata"]["labels"]["trainer.kubeflow.org/trainjob-name"]
                theirs = self.core.read_namespaced_secret(f"{trainjob}-mpi-ssh-auth", self.kf_ns)
                if (theirs.type, bool(theirs.immutable)) != (obj.get("type"), bool(obj.get("immutable"))):
                    problems.append(f"Secret {name}: type/immutable {theirs.type}/{theirs.immutable} from Kubeflow, "
                                    f"{obj.get('type')}/{obj.get('immutable')} from hpc-bridge")
        return problems

    def check(self, path: Path) -> Outcome:
        name = path.name
        try:
            oracle = self.kubeflow_jobset(path)
        except Exception as exc:  # noqa: BLE001 - reported as the outcome
            body = getattr(exc, "body", None) or str(exc)
            return Outcome(name, f"Kubeflow made no JobSet: {type(exc).__name__}: {str(body)[-400:]}")
        try:
            ours, others = self.our_objects(path)
        except Exception as exc:  # noqa: BLE001
            return Outcome(name, f"hpc-bridge made no JobSet: {type(exc).__name__}: {str(exc)[:300]}")
        problems = compare(oracle, ours) + self.compare_mpi_objects(others)
        return Outcome(name, "different" if problems else "identical", problems)

