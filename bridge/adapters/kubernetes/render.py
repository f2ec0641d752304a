"""LaunchPlan → JobSet (+ MPI Secret and hostfile ConfigMap), following Kubeflow Trainer's conventions.

The runtime's JobSet template (already merged with runtime patches in plan.py) is the starting point;
this module does what Kubeflow's runtime plugins do: trainer overrides on container ``node``, pod
counts, PET_* for torch, SSH Secret + hostfile for MPI, identity labels. Pure: no client imported here.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

from bridge.adapters.kubernetes.frameworks import inject_torch_env, jax_env, torch_env, xgboost_env
from bridge.adapters.kubernetes.pods import (
    DNS_SUBDOMAIN,
    check_jobset_labels,
    cluster_images,
    container_resources,
    hostnames,
    initializers,
    node_container,
    pod_spec,
    set_env,
    set_pod_count,
    trainer_job,
)
from bridge.adapters.kubernetes.policy import check_pod_policy
from bridge.adapters.kubernetes.scheduling import (
    POD_GROUP_API,
    VOLCANO_QUEUE_ANNOTATION,
    apply_placement,
    join_gang,
    placement_for,
    pod_requests,
)
from bridge.annotations import (
    ACCOUNT_ANNOTATION,
    ANCESTOR_LABEL,
    KEYS_ANNOTATION,
    QUEUE_LABEL,
    TRAINJOB_NAME_LABEL,
    UID_LABEL,
)
from bridge.api.cluster import PodPolicy
from bridge.api.loader import dump_yaml
from bridge.errors import InvalidSpec
from bridge.mpi.hostfile import Peer, hostfile_for
from bridge.mpi.spec import LaunchSpec, launch_framework
from bridge.mpi.ssh import CLIENT_KEY, DEFAULT_PORT, HOST_KEY
from bridge.plan import (
    MPI_LAUNCHERS,
    TORCHTUNE_ENTRYPOINT,
    TRAINER_CONTAINER,
    Launcher,
    LaunchPlan,
    check_identity,
    job_environment,
    script_env,
)

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
#: Secret keys of the job's sshd host keypair, beside Kubeflow's ssh-privatekey / ssh-publickey (the client's):
#: every pod's sshd presents it and known_hosts pins it, so no host key is ever accepted unseen
HOST_KEY_SECRET_KEY = "hpcbridge-host-key"
#: where every MPI pod finds the hostfile ConfigMap (Kubeflow's path)
HOSTFILE_PATH = "/etc/mpi/hostfile"
#: launchers that run through ``hpcbridge launch`` in the pods (Flux and batch scripts bring their own)
_LAUNCHED = frozenset({*MPI_LAUNCHERS, Launcher.TORCHRUN, Launcher.PLAIN, Launcher.SCRIPT})
#: the nodes reach each other over the job's sshd: MPI ranks, and a batch script's steps (the srun shim)
_OVER_SSH = frozenset({*MPI_LAUNCHERS, Launcher.SCRIPT})


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
    return {TRAINJOB_NAME_LABEL: plan.name, UID_LABEL: plan.uid}


def trainer_pod_spec(js: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of the JobSet's trainer (or MPI node) pods: what each of the plan's nodes asks for."""
    jobs = js["spec"]["replicatedJobs"]
    job = next((j for j in jobs if j.get("name") == "node"), None) or trainer_job(jobs) or jobs[0]
    return pod_spec(job)


def jobset(plan: LaunchPlan, target: Target | None = None) -> tuple[dict[str, Any], list[Peer]]:
    """The JobSet (in *target*, by default the TrainJob's own namespace and name), and for MPI the peers its
    hostfile lists."""
    check_identity(plan)
    target = target or Target.of(plan)
    peers: list[Peer] = []
    kubernetes = plan.on_kubernetes()
    spec = copy.deepcopy(dict(kubernetes.jobset_template))
    jobs: list[dict[str, Any]] = spec.setdefault("replicatedJobs", [])
    if not jobs:
        jobs.append(_default_node_job(plan))
    trainer = trainer_job(jobs)
    assert trainer is not None  # plan.py found it, or we just built it
    container = _trainer_container(plan, trainer)
    runtime_command = list(container.get("command") or [])
    user_env, resources = _set_command_and_env(plan, container)
    subdomain = _subdomain(plan, spec, target)
    node_job = next((job for job in jobs if job.get("name") == "node"), trainer)
    # the first pod of the trainer's replicated job coordinates (torch master, JAX coordinator, XGBoost tracker)
    master_host = hostnames(target.name, trainer["name"], 1, subdomain)[0]
    if plan.launcher in _OVER_SSH:
        peers = _mpi(plan, target.name, jobs, trainer, node_job, container, subdomain, user_env, resources)
    else:
        set_pod_count(trainer, plan.nodes)
        _framework_env(plan, container, runtime_command, master_host)
    if kubernetes.env_injection:
        inject_torch_env(plan, jobs, master_host)
    if plan.launcher in _LAUNCHED and (container.get("command") or container.get("args")):
        _launch(plan, target.name, container, trainer, node_job, subdomain, [e["name"] for e in user_env])
    initializers(plan, jobs)
    _one_pod_each(jobs, counted=node_job if plan.launcher in _OVER_SSH else trainer)
    _stamp_pods(plan, target, jobs)
    if kubernetes.image_map or kubernetes.image_pull_policy:
        cluster_images(plan, jobs)
    spec["suspend"] = bool(plan.suspend)  # stated either way, as Kubeflow's controller does
    metadata = _jobset_metadata(plan, target, jobs)
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": metadata, "spec": spec}, peers


def _default_node_job(plan: LaunchPlan) -> dict[str, Any]:
    """The one replicated job of a runtime without a JobSet template: the TrainJob's image on ``node``."""
    if not plan.image:
        raise InvalidSpec("spec.trainer.image", None,
                          f"runtime {plan.runtime_name!r} has no JobSet template, so Kubernetes needs an image")
    job: dict[str, Any] = {"name": "node", "replicas": 1, "template": {
        "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": TRAINER_CONTAINER}]}}}}}
    if plan.launcher == Launcher.SCRIPT:
        # sbatch runs a failed script once; a retried rank 0 would also wait for peers that have left
        job["template"]["spec"]["backoffLimit"] = 0
    return job


def _trainer_container(plan: LaunchPlan, trainer: dict[str, Any]) -> dict[str, Any]:
    """The trainer job's ``node`` container, with the TrainJob's image (one it or the runtime must give)."""
    container = node_container(trainer)
    if container is None:
        raise InvalidSpec(f"runtime {plan.runtime_name}: replicatedJobs[{trainer['name']}]", None,
                          "no container named 'node'")
    if plan.image:
        container["image"] = plan.image
    elif not container.get("image"):
        raise InvalidSpec("spec.trainer.image", None, "Kubernetes needs an image (TrainJob or runtime)")
    return container


def _set_command_and_env(plan: LaunchPlan, container: dict[str, Any],
                         ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The TrainJob's command, args, env and resources on the trainer container; the env entries and resources
    it got, which MPI's worker containers get too."""
    # command and args as Kubeflow sets them, each from the TrainJob or else the runtime; with neither, the
    # image's entrypoint runs
    kubernetes = plan.on_kubernetes()
    for key, value in (("command", kubernetes.container_command), ("args", kubernetes.container_args)):
        if value:
            container[key] = list(value)
        else:
            container.pop(key, None)
    user_env: list[dict[str, Any]] = [{"name": e.name, **({"value": e.value} if e.value is not None else {}),
                 **({"valueFrom": dict(e.value_from)} if e.value_from else {})} for e in plan.env]
    user_env += [{"name": name, "value": value} for name, value in (*job_environment(plan),
                                                                      *script_env(plan).items())]
    set_env(container, user_env)
    resources = container_resources(plan)
    if resources:
        container["resources"] = copy.deepcopy(resources)
    return user_env, resources


def _subdomain(plan: LaunchPlan, spec: dict[str, Any], target: Target) -> str:
    subdomain = (spec.get("network") or {}).get("subdomain") or target.name
    if not isinstance(subdomain, str) or len(subdomain) > 253 or not DNS_SUBDOMAIN.fullmatch(subdomain):
        # it is written into every hostname of the MPI hostfile: one line per host, nothing else
        raise InvalidSpec(f"runtime {plan.runtime_name}: spec.template.spec.network.subdomain", subdomain,
                          "must be an RFC 1123 subdomain: lowercase letters, digits, '-' and '.'")
    return subdomain


def _framework_env(plan: LaunchPlan, container: dict[str, Any], runtime_command: list[str],
                   master_host: str) -> None:
    # Kubeflow's framework plugins add their environment only when the TrainJob has a trainer section
    if plan.on_kubernetes().trainer_given:
        if plan.launcher == Launcher.TORCHRUN:
            torch_env(plan, container, runtime_command, master_host)
        elif plan.framework == "jax":
            jax_env(plan, container, master_host)
        elif plan.framework == "xgboost":
            xgboost_env(plan, container, master_host)


def _one_pod_each(jobs: list[dict[str, Any]], counted: dict[str, Any]) -> None:
    for job in jobs:
        if job is not counted:
            # every other replicated job (initializers, an MPI launcher) runs one pod, stated as Kubeflow states it
            job_spec = job.setdefault("template", {}).setdefault("spec", {})
            job_spec.setdefault("parallelism", 1)
            job_spec.setdefault("completions", job_spec["parallelism"])


def _stamp_pods(plan: LaunchPlan, target: Target, jobs: list[dict[str, Any]]) -> None:
    """What every replicated job's pods carry: the deadline, identity labels, gang and placement."""
    placement = placement_for(plan)
    for job in jobs:
        job_spec = job.setdefault("template", {}).setdefault("spec", {})
        if plan.time_limit_seconds:
            job_spec["activeDeadlineSeconds"] = plan.time_limit_seconds
        pod_meta = job_spec.setdefault("template", {}).setdefault("metadata", {})
        pod_meta.setdefault("labels", {}).update(_labels(plan))
        if plan.pod_group is not None:
            join_gang(plan, target.name, pod_meta, pod_spec(job))
        apply_placement(pod_spec(job), placement)
        if plan.options.account:
            pod_meta["labels"][ACCOUNT_ANNOTATION] = plan.options.account


def _jobset_metadata(plan: LaunchPlan, target: Target, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The JobSet's own metadata as Kubeflow gives it (runtime template, then runtime patches), plus identity;
    its labels and its pods' checked."""
    kubernetes = plan.on_kubernetes()
    labels = {**dict(kubernetes.jobset_metadata.get("labels") or {}), **_labels(plan)}
    if plan.options.account:
        labels[ACCOUNT_ANNOTATION] = plan.options.account
    if kubernetes.queue:
        labels[QUEUE_LABEL] = kubernetes.queue  # Kueue suspends the JobSet at creation and admits it from this queue
    check_jobset_labels("metadata.labels", labels)
    for job in jobs:
        pod_labels = job["template"]["spec"]["template"]["metadata"]["labels"]
        check_jobset_labels(f"runtime {plan.runtime_name}: replicatedJobs[{job.get('name')}] pod labels", pod_labels)
    metadata: dict[str, Any] = {"name": target.name, "namespace": target.namespace, "labels": labels}
    if kubernetes.jobset_metadata.get("annotations"):
        metadata["annotations"] = dict(kubernetes.jobset_metadata["annotations"])
    return metadata


def _mpi(plan: LaunchPlan, name: str, jobs: list[dict[str, Any]], trainer: dict[str, Any],
         node_job: dict[str, Any], container: dict[str, Any], subdomain: str, user_env: list[dict[str, Any]],
         resources: dict[str, Any]) -> list[Peer]:
    launcher_job = next((job for job in jobs if job.get("name") == "launcher"), None)
    if launcher_job is not None and node_job is not launcher_job:
        as_node = plan.on_kubernetes().run_launcher_as_node
        workers = max(plan.nodes - 1, 1) if as_node else plan.nodes
        set_pod_count(node_job, workers)
        peers = hostnames(name, "node", workers, subdomain)
        if as_node:
            peers += hostnames(name, "launcher", 1, subdomain)
            worker_container = node_container(node_job)
            if worker_container is not None:
                set_env(worker_container, user_env)
                if resources:
                    worker_container["resources"] = copy.deepcopy(resources)
    else:
        set_pod_count(trainer, plan.nodes)
        peers = hostnames(name, trainer["name"], plan.nodes, subdomain)
    _mount_ssh_and_hostfile(plan, name, jobs)
    if plan.launcher == Launcher.OPENMPI:
        set_env(container, [
            {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
            {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
            {"name": "OMPI_MCA_orte_set_default_slots", "value": str(plan.procs_per_node)},
            {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
        ])
    elif plan.launcher in MPI_LAUNCHERS:
        set_env(container, [{"name": "HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
                             {"name": "I_MPI_HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"}])
    return [Peer(host, plan.procs_per_node) for host in peers]


def _mount_ssh_and_hostfile(plan: LaunchPlan, name: str, jobs: list[dict[str, Any]]) -> None:
    """The job's SSH keys (Secret) and hostfile (ConfigMap) on the ``node`` container of every pod."""
    mount = plan.on_kubernetes().ssh_auth_mount_path or "/root/.ssh"
    for job in jobs:
        pod = pod_spec(job)
        node = node_container(job)
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
                          ssh_dir=plan.on_kubernetes().ssh_auth_mount_path or "/root/.ssh", ssh_port=DEFAULT_PORT,
                          forward_env=tuple(dict.fromkeys(env_names)))
    else:
        spec = LaunchSpec(**common, hosts=tuple(hostnames(name, trainer["name"], plan.nodes, subdomain)))
    argv = [*plan.launch_command, *spec.to_args()]
    targets = [container]
    if plan.launcher in _OVER_SSH and node_job is not trainer:
        worker = node_container(node_job)
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
        for name, amount in pod_requests(pod_spec(job)).items():
            totals[name] = totals.get(name, Fraction(0)) + amount * pods
    group = plan.pod_group
    assert group is not None  # called for a plan with a gang policy only
    api_group, version, _ = POD_GROUP_API[group.kind]
    spec: dict[str, Any] = {"minMember": members,
                            "minResources": {name: format_quantity(amount) for name, amount in sorted(totals.items())}}
    if group.kind == "coscheduling":
        spec["scheduleTimeoutSeconds"] = group.schedule_timeout_seconds
    else:
        queue = (plan.on_kubernetes().jobset_metadata.get("annotations") or {}).get(VOLCANO_QUEUE_ANNOTATION)
        if queue:
            spec["queue"] = queue
        classes = {pod_spec(job).get("priorityClassName") for job in js["spec"]["replicatedJobs"]} - {None}
        if len(classes) == 1:
            spec["priorityClassName"] = classes.pop()
        if group.network_topology:
            spec["networkTopology"] = copy.deepcopy(dict(group.network_topology))
    return {"apiVersion": f"{api_group}/{version}", "kind": "PodGroup",
            "metadata": {"name": target.name, "namespace": target.namespace, "labels": _labels(plan)}, "spec": spec}


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
