"""Training Operator v1 jobs → TrainJob (Kubeflow Trainer v2.3 shape): kubeflow.org/v1 PyTorchJob and TFJob,
kubeflow.org/v2beta1 MPIJob (mpi-operator).

A v1 job describes each replica type with its own pod template; a TrainJob names a runtime and says what its
trainer runs. So the framework container's image, command, args, env and resources become ``spec.trainer``,
the node count is the sum of the replicas, pod-level settings (node selectors, tolerations, volumes, service
account, ...) go into a ``runtimePatches`` entry for the runtime's Jobs, and a TrainingRuntime is written when
no built-in runtime fits (an MPI flavour or SSH path the built-ins lack, TensorFlow's TF_CONFIG). Every field
with no equivalent is reported, one line each; nothing is dropped silently. What cannot be expressed at all
(parameter servers) is an InvalidSpec naming the field.

Pure: dicts in, dicts out; the caller validates them as the wire objects they are.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from bridge.envnames import TF_ROLES_ENV
from bridge.errors import InvalidSpec

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
#: the manager named on the runtime patches this converter writes
PATCH_MANAGER = "hpcbridge.io/convert"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

#: (apiVersion, kind) → (replica specs field, framework container name)
KINDS = {
    ("kubeflow.org/v1", "PyTorchJob"): ("pytorchReplicaSpecs", "pytorch"),
    ("kubeflow.org/v1", "TFJob"): ("tfReplicaSpecs", "tensorflow"),
    ("kubeflow.org/v2beta1", "MPIJob"): ("mpiReplicaSpecs", None),
}

#: container fields that become spec.trainer
_TRAINER_FIELDS = ("name", "image", "command", "args", "env", "resources")
#: container fields carried to the runtime's container through a runtime patch
_PATCHED_CONTAINER_FIELDS = ("envFrom", "volumeMounts", "volumeDevices", "workingDir", "securityContext",
                             "imagePullPolicy")
#: pod fields carried through a runtime patch
_PATCHED_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "volumes", "serviceAccountName",
                       "imagePullSecrets", "priorityClassName", "schedulerName", "securityContext",
                       "runtimeClassName", "topologySpreadConstraints", "dnsPolicy", "dnsConfig", "hostAliases",
                       "initContainers", "terminationGracePeriodSeconds", "hostIPC", "hostPID", "hostNetwork",
                       "shareProcessNamespace", "automountServiceAccountToken", "enableServiceLinks",
                       "overhead", "preemptionPolicy", "priority", "readinessGates", "resourceClaims",
                       "schedulingGates", "setHostnameAsFQDN", "subdomain", "hostname", "os", "nodeName")


def is_v1_job(document: Any) -> bool:
    if not isinstance(document, dict):
        return False
    api_version, kind = document.get("apiVersion"), document.get("kind")
    return isinstance(api_version, str) and isinstance(kind, str) and (api_version, kind) in KINDS


@dataclass
class Converted:
    """The TrainJob, the TrainingRuntime written for it (if any), and what did not carry over."""

    trainjob: dict[str, Any]
    runtime: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def documents(self) -> list[dict[str, Any]]:
        return [self.trainjob, *([self.runtime] if self.runtime else [])]


class _Conversion:
    def __init__(self, document: dict[str, Any], source: str) -> None:
        self.doc, self.source = document, source
        self.kind = document["kind"]
        self.notes: list[str] = []

    def note(self, path: str, value: Any, why: str) -> None:
        try:
            shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        except ValueError:  # an int past Python's digit limit
            shown = "<a number too long to show>"
        if len(shown) > 120:
            shown = shown[:117] + "..."
        self.notes.append(f"{self.kind} {path} {shown}: {why}")

    def fail(self, path: str, value: Any, why: str) -> InvalidSpec:
        return InvalidSpec(path, value, why, source=self.source)

    # --- pieces shared by every kind

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, value, "must be a mapping")
        return value

    def items(self, value: Any, path: str) -> list[dict[str, Any]]:
        """A list of mappings (containers, env), or InvalidSpec naming the field."""
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise self.fail(path, value, "must be a list of mappings")
        return value

    def strings(self, value: Any, path: str) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.fail(path, value, "must be a list of strings")
        return value

    def replicas(self, specs_field: str) -> dict[str, dict[str, Any]]:
        specs = self.mapping(self.doc.get("spec"), "spec").get(specs_field)
        if not isinstance(specs, dict) or not specs:
            raise self.fail(f"spec.{specs_field}", specs, f"a {self.kind} needs its replica specs")
        for role, spec in specs.items():
            path = f"spec.{specs_field}.{role}"
            if not isinstance(spec, dict):
                raise self.fail(path, spec, "must be a mapping")
            for key, value in spec.items():
                if key == "restartPolicy":
                    if value != "Never":
                        self.note(f"{path}.restartPolicy", value, "a TrainJob's pods are not restarted (its "
                                  "runtimes fail the job at a non-zero exit)")
                elif key not in ("replicas", "template"):
                    self.note(f"{path}.{key}", value, "no equivalent; dropped")
        return specs

    def count(self, spec: dict[str, Any], path: str, default: int = 1) -> int:
        from bridge.plan import MAX_NODES_DEFAULT

        value = spec.get("replicas", default)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_NODES_DEFAULT:
            raise self.fail(f"{path}.replicas", value, f"must be a whole number from 0 to {MAX_NODES_DEFAULT}")
        return value

    def pod(self, spec: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(pod template metadata, pod spec) of a replica spec."""
        template = self.mapping(spec.get("template"), f"{path}.template")
        pod = self.mapping(template.get("spec"), f"{path}.template.spec")
        containers = pod.get("containers")
        if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
            raise self.fail(f"{path}.template.spec.containers", containers, "needs at least one container")
        return self.mapping(template.get("metadata"), f"{path}.template.metadata"), pod

    def framework_container(self, pod: dict[str, Any], name: str | None, path: str) -> tuple[int, dict[str, Any]]:
        containers = pod["containers"]
        if name is None:
            return 0, containers[0]
        for index, container in enumerate(containers):
            self.items(container.get("env"), f"{path}.template.spec.containers[{index}].env")
            for key in ("command", "args"):
                self.strings(container.get(key), f"{path}.template.spec.containers[{index}].{key}")
            self.mapping(container.get("resources"), f"{path}.template.spec.containers[{index}].resources")
        for index, container in enumerate(containers):
            if container.get("name") == name:
                return index, container
        raise self.fail(f"{path}.template.spec.containers", [c.get("name") for c in containers],
                        f"a {self.kind} runs the container named {name!r}; there is none")

    def trainer_from(self, container: dict[str, Any], path: str) -> dict[str, Any]:
        trainer: dict[str, Any] = {}
        for key in ("image", "command", "args", "env"):
            if container.get(key) is not None:
                trainer[key] = copy.deepcopy(container[key])
        if container.get("resources"):
            trainer["resourcesPerNode"] = copy.deepcopy(container["resources"])
        for key, value in container.items():
            if key not in _TRAINER_FIELDS and key not in _PATCHED_CONTAINER_FIELDS:
                self.note(f"{path}.{key}", value, "no equivalent on a TrainJob's trainer; dropped")
        return trainer

    def pod_patch(self, metadata: dict[str, Any], pod: dict[str, Any], container: dict[str, Any],
                  container_index: int, path: str) -> dict[str, Any]:
        """The pod-level settings for the runtime's pods, in the shape of a PodTemplateSpec."""
        spec: dict[str, Any] = {}
        for key, value in pod.items():
            if key in _PATCHED_POD_FIELDS:
                spec[key] = copy.deepcopy(value)
            elif key == "restartPolicy":
                if value != "Never":
                    self.note(f"{path}.template.spec.restartPolicy", value,
                              "a TrainJob's pods are not restarted (its runtimes fail the job on a non-zero exit)")
            elif key != "containers":
                self.note(f"{path}.template.spec.{key}", value, "no equivalent; dropped")
        own = {key: copy.deepcopy(value) for key, value in container.items() if key in _PATCHED_CONTAINER_FIELDS}
        containers = [{"name": "node", **own}] if own else []
        for index, other in enumerate(pod["containers"]):
            if index != container_index:
                containers.append(copy.deepcopy(other))
                self.note(f"{path}.template.spec.containers[{index}]", other.get("name"),
                          "kept as a sidecar container of every node's pod (Kubernetes only)")
        if containers:
            spec["containers"] = containers
        patch: dict[str, Any] = {}
        labels = dict(self.mapping(metadata.get("labels"), f"{path}.template.metadata.labels"))
        annotations = dict(self.mapping(metadata.get("annotations"), f"{path}.template.metadata.annotations"))
        if labels or annotations:
            patch["metadata"] = {**({"labels": labels} if labels else {}),
                                 **({"annotations": annotations} if annotations else {})}
        for key in metadata:
            if key not in ("labels", "annotations"):
                self.note(f"{path}.template.metadata.{key}", metadata[key], "no equivalent; dropped")
        if spec:
            patch["spec"] = spec
        return patch

    def run_policy(self, trainjob: dict[str, Any], total_nodes: int) -> str | None:
        """spec.runPolicy onto the TrainJob; returns the pod priority class it asks for, if any."""
        policy = self.mapping(self.mapping(self.doc.get("spec"), "spec").get("runPolicy"), "spec.runPolicy")
        priority = None
        for key, value in policy.items():
            path = f"spec.runPolicy.{key}"
            if key == "activeDeadlineSeconds":
                trainjob["spec"]["activeDeadlineSeconds"] = value
            elif key == "suspend":
                trainjob["spec"]["suspend"] = value
            elif key == "backoffLimit":
                self.note(path, value, "a TrainJob is not retried: it fails at its first failure")
            elif key == "cleanPodPolicy":
                self.note(path, value, "no equivalent: a finished TrainJob's pods stay until it is deleted")
            elif key == "ttlSecondsAfterFinished":
                self.note(path, value, "no equivalent: delete the TrainJob to remove it")
            elif key == "managedBy":
                self.note(path, value, "not carried: hpc-bridge manages the TrainJob (spec.managedBy)")
            elif key == "schedulingPolicy":
                priority = self.scheduling(self.mapping(value, path), trainjob, total_nodes)
            else:
                self.note(path, value, "no equivalent; dropped")
        return priority

    def scheduling(self, policy: dict[str, Any], trainjob: dict[str, Any], total_nodes: int) -> str | None:
        priority = None
        for key, value in policy.items():
            path = f"spec.runPolicy.schedulingPolicy.{key}"
            if key == "queue":
                trainjob["metadata"].setdefault("labels", {})[QUEUE_LABEL] = value
            elif key == "priorityClass":
                priority = value
            elif key == "minAvailable":
                if value != total_nodes:
                    self.note(path, value, f"a TrainJob's {total_nodes} nodes start together, all of them")
            else:
                self.note(path, value, "no equivalent; dropped")
        return priority

    def trainjob(self, trainer: dict[str, Any], runtime_name: str, runtime_kind: str) -> dict[str, Any]:
        meta = self.mapping(self.doc.get("metadata"), "metadata")
        if not isinstance(meta.get("name"), str) or not meta.get("name"):
            raise self.fail("metadata.name", meta.get("name"), f"a {self.kind} needs a name")
        metadata: dict[str, Any] = {"name": meta["name"]}
        for key in ("labels", "annotations"):
            if meta.get(key):
                metadata[key] = copy.deepcopy(self.mapping(meta[key], f"metadata.{key}"))
        if meta.get("namespace"):
            metadata["namespace"] = meta["namespace"]
        ref = {"name": runtime_name, **({"kind": runtime_kind} if runtime_kind != "ClusterTrainingRuntime" else {})}
        return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata,
                "spec": {"runtimeRef": ref, "trainer": trainer}}

    def compare(self, first: tuple[str, dict[str, Any]], other: tuple[str, dict[str, Any]], what: str) -> None:
        """One pod template runs on every node: say so when another replica type's differs."""
        if first[1] != other[1]:
            differing = sorted(k for k in set(first[1]) | set(other[1]) if first[1].get(k) != other[1].get(k))
            self.note(f"{other[0]}.template", ", ".join(differing) or "(metadata)",
                      f"differs from {first[0]}'s; every node of the TrainJob runs {what}")


def _patches(job_names: list[str], pod_patch: dict[str, Any], priority: str | None) -> list[dict[str, Any]]:
    if priority:
        pod_patch = {**pod_patch, "spec": {**pod_patch.get("spec", {}), "priorityClassName": priority}}
    if not pod_patch:
        return []
    jobs = [{"name": name, "template": {"spec": {"template": copy.deepcopy(pod_patch)}}} for name in job_names]
    return [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}}}]


def _normalized(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod spec without what legitimately differs between roles of one job (none of it becomes the trainer)."""
    return {k: v for k, v in pod.items() if k != "restartPolicy"}


# --- PyTorchJob ----------------------------------------------------------------------------------------------


def _pytorch(conv: _Conversion, builtin: dict[str, dict[str, Any]]) -> Converted:
    specs = conv.replicas("pytorchReplicaSpecs")
    for role in specs:
        if role not in ("Master", "Worker"):
            raise conv.fail(f"spec.pytorchReplicaSpecs.{role}", role, "a PyTorchJob has Master and Worker replicas")
    nodes = sum(conv.count(spec, f"spec.pytorchReplicaSpecs.{role}") for role, spec in specs.items())
    if nodes < 1:
        raise conv.fail("spec.pytorchReplicaSpecs", 0, "no replicas to run")
    chosen = ("Worker" if "Worker" in specs and conv.count(specs["Worker"], "spec.pytorchReplicaSpecs.Worker")
              else "Master")
    path = f"spec.pytorchReplicaSpecs.{chosen}"
    metadata, pod = conv.pod(specs[chosen], path)
    index, container = conv.framework_container(pod, "pytorch", path)
    for role, spec in specs.items():
        if role != chosen:
            other_meta, other_pod = conv.pod(spec, f"spec.pytorchReplicaSpecs.{role}")
            conv.compare((path, _normalized(pod)), (f"spec.pytorchReplicaSpecs.{role}", _normalized(other_pod)),
                         f"the {chosen}'s")
    trainer = conv.trainer_from(container, f"{path}.template.spec.containers[{index}]")
    trainer["numNodes"] = nodes
    spec = conv.doc.get("spec") or {}
    nproc = spec.get("nprocPerNode")
    elastic = conv.mapping(spec.get("elasticPolicy"), "spec.elasticPolicy")
    if elastic.get("nProcPerNode") is not None and nproc is None:
        nproc = str(elastic["nProcPerNode"])
    if nproc is not None:
        text = nproc if isinstance(nproc, str) else str(nproc) if isinstance(nproc, int) and \
            not isinstance(nproc, bool) and nproc.bit_length() < 64 else "?"
        if text.isdigit() and int(text) > 0:
            trainer["numProcPerNode"] = int(text)
        elif text in ("auto", "gpu"):
            gpus = _gpus(container)
            if gpus:
                trainer["numProcPerNode"] = gpus
            elif text == "gpu":
                conv.note("spec.nprocPerNode", text, "the container asks for no GPUs: one process per node")
        elif text == "cpu":
            conv.note("spec.nprocPerNode", text, "a TrainJob counts processes, not CPUs: one process per node; "
                      "set spec.trainer.numProcPerNode")
        else:
            raise conv.fail("spec.nprocPerNode", nproc, "must be auto, cpu, gpu or a whole number")
    for key, value in elastic.items():
        if key != "nProcPerNode":
            conv.note(f"spec.elasticPolicy.{key}", value, f"no elastic training in Trainer v2 (removed in v2.2): "
                      f"the TrainJob runs {nodes} nodes, fixed")
    for key, value in spec.items():
        if key not in ("pytorchReplicaSpecs", "runPolicy", "elasticPolicy", "nprocPerNode"):
            conv.note(f"spec.{key}", value, "no equivalent; dropped")
    trainjob = conv.trainjob(trainer, "torch-distributed", "ClusterTrainingRuntime")
    priority = conv.run_policy(trainjob, nodes)
    patch = conv.pod_patch(metadata, pod, container, index, path)
    job_names = [job["name"] for job in builtin["torch-distributed"]["spec"]["template"]["spec"]["replicatedJobs"]]
    patches = _patches(job_names, patch, priority)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return Converted(trainjob, None, conv.notes)


def _gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        amounts = resources.get(part)
        for name, value in (amounts.items() if isinstance(amounts, dict) else ()):
            if "gpu" in str(name):
                try:
                    return int(str(value))
                except ValueError:
                    return 0
    return 0


# --- MPIJob --------------------------------------------------------------------------------------------------

#: mpirun/mpiexec options that take a value, and what becomes of them
_MPIRUN_VALUED = {
    "-np": "ranks", "-n": "ranks", "--np": "ranks", "-c": "ranks", "-N": "placement", "-npernode": "placement",
    "--npernode": "placement", "-ppn": "placement", "--map-by": "placement", "-map-by": "placement",
    "--bind-to": "placement", "-bind-to": "placement", "--rank-by": "placement", "-rank-by": "placement",
    "-H": "hosts", "--host": "hosts", "-host": "hosts", "-hosts": "hosts", "-hostfile": "hosts",
    "--hostfile": "hosts", "-machinefile": "hosts", "--machinefile": "hosts", "-f": "hosts",
    "-x": "export", "-wdir": "workdir", "--wdir": "workdir", "-genvlist": "export", "-envlist": "export",
}
_MPIRUN_TWO_VALUES = {"--mca": "mca", "-mca": "mca", "-genv": "env", "-env": "env", "--gmca": "mca"}
_MPIRUN_FLAGS = {"--allow-run-as-root", "--oversubscribe", "-oversubscribe", "--tag-output", "-tag-output",
                 "--timestamp-output", "--display-map", "-display-map", "--report-bindings", "-report-bindings",
                 "-v", "--verbose", "-q", "--quiet", "-prepend-rank", "-l", "-genvall", "-envall",
                 "--use-hwthread-cpus", "-use-hwthread-cpus", "--nooversubscribe"}
_LAUNCHERS = ("mpirun", "mpiexec", "mpiexec.hydra", "orterun")
_SHELL_SYNTAX = set(";&|<>$`()\\\n*?[]{}~")


def _launcher_argv(conv: _Conversion, container: dict[str, Any], path: str) -> list[str]:
    """The launcher container's command line, with a ``sh -c "mpirun ..."`` one unwrapped."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv or not all(isinstance(a, str) for a in argv):
        raise conv.fail(f"{path}.command", argv, "the Launcher has no command to run")
    if argv[0].rsplit("/", 1)[-1] in ("sh", "bash") and len(argv) == 3 and argv[1] in ("-c", "-lc"):
        if set(argv[2]) & _SHELL_SYNTAX:
            raise conv.fail(f"{path}.command", argv[2], "a shell script, not one mpirun command: write "
                            "spec.trainer.command as the program each rank runs")
        argv = shlex.split(argv[2])
    return argv


def _program(conv: _Conversion, argv: list[str], path: str, ranks: int, env: list[dict[str, Any]]) -> list[str]:
    """What each rank runs: the command after mpirun and its options (the options mapped or reported)."""
    if argv[0].rsplit("/", 1)[-1] not in _LAUNCHERS:
        conv.note(f"{path}.command", argv[0], "does not start with mpirun: it is run as each rank's program")
        return argv
    value: str | None
    i = 1
    while i < len(argv):
        option = argv[i]
        if option == "--":
            i += 1
            break
        if not option.startswith("-"):
            break
        name, _, inline = option.partition("=") if option.startswith("--") else (option, "", "")
        if name in _MPIRUN_FLAGS:
            if name != "--allow-run-as-root":
                conv.note(f"{path} mpirun", option, "dropped: hpc-bridge's launcher chooses mpirun's flags")
            i += 1
            continue
        if name in _MPIRUN_TWO_VALUES:
            if i + 2 >= len(argv) + (1 if inline else 0):
                raise conv.fail(f"{path} mpirun {name}", argv[i:], "needs two values")
            key, value = argv[i + 1], argv[i + 2]
            if _MPIRUN_TWO_VALUES[name] == "mca":
                env.append({"name": f"OMPI_MCA_{key}", "value": value})  # what --mca sets, exactly
            else:
                env.append({"name": key, "value": value})
            i += 3
            continue
        if name in _MPIRUN_VALUED:
            value = inline if inline else (argv[i + 1] if i + 1 < len(argv) else None)
            if value is None:
                raise conv.fail(f"{path} mpirun {name}", None, "needs a value")
            i += 1 if inline else 2
            what = _MPIRUN_VALUED[name]
            if what == "ranks":
                if not value.isdigit() or int(value) != ranks:
                    conv.note(f"{path} mpirun {name}", value, f"the TrainJob runs {ranks} ranks "
                              "(numNodes × numProcPerNode)")
            elif what == "export":
                for item in value.split(","):
                    var, eq, val = item.partition("=")
                    if eq:
                        env.append({"name": var, "value": val})
                    else:
                        conv.note(f"{path} mpirun {name}", item, "the launcher passes the TrainJob's env to "
                                  "every rank: set it in spec.trainer.env if the Launcher's env does not")
            elif what == "hosts":
                conv.note(f"{path} mpirun {name}", value, "dropped: hpc-bridge writes the hostfile")
            else:
                conv.note(f"{path} mpirun {name}", value, "dropped: hpc-bridge's launcher places the ranks "
                          "(numProcPerNode per node)")
            continue
        raise conv.fail(f"{path} mpirun", option, "an mpirun option the converter does not know: write "
                        "spec.trainer.command as the program each rank runs")
    program = argv[i:]
    if not program:
        raise conv.fail(f"{path}.command", argv, "mpirun with no program")
    return program


def _mpi(conv: _Conversion, builtin: dict[str, dict[str, Any]]) -> Converted:
    specs = conv.replicas("mpiReplicaSpecs")
    for role in specs:
        if role not in ("Launcher", "Worker"):
            raise conv.fail(f"spec.mpiReplicaSpecs.{role}", role, "an MPIJob has Launcher and Worker replicas")
    if "Launcher" not in specs:
        raise conv.fail("spec.mpiReplicaSpecs.Launcher", None, "an MPIJob needs its Launcher")
    spec = conv.doc.get("spec") or {}
    as_worker = bool(spec.get("runLauncherAsWorker"))
    workers = conv.count(specs["Worker"], "spec.mpiReplicaSpecs.Worker") if "Worker" in specs else 0
    nodes = workers + (1 if as_worker or not workers else 0)
    from bridge.plan import MAX_PROCS_PER_NODE

    slots = spec.get("slotsPerWorker", 1)
    if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_PROCS_PER_NODE:
        raise conv.fail("spec.slotsPerWorker", slots, f"must be a whole number from 1 to {MAX_PROCS_PER_NODE}")
    launcher_path = "spec.mpiReplicaSpecs.Launcher"
    launcher_meta, launcher_pod = conv.pod(specs["Launcher"], launcher_path)
    launcher_index, launcher = conv.framework_container(launcher_pod, None, launcher_path)
    env: list[dict[str, Any]] = copy.deepcopy(launcher.get("env") or [])
    argv = _launcher_argv(conv, launcher, f"{launcher_path}.template.spec.containers[{launcher_index}]")
    program = _program(conv, argv, f"{launcher_path}.template.spec.containers[{launcher_index}]", nodes * slots, env)
    if "Worker" in specs and workers:
        path = "spec.mpiReplicaSpecs.Worker"
        metadata, pod = conv.pod(specs["Worker"], path)
        index, worker = conv.framework_container(pod, None, path)
        for key in ("command", "args"):
            if worker.get(key):
                conv.note(f"{path}.template.spec.containers[{index}].{key}", worker[key],
                          "the runtime starts each node's sshd itself; dropped")
        if worker.get("image") and launcher.get("image") and worker["image"] != launcher["image"]:
            conv.note(f"{path}.template.spec.containers[{index}].image", worker["image"],
                      f"every node runs the Launcher's image {launcher['image']}")
        for item in worker.get("env") or []:
            if isinstance(item, dict) and not any(e.get("name") == item.get("name") for e in env):
                env.append(copy.deepcopy(item))
        source = worker
    else:
        path, metadata, pod, index, source = launcher_path, launcher_meta, launcher_pod, launcher_index, launcher
    trainer = conv.trainer_from({**source, "image": launcher.get("image") or source.get("image"),
                                 "command": program, "args": None, "env": env or None},
                                f"{path}.template.spec.containers[{index}]")
    trainer.pop("args", None)
    trainer.update(numNodes=nodes)
    if launcher.get("resources") and source is not launcher:
        conv.note(f"{launcher_path}.template.spec.containers[{launcher_index}].resources",
                  launcher["resources"], "each node gets the Worker's resources (resourcesPerNode)")
    implementation = spec.get("mpiImplementation", "OpenMPI")
    runtime_name = {"OpenMPI": "mpi-distributed", "MPICH": "mpich-distributed", "Intel": "mpi-distributed"}.get(
        implementation) if isinstance(implementation, str) else None
    if runtime_name is None:
        raise conv.fail("spec.mpiImplementation", implementation, "must be OpenMPI, Intel or MPICH")
    base = copy.deepcopy(builtin[runtime_name])
    mpi = base["spec"]["mlPolicy"]["mpi"]
    ssh_path = spec.get("sshAuthMountPath", "/root/.ssh")
    if not isinstance(ssh_path, str) or not ssh_path.startswith("/"):
        raise conv.fail("spec.sshAuthMountPath", ssh_path, "must be an absolute path")
    changed = {}
    if implementation != mpi.get("mpiImplementation"):
        changed["mpiImplementation"] = implementation
    if ssh_path != mpi.get("sshAuthMountPath"):
        changed["sshAuthMountPath"] = ssh_path
    runtime = None
    name = conv.mapping(conv.doc.get("metadata"), "metadata").get("name")
    if changed:
        # the built-in runtime with this job's MPI settings, beside the TrainJob in its namespace
        mpi.update(changed)
        runtime_name = f"{name}-mpi"
        namespace = (conv.doc.get("metadata") or {}).get("namespace")
        runtime = {"apiVersion": TRAINER_API, "kind": "TrainingRuntime",
                   "metadata": {"name": runtime_name, **({"namespace": namespace} if namespace else {}),
                                "labels": dict(base["metadata"].get("labels") or {})},
                   "spec": base["spec"]}
        conv.note("spec", ", ".join(f"{k}={v}" for k, v in sorted(changed.items())),
                  f"no built-in runtime has these MPI settings: TrainingRuntime {runtime_name} is written "
                  "(its pods run sshd as uid 1000, as Trainer's runtimes do: check the image agrees)")
    for key, value in spec.items():
        if key in ("launcherCreationPolicy",):
            conv.note(f"spec.{key}", value, "the launcher always waits for every node's sshd (dependsOn Ready)")
        elif key not in ("mpiReplicaSpecs", "runPolicy", "slotsPerWorker", "runLauncherAsWorker",
                         "mpiImplementation", "sshAuthMountPath"):
            conv.note(f"spec.{key}", value, "no equivalent; dropped")
    if slots != mpi.get("numProcPerNode", 1):
        trainer["numProcPerNode"] = slots
    trainjob = conv.trainjob(trainer, runtime_name, "TrainingRuntime" if runtime else "ClusterTrainingRuntime")
    priority = conv.run_policy(trainjob, nodes)
    patch = conv.pod_patch(metadata, pod, source, index, path)
    job_names = [job["name"] for job in base["spec"]["template"]["spec"]["replicatedJobs"]]
    patches = _patches(job_names, patch, priority)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return Converted(trainjob, runtime, conv.notes)


# --- entry point -----------------------------------------------------------------------------------------


def convert(document: dict[str, Any], source: str, builtin: dict[str, dict[str, Any]]) -> Converted:
    """A v1 job as a TrainJob (and the TrainingRuntime it needs, if any). *builtin* are the built-in runtimes
    by name, as documents."""
    conv = _Conversion(document, source)
    kind = document["kind"]
    if kind == "PyTorchJob":
        return _pytorch(conv, builtin)
    if kind == "MPIJob":
        return _mpi(conv, builtin)
    return _tensorflow(conv, builtin)


#: TFJob roles in the order their nodes are ranked (the chief is node 0, as TF_CONFIG's cluster lists it)
_TF_ROLES = (("Chief", "chief"), ("Master", "chief"), ("Worker", "worker"), ("PS", "ps"))


def _tensorflow(conv: _Conversion, builtin: dict[str, dict[str, Any]]) -> Converted:
    specs = conv.replicas("tfReplicaSpecs")
    known = {role for role, _ in _TF_ROLES} | {"Evaluator"}
    for role in specs:
        if role not in known:
            raise conv.fail(f"spec.tfReplicaSpecs.{role}", role, "a TFJob has Chief, Worker, PS and Evaluator "
                            "replicas")
    if "Chief" in specs and "Master" in specs:
        raise conv.fail("spec.tfReplicaSpecs.Master", "Master", "give Chief or Master (its old name), not both")
    roles, nodes = [], 0
    for role, name in _TF_ROLES:
        if role in specs:
            count = conv.count(specs[role], f"spec.tfReplicaSpecs.{role}")
            if count:
                roles.append(f"{name}={count}")
                nodes += count
    if "Evaluator" in specs:
        conv.note("spec.tfReplicaSpecs.Evaluator", conv.count(specs["Evaluator"], "spec.tfReplicaSpecs.Evaluator"),
                  "no evaluator beside the training nodes: run the evaluation as a TrainJob of its own; dropped")
    if not nodes:
        raise conv.fail("spec.tfReplicaSpecs", 0, "no replicas to run")
    # the template every node runs: the Worker's, else the chief's, else the parameter server's
    chosen = next(role for role in ("Worker", "Chief", "Master", "PS") if role in specs and
                  conv.count(specs[role], f"spec.tfReplicaSpecs.{role}"))
    path = f"spec.tfReplicaSpecs.{chosen}"
    metadata, pod = conv.pod(specs[chosen], path)
    index, container = conv.framework_container(pod, "tensorflow", path)
    for role, _ in _TF_ROLES:
        if role in specs and role != chosen:
            _, other = conv.pod(specs[role], f"spec.tfReplicaSpecs.{role}")
            conv.compare((path, _normalized(pod)), (f"spec.tfReplicaSpecs.{role}", _normalized(other)),
                         f"the {chosen}'s (with TF_CONFIG naming its role)")
    trainer = conv.trainer_from(container, f"{path}.template.spec.containers[{index}]")
    env = [e for e in trainer.get("env") or [] if not (isinstance(e, dict) and e.get("name") == "TF_CONFIG")]
    trainer["env"] = [*env, {"name": TF_ROLES_ENV, "value": ",".join(roles)}]
    trainer["numNodes"] = nodes
    spec = conv.doc.get("spec") or {}
    for key, value in spec.items():
        if key == "successPolicy":
            if value not in ("", "AllWorkers"):
                conv.note(f"spec.{key}", value, "the TrainJob succeeds when every node's command does")
        elif key == "enableDynamicWorker":
            if value:
                conv.note(f"spec.{key}", value, "no dynamic workers: the TrainJob runs its nodes, fixed")
        elif key not in ("tfReplicaSpecs", "runPolicy"):
            conv.note(f"spec.{key}", value, "no equivalent; dropped")
    # no built-in runtime runs TensorFlow: one like torch-distributed without its torch policy (every node
    # runs the command; the launcher gives each its TF_CONFIG from HPCBRIDGE_TF_ROLES)
    tfjob_name = conv.mapping(conv.doc.get("metadata"), "metadata").get("name")
    base = copy.deepcopy(builtin["torch-distributed"])
    base["spec"]["mlPolicy"] = {"numNodes": 1}
    for job in base["spec"]["template"]["spec"]["replicatedJobs"]:
        for runtime_container in job["template"]["spec"]["template"]["spec"]["containers"]:
            runtime_container["image"] = trainer.get("image") or "tensorflow/tensorflow"
    namespace = (conv.doc.get("metadata") or {}).get("namespace")
    runtime_name = f"{tfjob_name}-tensorflow"
    runtime = {"apiVersion": TRAINER_API, "kind": "TrainingRuntime",
               "metadata": {"name": runtime_name, **({"namespace": namespace} if namespace else {}),
                            "labels": {"trainer.kubeflow.org/framework": "tensorflow"}},
               "spec": base["spec"]}
    conv.note("kind", "TFJob", f"no built-in runtime runs TensorFlow: TrainingRuntime {runtime_name} is written; "
              f"each node gets TF_CONFIG for its role ({TF_ROLES_ENV}={','.join(roles)})")
    trainjob = conv.trainjob(trainer, runtime_name, "TrainingRuntime")
    priority = conv.run_policy(trainjob, nodes)
    patches = _patches(["node"], conv.pod_patch(metadata, pod, container, index, path), priority)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return Converted(trainjob, runtime, conv.notes)
