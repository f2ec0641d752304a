"""kubeflow.org/v2beta1 MPIJob (mpi-operator) → TrainJob on a built-in MPI runtime, or a TrainingRuntime
written for it when its MPI flavour or SSH path is one no built-in has: the Launcher's ``mpirun`` line is read
back to the program each rank runs, its options mapped or reported."""

from __future__ import annotations

import copy
import shlex
from typing import Any

from bridge.convert.kubeflow_v1.conversion import TRAINER_API, Conversion, Converted, runtime_patches

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


def _launcher_argv(conv: Conversion, container: dict[str, Any], path: str) -> list[str]:
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


def _program(conv: Conversion, argv: list[str], path: str, ranks: int, env: list[dict[str, Any]]) -> list[str]:
    """What each rank runs: the command after mpirun and its options (the options mapped or reported)."""
    if argv[0].rsplit("/", 1)[-1] not in _LAUNCHERS:
        conv.note(f"{path}.command", argv[0], "does not start with mpirun: it is run as each rank's program")
        return argv
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
        elif name in _MPIRUN_TWO_VALUES:
            i = _two_value_option(conv, argv, i, name, inline, path, env)
        elif name in _MPIRUN_VALUED:
            i = _valued_option(conv, argv, i, name, inline, path, ranks, env)
        else:
            raise conv.fail(f"{path} mpirun", option, "an mpirun option the converter does not know: write "
                            "spec.trainer.command as the program each rank runs")
    program = argv[i:]
    if not program:
        raise conv.fail(f"{path}.command", argv, "mpirun with no program")
    return program


def _two_value_option(conv: Conversion, argv: list[str], i: int, name: str, inline: str, path: str,
                      env: list[dict[str, Any]]) -> int:
    """``--mca key value`` and ``-genv name value`` at *i*, as env entries; the index past them."""
    if i + 2 >= len(argv) + (1 if inline else 0):
        raise conv.fail(f"{path} mpirun {name}", argv[i:], "needs two values")
    key, value = argv[i + 1], argv[i + 2]
    if _MPIRUN_TWO_VALUES[name] == "mca":
        env.append({"name": f"OMPI_MCA_{key}", "value": value})  # what --mca sets, exactly
    else:
        env.append({"name": key, "value": value})
    return i + 3


def _valued_option(conv: Conversion, argv: list[str], i: int, name: str, inline: str, path: str, ranks: int,
                   env: list[dict[str, Any]]) -> int:
    """An option with one value at *i* (inline after ``=`` or the next word), mapped or reported; the index
    past it."""
    value: str | None = inline if inline else (argv[i + 1] if i + 1 < len(argv) else None)
    if value is None:
        raise conv.fail(f"{path} mpirun {name}", None, "needs a value")
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
    return i + (1 if inline else 2)


def mpi(conv: Conversion, builtin: dict[str, dict[str, Any]]) -> Converted:
    specs = conv.replicas("mpiReplicaSpecs")
    spec = conv.doc.get("spec") or {}
    workers, nodes, slots = _counts(conv, specs, spec)
    launcher_path = "spec.mpiReplicaSpecs.Launcher"
    launcher_meta, launcher_pod = conv.pod(specs["Launcher"], launcher_path)
    launcher_index, launcher = conv.framework_container(launcher_pod, None, launcher_path)
    env: list[dict[str, Any]] = copy.deepcopy(launcher.get("env") or [])
    argv = _launcher_argv(conv, launcher, f"{launcher_path}.template.spec.containers[{launcher_index}]")
    program = _program(conv, argv, f"{launcher_path}.template.spec.containers[{launcher_index}]", nodes * slots, env)
    if "Worker" in specs and workers:
        path = "spec.mpiReplicaSpecs.Worker"
        metadata, pod = conv.pod(specs["Worker"], path)
        index, source = _worker_container(conv, pod, path, launcher, env)
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
    runtime_name, runtime, base = _runtime(conv, spec, builtin)
    _note_spec(conv, spec)
    if slots != base["spec"]["mlPolicy"]["mpi"].get("numProcPerNode", 1):
        trainer["numProcPerNode"] = slots
    trainjob = conv.trainjob(trainer, runtime_name, "TrainingRuntime" if runtime else "ClusterTrainingRuntime")
    priority = conv.run_policy(trainjob, nodes)
    patch = conv.pod_patch(metadata, pod, source, index, path)
    job_names = [job["name"] for job in base["spec"]["template"]["spec"]["replicatedJobs"]]
    patches = runtime_patches(job_names, patch, priority)
    if patches:
        trainjob["spec"]["runtimePatches"] = patches
    return Converted(trainjob, runtime, conv.notes)


def _counts(conv: Conversion, specs: dict[str, dict[str, Any]], spec: dict[str, Any]) -> tuple[int, int, int]:
    """(Worker pods, the TrainJob's nodes, ranks per node) of the MPIJob."""
    for role in specs:
        if role not in ("Launcher", "Worker"):
            raise conv.fail(f"spec.mpiReplicaSpecs.{role}", role, "an MPIJob has Launcher and Worker replicas")
    if "Launcher" not in specs:
        raise conv.fail("spec.mpiReplicaSpecs.Launcher", None, "an MPIJob needs its Launcher")
    as_worker = bool(spec.get("runLauncherAsWorker"))
    workers = conv.count(specs["Worker"], "spec.mpiReplicaSpecs.Worker") if "Worker" in specs else 0
    nodes = workers + (1 if as_worker or not workers else 0)
    from bridge.plan import MAX_PROCS_PER_NODE

    slots = spec.get("slotsPerWorker", 1)
    if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_PROCS_PER_NODE:
        raise conv.fail("spec.slotsPerWorker", slots, f"must be a whole number from 1 to {MAX_PROCS_PER_NODE}")
    return workers, nodes, slots


def _worker_container(conv: Conversion, pod: dict[str, Any], path: str, launcher: dict[str, Any],
                      env: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The Worker's container, which every node runs with the Launcher's image; its env entries the
    Launcher's lack are added to *env*."""
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
    return index, worker


def _runtime(conv: Conversion, spec: dict[str, Any], builtin: dict[str, dict[str, Any]],
             ) -> tuple[str, dict[str, Any] | None, dict[str, Any]]:
    """The runtime's name, the TrainingRuntime written when no built-in one has the job's MPI settings (else
    None), and the runtime the TrainJob's runs on as a document."""
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
    name = conv.mapping(conv.doc.get("metadata"), "metadata").get("name")
    if not changed:
        return runtime_name, None, base
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
    return runtime_name, runtime, base


def _note_spec(conv: Conversion, spec: dict[str, Any]) -> None:
    for key, value in spec.items():
        if key in ("launcherCreationPolicy",):
            conv.note(f"spec.{key}", value, "the launcher always waits for every node's sshd (dependsOn Ready)")
        elif key not in ("mpiReplicaSpecs", "runPolicy", "slotsPerWorker", "runLauncherAsWorker",
                         "mpiImplementation", "sshAuthMountPath"):
            conv.note(f"spec.{key}", value, "no equivalent; dropped")
