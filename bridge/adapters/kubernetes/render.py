"""LaunchPlan → JobSet (+ MPI Secret and hostfile ConfigMap), following Kubeflow Trainer's conventions.

The runtime's JobSet template (already merged with runtime patches in plan.py) is the starting point;
this module does what Kubeflow's runtime plugins do: trainer overrides on container ``node``, pod
counts, PET_* for torch, SSH Secret + hostfile for MPI, identity labels. Pure: no client imported here.
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.adapters.kubernetes.policy import check_pod_policy
from bridge.annotations import (
    ACCOUNT_ANNOTATION,
    CONSTRAINT_ANNOTATION,
    FEATURE_LABEL_PREFIX,
    KEYS_ANNOTATION,
    PARTITION_ANNOTATION,
    PREFIX,
    QOS_ANNOTATION,
    UID_LABEL,
)
from bridge.api.cluster import PodPolicy
from bridge.api.loader import dump_yaml
from bridge.api.names import check_labels
from bridge.errors import InvalidSpec

if TYPE_CHECKING:
    from fractions import Fraction

    from bridge.api.storage import StageSource
from bridge.mpi.bootstrap import LaunchSpec, launch_framework
from bridge.mpi.hostfile import Peer, hostfile_for
from bridge.mpi.ssh import CLIENT_KEY, DEFAULT_PORT, HOST_KEY
from bridge.plan import (
    ANCESTOR_LABEL,
    MPI_LAUNCHERS,
    QUEUE_LABEL,
    TORCHTUNE_ENTRYPOINT,
    TRAINER_CONTAINER,
    Launcher,
    LaunchPlan,
    check_identity,
    job_environment,
    script_env,
    torch_nproc,
    torchtune_arguments,
)

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
NAME_LABEL = "trainer.kubeflow.org/trainjob-name"
#: Secret keys of the job's sshd host keypair, beside Kubeflow's ssh-privatekey / ssh-publickey (the client's):
#: every pod's sshd presents it and known_hosts pins it, so no host key is ever accepted unseen
HOST_KEY_SECRET_KEY = "hpcbridge-host-key"
#: where every MPI pod finds the hostfile ConfigMap (Kubeflow's path)
HOSTFILE_PATH = "/etc/mpi/hostfile"
#: launchers that run through ``hpcbridge launch`` in the pods (Flux and batch scripts bring their own)
_LAUNCHED = frozenset({*MPI_LAUNCHERS, Launcher.TORCHRUN, Launcher.PLAIN, Launcher.SCRIPT})
#: the nodes reach each other over the job's sshd: MPI ranks, and a batch script's steps (the srun shim)
_OVER_SSH = frozenset({*MPI_LAUNCHERS, Launcher.SCRIPT})
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True)
class Target:
    """Where the JobSet (and what comes with it) is created, and under which name."""

    namespace: str
    name: str

    @classmethod
    def of(cls, plan: LaunchPlan, namespace: str | None = None) -> Target:
        return cls(namespace or plan.namespace,
                   jobset_name(plan.namespace, plan.name, namespace, tenant=plan.tenant is not None))


def jobset_name(trainjob_namespace: str, trainjob_name: str, namespace: str | None, tenant: bool = True) -> str:
    """The JobSet of TrainJob *trainjob_namespace*/*trainjob_name* created in *namespace*: the TrainJob's name
    in its own namespace; a tenant's (the operator's) in another namespace, which several tenants' namespaces
    may share, is the name with a digest of the TrainJob's namespace and name, so that same-named TrainJobs of
    two namespaces never want one name (deterministic: render stays pure). The CLI's user names the namespace
    its jobs go to (``spec.kubernetes.namespace``) and keeps the TrainJob's name there."""
    if not namespace or namespace == trainjob_namespace or not tenant:
        return trainjob_name
    digest = hashlib.sha256(f"{trainjob_namespace}/{trainjob_name}".encode()).hexdigest()[:10]
    # a DNS-1035 label of 63 at most, like the name itself: the stem starts with the name's letter
    return f"{trainjob_name[:63 - 11]}-{digest}"


def ssh_secret_name(jobset_name: str, uid: str) -> str:
    """The MPI SSH key Secret of a JobSet: a digest of the TrainJob's uid in its name, which another tenant
    cannot know, so no pod of theirs can name it (Kubeflow's ``<name>-mpi-ssh-auth`` is guessable)."""
    return f"{jobset_name}-mpi-ssh-{hashlib.sha256(uid.encode()).hexdigest()[:16]}"


def hostfile_configmap_name(jobset_name: str) -> str:
    return f"{jobset_name}-mpi-hostfile"


def _labels(plan: LaunchPlan) -> dict[str, str]:
    return {NAME_LABEL: plan.name, UID_LABEL: plan.uid}


#: resources the API server takes in requests alone; any other (nvidia.com/gpu…) needs a limit to match
_OVERCOMMITTABLE = ("cpu", "memory", "ephemeral-storage")


def _container_resources(plan: LaunchPlan) -> dict[str, Any]:
    """Requests and limits as the TrainJob and runtime give them (each merged per key, as Kubeflow does). An
    extended resource asked for only in requests also gets it as its limit: the API server refuses such pods."""
    requests = dict(plan.resources.given_requests)
    limits = dict(plan.resources.given_limits)
    for name, value in requests.items():
        if name not in limits and name not in _OVERCOMMITTABLE and not name.startswith("hugepages-"):
            limits[name] = value
    return {key: value for key, value in (("limits", limits), ("requests", requests)) if value}


def _trainer_job(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    for job in jobs:
        labels = ((job.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_LABEL) == "trainer":
            return job
    return next((job for job in jobs if job.get("name") == "node"), None)


def trainer_pod_spec(js: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of the JobSet's trainer (or MPI node) pods: what each of the plan's nodes asks for."""
    jobs = js["spec"]["replicatedJobs"]
    job = next((j for j in jobs if j.get("name") == "node"), None) or _trainer_job(jobs) or jobs[0]
    return _pod_spec(job)


def _pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    job_spec = job.setdefault("template", {}).setdefault("spec", {})
    pod: dict[str, Any] = job_spec.setdefault("template", {}).setdefault("spec", {})
    return pod


def _node_container(job: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in _pod_spec(job).get("containers", []) if c.get("name") == TRAINER_CONTAINER), None)


def _set_env(container: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    env = [e for e in container.get("env", []) if e["name"] not in {x["name"] for x in entries}]
    container["env"] = env + entries


def _initializers(plan: LaunchPlan, jobs: list[dict[str, Any]]) -> None:
    """Kubeflow's JobSet plugin: each initializer job's container of its name gets STORAGE_URI and the
    initializer's env (upserted in place), and its Secret as envFrom."""
    if plan.staging is None:
        return
    for source in plan.staging.sources:
        for job in jobs:
            labels = ((job.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if labels.get(ANCESTOR_LABEL) != source.container:
                continue
            for container in _pod_spec(job).get("containers", []):
                if container.get("name") != source.container:
                    continue
                env = container.setdefault("env", [])
                for name, value in (("STORAGE_URI", source.uri), *source.env):
                    entry = next((e for e in env if e.get("name") == name), None)
                    if entry is None:
                        env.append({"name": name, "value": value})
                    else:
                        entry.clear()
                        entry.update({"name": name, "value": value})
                if source.secret:
                    container.setdefault("envFrom", []).append({"secretRef": {"name": source.secret}})
                if source.uri.lower().startswith("pvc://"):
                    _mount_source_claim(_pod_spec(job), container, source)


def _mount_source_claim(pod: dict[str, Any], container: dict[str, Any], source: StageSource) -> None:
    """``pvc://claim/path``: data already on a claim of the namespace. The initializer pod mounts the claim
    read-only where ``hpcbridge initialize`` copies it from into the ``initializer`` volume (Kubeflow's own
    initializer images read hf:// and s3:// only)."""
    from bridge.api.storage import PVC_SOURCE_MOUNT, PVC_SOURCE_VOLUME, parse_storage_uri

    claim = parse_storage_uri(source.uri, source.role).authority
    pod.setdefault("volumes", []).append({"name": PVC_SOURCE_VOLUME,
                                          "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    container.setdefault("volumeMounts", []).append({"name": PVC_SOURCE_VOLUME, "mountPath": PVC_SOURCE_MOUNT,
                                                     "readOnly": True})


def _set_pod_count(job: dict[str, Any], count: int) -> None:
    spec = job.setdefault("template", {}).setdefault("spec", {})
    spec["parallelism"] = count
    spec["completions"] = count


def hostnames(jobset_name: str, job_name: str, count: int, subdomain: str) -> list[str]:
    return [f"{jobset_name}-{job_name}-0-{i}.{subdomain}" for i in range(count)]


def jobset(plan: LaunchPlan, target: Target | None = None) -> tuple[dict[str, Any], list[Peer]]:
    """The JobSet (in *target*, by default the TrainJob's own namespace and name), and for MPI the peers its
    hostfile lists."""
    check_identity(plan)
    target = target or Target.of(plan)
    peers: list[Peer] = []
    spec = copy.deepcopy(dict(plan.jobset_template))
    jobs: list[dict[str, Any]] = spec.setdefault("replicatedJobs", [])
    if not jobs:
        if not plan.image:
            raise InvalidSpec("spec.trainer.image", None,
                              f"runtime {plan.runtime_name!r} has no JobSet template, so Kubernetes needs an image")
        jobs.append({"name": "node", "replicas": 1, "template": {
            "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": TRAINER_CONTAINER}]}}}}})
        if plan.launcher == Launcher.SCRIPT:
            # sbatch runs a failed script once; a retried rank 0 would also wait for peers that have left
            jobs[0]["template"]["spec"]["backoffLimit"] = 0
    trainer = _trainer_job(jobs)
    assert trainer is not None  # plan.py found it, or we just built it
    container = _node_container(trainer)
    if container is None:
        raise InvalidSpec(f"runtime {plan.runtime_name}: replicatedJobs[{trainer['name']}]", None,
                          "no container named 'node'")
    if plan.image:
        container["image"] = plan.image
    elif not container.get("image"):
        raise InvalidSpec("spec.trainer.image", None, "Kubernetes needs an image (TrainJob or runtime)")
    runtime_command = list(container.get("command") or [])
    # command and args as Kubeflow sets them, each from the TrainJob or else the runtime; with neither, the
    # image's entrypoint runs
    for key, value in (("command", plan.container_command), ("args", plan.container_args)):
        if value:
            container[key] = list(value)
        else:
            container.pop(key, None)
    user_env: list[dict[str, Any]] = [{"name": e.name, **({"value": e.value} if e.value is not None else {}),
                 **({"valueFrom": dict(e.value_from)} if e.value_from else {})} for e in plan.env]
    user_env += [{"name": name, "value": value} for name, value in (*job_environment(plan),
                                                                      *script_env(plan).items())]
    _set_env(container, user_env)
    resources = _container_resources(plan)
    if resources:
        container["resources"] = copy.deepcopy(resources)

    subdomain = (spec.get("network") or {}).get("subdomain") or target.name
    if not isinstance(subdomain, str) or len(subdomain) > 253 or not _DNS_SUBDOMAIN.fullmatch(subdomain):
        # it is written into every hostname of the MPI hostfile: one line per host, nothing else
        raise InvalidSpec(f"runtime {plan.runtime_name}: spec.template.spec.network.subdomain", subdomain,
                          "must be an RFC 1123 subdomain: lowercase letters, digits, '-' and '.'")
    node_job = next((job for job in jobs if job.get("name") == "node"), trainer)
    # the first pod of the trainer's replicated job coordinates (torch master, JAX coordinator, XGBoost tracker)
    master_host = hostnames(target.name, trainer["name"], 1, subdomain)[0]
    if plan.launcher in _OVER_SSH:
        peers = _mpi(plan, target.name, jobs, trainer, node_job, container, subdomain, user_env, resources)
    else:
        _set_pod_count(trainer, plan.nodes)
        # Kubeflow's framework plugins add their environment only when the TrainJob has a trainer section
        if plan.trainer_given:
            if plan.launcher == Launcher.TORCHRUN:
                _torch(plan, container, runtime_command, master_host)
            elif plan.framework == "jax":
                _jax(plan, container, master_host)
            elif plan.framework == "xgboost":
                _xgboost(plan, container, master_host)
    if plan.env_injection:
        _inject_torch_env(plan, jobs, master_host)
    if plan.launcher in _LAUNCHED and (container.get("command") or container.get("args")):
        _launch(plan, target.name, container, trainer, node_job, subdomain, [e["name"] for e in user_env])
    _initializers(plan, jobs)
    counted = node_job if plan.launcher in _OVER_SSH else trainer
    for job in jobs:
        if job is not counted:
            # every other replicated job (initializers, an MPI launcher) runs one pod, stated as Kubeflow states it
            job_spec = job.setdefault("template", {}).setdefault("spec", {})
            job_spec.setdefault("parallelism", 1)
            job_spec.setdefault("completions", job_spec["parallelism"])

    placement = _placement(plan)
    for job in jobs:
        job_spec = job.setdefault("template", {}).setdefault("spec", {})
        if plan.time_limit_seconds:
            job_spec["activeDeadlineSeconds"] = plan.time_limit_seconds
        pod_meta = job_spec.setdefault("template", {}).setdefault("metadata", {})
        pod_meta.setdefault("labels", {}).update(_labels(plan))
        if plan.pod_group is not None:
            _join_gang(plan, target.name, pod_meta, _pod_spec(job))
        _place(_pod_spec(job), placement)
        if plan.options.account:
            pod_meta["labels"][ACCOUNT_ANNOTATION] = plan.options.account
    if plan.image_map or plan.image_pull_policy:
        _cluster_images(plan, jobs)
    spec["suspend"] = bool(plan.suspend)  # stated either way, as Kubeflow's controller does
    # the JobSet's own metadata as Kubeflow gives it (runtime template, then runtime patches), plus identity
    labels = {**dict(plan.jobset_metadata.get("labels") or {}), **_labels(plan)}
    if plan.options.account:
        labels[ACCOUNT_ANNOTATION] = plan.options.account
    if plan.queue:
        labels[QUEUE_LABEL] = plan.queue  # Kueue suspends the JobSet at creation and admits it from this queue
    _check_labels("metadata.labels", labels)
    for job in jobs:
        pod_labels = job["template"]["spec"]["template"]["metadata"]["labels"]
        _check_labels(f"runtime {plan.runtime_name}: replicatedJobs[{job.get('name')}] pod labels", pod_labels)
    metadata: dict[str, Any] = {"name": target.name, "namespace": target.namespace, "labels": labels}
    if plan.jobset_metadata.get("annotations"):
        metadata["annotations"] = dict(plan.jobset_metadata["annotations"])
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": metadata, "spec": spec}, peers


def _cluster_images(plan: LaunchPlan, jobs: list[dict[str, Any]]) -> None:
    """The cluster's copies of the images named (``spec.kubernetes.images``) and its pull policy, on every
    container and init container of every replicated job."""
    images = dict(plan.image_map)
    for job in jobs:
        pod = _pod_spec(job)
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            if container.get("image") in images:
                container["image"] = images[container["image"]]
            if plan.image_pull_policy:
                container["imagePullPolicy"] = plan.image_pull_policy


def _check_labels(where: str, labels: dict[str, Any]) -> None:
    """Every label the JobSet carries is one the API server admits; refused here, before anything is sent."""
    for key, value in labels.items():
        try:
            if not isinstance(value, str):
                raise ValueError("label values are strings")
            check_labels({key: value})
        except ValueError as exc:
            raise InvalidSpec(f"{where}[{key}]", value, str(exc)) from None


def _placement(plan: LaunchPlan) -> dict[str, Any]:
    """The portable scheduler knobs in Kubernetes terms (README: "Scheduler knobs on Kubernetes")."""
    options = plan.options
    for knob, value in (("partition", options.partition), ("account", options.account)):
        if value and not _LABEL_NAME.fullmatch(value):
            raise InvalidSpec(f"metadata.annotations[{PREFIX}{knob}]", value,
                              "on Kubernetes this is a label value: letters, digits, - _ . (63 at most)")
    if options.qos and not _DNS_SUBDOMAIN.fullmatch(options.qos):
        raise InvalidSpec(f"metadata.annotations[{QOS_ANNOTATION}]", options.qos,
                          "on Kubernetes this is a PriorityClass name: lowercase letters, digits, - and .")
    selector: dict[str, str] = {}
    if options.partition:
        selector[PARTITION_ANNOTATION] = options.partition
    if options.constraint:
        features = options.constraint.split("&")
        for feature in features:
            if not _LABEL_NAME.fullmatch(feature):
                raise InvalidSpec(f"metadata.annotations[{CONSTRAINT_ANNOTATION}]", options.constraint,
                                  "Kubernetes takes node features joined by & (each a label name; no |, brackets "
                                  "or counts)")
            selector[f"{FEATURE_LABEL_PREFIX}{feature}"] = "true"
    placement: dict[str, Any] = {}
    if selector:
        placement["nodeSelector"] = selector
    if options.qos:
        placement["priorityClassName"] = options.qos
    if options.exclusive:
        # no other hpc-bridge pod (of this job or another) shares a node with this job's pods
        placement["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchExpressions": [{"key": UID_LABEL, "operator": "Exists"}]},
            "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}
    return placement


def _place(pod: dict[str, Any], placement: dict[str, Any]) -> None:
    if "nodeSelector" in placement:
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **placement["nodeSelector"]}
    if "priorityClassName" in placement:
        pod["priorityClassName"] = placement["priorityClassName"]
    if "affinity" in placement:
        pod.setdefault("affinity", {})["podAntiAffinity"] = copy.deepcopy(placement["affinity"]["podAntiAffinity"])


def _pet_env(plan: LaunchPlan, master: bool, master_host: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "PET_NNODES", "value": str(plan.nodes)},
           {"name": "PET_NPROC_PER_NODE", "value": torch_nproc(plan)},
           {"name": "PET_NODE_RANK", "valueFrom": copy.deepcopy(_COMPLETION_INDEX)}]
    if master:
        env += [{"name": "PET_MASTER_ADDR", "value": master_host},
                {"name": "PET_MASTER_PORT", "value": str(plan.rdzv_port)}]
    return env


def _torch(plan: LaunchPlan, container: dict[str, Any], runtime_command: list[str], master_host: str) -> None:
    """Kubeflow's torch plugin: PET_* for torchrun (and the master address, except for torchtune, which gets a
    rendezvous argument instead) and the rendezvous port."""
    torchtune = plan.trainer_command_given and tuple(plan.container_command) == TORCHTUNE_ENTRYPOINT
    if torchtune:
        container["command"] = [*plan.container_command,
                                *torchtune_arguments(plan.container_args, runtime_command, plan.runtime_name,
                                                     plan.nodes, torch_nproc(plan), plan.resources.gpus,
                                                     f"{master_host}:{plan.rdzv_port}")]
    _set_env(container, _pet_env(plan, master=not torchtune, master_host=master_host))
    _coordinator_port(plan, container)


def _inject_torch_env(plan: LaunchPlan, jobs: list[dict[str, Any]], master_host: str) -> None:
    """The torch policy's ``envInjection``: PET_* and the master address in the named containers (init
    containers and sidecars that check or coordinate), whatever the trainer's own command is."""
    for job_name, names in plan.env_injection:
        job = next((j for j in jobs if j.get("name") == job_name), None)
        pod = _pod_spec(job) if job is not None else {}
        for name in names:
            found = next((c for c in [*pod.get("initContainers", []), *pod.get("containers", [])]
                          if c.get("name") == name), None)
            if found is None:
                raise InvalidSpec(f"runtime {plan.runtime_name}: spec.mlPolicy.torch.envInjection", f"{job_name}/{name}",
                                  "no such container in the runtime's template")
            _set_env(found, _pet_env(plan, master=True, master_host=master_host))


_COMPLETION_INDEX = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}


def _coordinator_port(plan: LaunchPlan, container: dict[str, Any]) -> None:
    ports = [p for p in container.get("ports", []) if p.get("containerPort") != plan.rdzv_port]
    container["ports"] = ports + [{"containerPort": plan.rdzv_port}]


def _jax(plan: LaunchPlan, container: dict[str, Any], master_host: str) -> None:
    """Kubeflow's JAX plugin: one process per node, the first pod coordinates."""
    _set_env(container, [
        {"name": "JAX_NUM_PROCESSES", "value": str(plan.nodes)},
        {"name": "JAX_PROCESS_ID", "valueFrom": copy.deepcopy(_COMPLETION_INDEX)},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{master_host}:{plan.rdzv_port}"},
    ])
    _coordinator_port(plan, container)


def _xgboost(plan: LaunchPlan, container: dict[str, Any], master_host: str) -> None:
    """Kubeflow's XGBoost plugin: the first pod runs the tracker; one worker per GPU, else one per node."""
    workers = plan.nodes * (plan.resources.gpus or 1)
    _set_env(container, [
        {"name": "DMLC_TRACKER_URI", "value": master_host},
        {"name": "DMLC_TRACKER_PORT", "value": str(plan.rdzv_port)},
        {"name": "DMLC_TASK_ID", "valueFrom": copy.deepcopy(_COMPLETION_INDEX)},
        {"name": "DMLC_NUM_WORKER", "value": str(workers)},
    ])
    _coordinator_port(plan, container)


def _mpi(plan: LaunchPlan, name: str, jobs: list[dict[str, Any]], trainer: dict[str, Any],
         node_job: dict[str, Any], container: dict[str, Any], subdomain: str, user_env: list[dict[str, Any]],
         resources: dict[str, Any]) -> list[Peer]:
    launcher_job = next((job for job in jobs if job.get("name") == "launcher"), None)
    if launcher_job is not None and node_job is not launcher_job:
        workers = max(plan.nodes - 1, 1) if plan.run_launcher_as_node else plan.nodes
        _set_pod_count(node_job, workers)
        peers = hostnames(name, "node", workers, subdomain)
        if plan.run_launcher_as_node:
            peers += hostnames(name, "launcher", 1, subdomain)
            worker_container = _node_container(node_job)
            if worker_container is not None:
                _set_env(worker_container, user_env)
                if resources:
                    worker_container["resources"] = copy.deepcopy(resources)
    else:
        _set_pod_count(trainer, plan.nodes)
        peers = hostnames(name, trainer["name"], plan.nodes, subdomain)
    mount = plan.ssh_auth_mount_path or "/root/.ssh"
    for job in jobs:
        pod = _pod_spec(job)
        node = _node_container(job)
        if node is None:
            continue
        volumes = [v for v in pod.get("volumes", []) if v.get("name") not in ("mpi-ssh-auth", "mpi-hostfile")]
        volumes.append({"name": "mpi-ssh-auth", "secret": {"secretName": ssh_secret_name(name, plan.uid), "defaultMode": 0o400,
                        "items": [{"key": "ssh-privatekey", "path": "id_rsa", "mode": 0o640},
                                  {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 0o644},
                                  {"key": "ssh-publickey", "path": "authorized_keys", "mode": 0o644},
                                  # the same client key under the name `hpcbridge launch` reads, and the host keys
                                  {"key": "ssh-privatekey", "path": CLIENT_KEY, "mode": 0o640},
                                  {"key": HOST_KEY_SECRET_KEY, "path": HOST_KEY, "mode": 0o640},
                                  {"key": f"{HOST_KEY_SECRET_KEY}.pub", "path": f"{HOST_KEY}.pub", "mode": 0o644}]}})
        mounts = [m for m in node.get("volumeMounts", []) if m.get("name") not in ("mpi-ssh-auth", "mpi-hostfile")]
        mounts.append({"name": "mpi-ssh-auth", "mountPath": mount})
        # every pod, not only the launcher: each finds its rank in it (Kubeflow mounts it on the launcher alone)
        volumes.append({"name": "mpi-hostfile", "configMap": {"name": hostfile_configmap_name(name),
                        "items": [{"key": "hostfile", "path": "hostfile", "mode": 0o444}]}})
        mounts.append({"name": "mpi-hostfile", "mountPath": HOSTFILE_PATH.rsplit("/", 1)[0]})
        pod["volumes"] = volumes
        node["volumeMounts"] = mounts
    if plan.launcher == Launcher.OPENMPI:
        _set_env(container, [
            {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
            {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
            {"name": "OMPI_MCA_orte_set_default_slots", "value": str(plan.procs_per_node)},
            {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
        ])
    elif plan.launcher in MPI_LAUNCHERS:
        _set_env(container, [{"name": "HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
                             {"name": "I_MPI_HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"}])
    return [Peer(host, plan.procs_per_node) for host in peers]


def _launch(plan: LaunchPlan, name: str, container: dict[str, Any], trainer: dict[str, Any],
            node_job: dict[str, Any], subdomain: str, env_names: list[str]) -> None:
    """Every pod runs its command through ``hpcbridge launch``, the bootstrap Slurm and Flux jobs use.

    MPI: peers from the hostfile ConfigMap, the launcher's pod first; rank 0 starts mpirun/mpiexec once every
    other pod's sshd (the job's keys from the Secret) answers, the others serve until it releases them. Their
    own command (Kubeflow's runtimes start sshd there) is replaced by the same launch. torch: torchrun on
    every pod with the first pod as master, unless the command runs torchrun itself (then PET_* stand).
    Others: the command on every pod, as it is. The exit code is the command's (the launcher's)."""
    command = (*container.get("command", ()), *container.get("args", ()))
    # torchtune's `tune run` starts torchrun itself, from the rendezvous argument Kubeflow's rewriting gave it
    launcher = Launcher.PLAIN if tuple(command[:2]) == TORCHTUNE_ENTRYPOINT else plan.launcher
    common = {"launcher": launcher.value, "discovery": "jobset", "procs_per_node": plan.procs_per_node,
              "nodes": plan.nodes, "command": command, "rdzv_port": plan.rdzv_port, "job_id": plan.uid,
              # the framework's coordinates as on every backend (and XGBoost's worker per GPU, which Kubeflow
              # counts and never starts); the values the plugins above set are the same
              "framework": launch_framework(plan.framework) if launcher is plan.launcher else ""}
    if plan.launcher in _OVER_SSH:
        spec = LaunchSpec(**common, hostfile=HOSTFILE_PATH, leader=hostnames(name, trainer["name"], 1, subdomain)[0],
                          ssh_dir=plan.ssh_auth_mount_path or "/root/.ssh", ssh_port=DEFAULT_PORT,
                          forward_env=tuple(dict.fromkeys(env_names)))
    else:
        spec = LaunchSpec(**common, hosts=tuple(hostnames(name, trainer["name"], plan.nodes, subdomain)))
    argv = [*plan.launch_command, *spec.to_args()]
    targets = [container]
    if plan.launcher in _OVER_SSH and node_job is not trainer:
        worker = _node_container(node_job)
        if worker is not None:
            targets.append(worker)
    for target in targets:
        target["command"] = list(argv)
        target.pop("args", None)


def launched_command(container: dict[str, Any]) -> list[str]:
    """The command a rendered container runs for the user: what follows ``--`` in its ``hpcbridge launch``
    line, or its command and args as they are when it runs no launch."""
    argv = [*container.get("command", ()), *container.get("args", ())]
    if "launch" in argv and "--" in argv and argv.index("launch") < argv.index("--"):
        return argv[argv.index("--") + 1:]
    return argv


def mpi_objects(plan: LaunchPlan, peers: list[Peer], target: Target | None = None) -> list[dict[str, Any]]:
    target = target or Target.of(plan)
    labels = _labels(plan)
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth", "immutable": True,
              "metadata": {"name": ssh_secret_name(target.name, plan.uid), "namespace": target.namespace,
                           "labels": labels,
                           # Keys are made at submit time, never rendered: render stays pure and keys secret.
                           "annotations": {KEYS_ANNOTATION: "generated-at-submit"}},
              "data": {}}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": hostfile_configmap_name(target.name), "namespace": target.namespace,
                              "labels": labels},
                 "data": {"hostfile": hostfile_for(plan.launcher.value, peers)}}
    return [secret, configmap]


#: the gang schedulers' PodGroups, and how a pod says it belongs to one (Kubeflow's coscheduling and volcano
#: plugins: a label for scheduler-plugins, an annotation for Volcano)
POD_GROUP_API = {"coscheduling": ("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
                 "volcano": ("scheduling.volcano.sh", "v1beta1", "podgroups")}
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"


def _join_gang(plan: LaunchPlan, name: str, pod_meta: dict[str, Any], pod: dict[str, Any]) -> None:
    group = plan.pod_group
    assert group is not None  # called for a plan with a gang policy only
    if group.kind == "coscheduling":
        pod_meta.setdefault("labels", {})[COSCHEDULING_LABEL] = name
    else:
        pod_meta.setdefault("annotations", {})[VOLCANO_GROUP_ANNOTATION] = name
    if group.scheduler_name and not pod.get("schedulerName"):
        pod["schedulerName"] = group.scheduler_name


def pod_group(plan: LaunchPlan, js: dict[str, Any], target: Target | None = None) -> dict[str, Any]:
    """The PodGroup Kubeflow's plugin makes for this JobSet: named after the TrainJob, minMember every pod of
    every replicated job (a gang starts whole or not at all), minResources their requests summed."""
    target = target or Target.of(plan)
    from fractions import Fraction

    from bridge.api.quantity import format_quantity

    members = 0
    totals: dict[str, Fraction] = {}
    for job in js["spec"]["replicatedJobs"]:
        job_spec = job["template"]["spec"]
        pods = int(job.get("replicas", 1)) * int(job_spec.get("parallelism", 1))
        members += pods
        for name, amount in _pod_requests(_pod_spec(job)).items():
            totals[name] = totals.get(name, Fraction(0)) + amount * pods
    group = plan.pod_group
    assert group is not None  # called for a plan with a gang policy only
    api_group, version, _ = POD_GROUP_API[group.kind]
    spec: dict[str, Any] = {"minMember": members,
                            "minResources": {name: format_quantity(amount) for name, amount in sorted(totals.items())}}
    if group.kind == "coscheduling":
        spec["scheduleTimeoutSeconds"] = group.schedule_timeout_seconds
    else:
        queue = (plan.jobset_metadata.get("annotations") or {}).get(VOLCANO_QUEUE_ANNOTATION)
        if queue:
            spec["queue"] = queue
        classes = {_pod_spec(job).get("priorityClassName") for job in js["spec"]["replicatedJobs"]} - {None}
        if len(classes) == 1:
            spec["priorityClassName"] = classes.pop()
        if group.network_topology:
            spec["networkTopology"] = copy.deepcopy(dict(group.network_topology))
    return {"apiVersion": f"{api_group}/{version}", "kind": "PodGroup",
            "metadata": {"name": target.name, "namespace": target.namespace, "labels": _labels(plan)}, "spec": spec}


def _pod_requests(pod: dict[str, Any]) -> dict[str, Fraction]:
    """What one pod asks the scheduler for, as Kubernetes counts it: its containers' requests summed (a limit
    stands in for a request not given), or an init container's when that is larger."""
    from fractions import Fraction

    from bridge.api.quantity import parse_quantity

    def asked(container: dict[str, Any]) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: parse_quantity(value) for name, value in merged.items()}

    total: dict[str, Fraction] = {}
    for container in pod.get("containers") or []:
        for name, amount in asked(container).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for container in pod.get("initContainers") or []:
        for name, amount in asked(container).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    return total


def render_objects(plan: LaunchPlan, namespace: str | None = None, policy: PodPolicy | None = None,
                   ) -> list[dict[str, Any]]:
    """Every object submit creates, in *namespace* (default: the TrainJob's own), once the plan's pod templates
    pass *policy* (default: PodPolicy's restrictive one)."""
    target = Target.of(plan, namespace)
    check_pod_policy(plan, target.namespace, policy)
    js, peers = jobset(plan, target)
    # the PodGroup first: a pod that names a group the scheduler does not know yet is not scheduled
    gang = [pod_group(plan, js, target)] if plan.pod_group is not None else []
    if plan.launcher in _OVER_SSH:
        return [*gang, *mpi_objects(plan, peers, target), js]
    return [*gang, js]


def render_manifests(plan: LaunchPlan, namespace: str | None = None, policy: PodPolicy | None = None) -> str:
    return dump_yaml(render_objects(plan, namespace, policy))
