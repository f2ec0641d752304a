"""resolve(): Kubeflow's precedence rules, annotations, cluster defaults and the errors they raise."""

from __future__ import annotations

import copy

import pytest

from bridge.api import load_documents
from bridge.api.catalog import builtin_runtimes
from bridge.errors import InvalidSpec
from bridge.plan import Launcher, derive_uid, find_runtime, resolve, select_cluster
from tests import builders
from tests.builders import cluster

RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: rt, annotations: {hpcbridge.io/cluster: hpc}}
spec:
  mlPolicy: {numNodes: 3, mpi: {numProcPerNode: 1, mpiImplementation: MPICH}}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: runtime-image
                      command: [runtime-cmd]
                      args: [--runtime-arg]
                      env: [{name: A, value: runtime}, {name: B, value: runtime}]
                      resources: {requests: {cpu: "2", memory: 1Gi}, limits: {nvidia.com/gpu: "4"}}
"""


def trainjob(**trainer):
    return builders.trainjob("j", runtime="rt", trainer=trainer)


RT = load_documents(RUNTIME)[0]


def test_runtime_defaults_flow_into_the_plan() -> None:
    plan = resolve(trainjob(), RT, cluster())
    assert plan.nodes == 3
    assert plan.launcher is Launcher.MPICH
    assert plan.command == ("runtime-cmd", "--runtime-arg")
    assert plan.image == "runtime-image"
    assert [(e.name, e.value) for e in plan.env] == [("A", "runtime"), ("B", "runtime")]
    # Kubeflow: runtime numProcPerNode 1 with several GPUs becomes one slot per GPU
    assert plan.procs_per_node == 4
    assert plan.resources.gpus == 4 and plan.resources.gpu_resource == "nvidia.com/gpu"
    assert plan.resources.memory_bytes == 2**30


def test_trainjob_fields_override_runtime() -> None:
    plan = resolve(trainjob(numNodes=2, numProcPerNode=3, image="mine", command=["c"], args=["a"],
                            env=[{"name": "B", "value": "job"}, {"name": "C", "value": "job"}],
                            resourcesPerNode={"requests": {"cpu": "500m"}}), RT, cluster())
    assert (plan.nodes, plan.procs_per_node, plan.image, plan.command) == (2, 3, "mine", ("c", "a"))
    assert [(e.name, e.value) for e in plan.env] == [("A", "runtime"), ("B", "job"), ("C", "job")]
    assert plan.resources.cpu_count == 1  # 500m rounds up to one CPU
    assert plan.resources.memory_bytes == 2**30  # untouched keys keep the runtime's value


def test_command_alone_drops_runtime_args_only_when_args_given() -> None:
    plan = resolve(trainjob(command=["mine"]), RT, cluster())
    assert plan.command == ("mine", "--runtime-arg")


def test_reserved_env_rejected() -> None:
    job = trainjob(command=["x"], env=[{"name": "PET_NNODES", "value": "9"}])
    torch = find_runtime(load_documents("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n"
                                        "metadata: {name: t}\nspec: {runtimeRef: {name: torch-distributed}}")[0],
                         builtin_runtimes())
    with pytest.raises(InvalidSpec, match=r"spec\.trainer\.env\[0\]\.name: reserved by the torch policy.*PET_NNODES"):
        resolve(job, torch, cluster())


def test_zero_nodes_cannot_run() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.trainer\.numNodes: must be at least 1"):
        resolve(trainjob(numNodes=0), RT, cluster())


def test_unknown_runtime_lists_known_ones() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.runtimeRef\.name: no ClusterTrainingRuntime.*known: .*torch"):
        find_runtime(trainjob(), builtin_runtimes())


def test_annotations_become_backend_options_and_defaults_fill_the_rest() -> None:
    job = trainjob(command=["x"])
    job.metadata.annotations = {"hpcbridge.io/partition": "gpu", "hpcbridge.io/array": "0-7%2"}
    plan = resolve(job, RT, cluster(defaults={"partition": "cpu", "qos": "normal"},
                                    accountMapping={"default": "team-a"}))
    assert (plan.options.partition, plan.options.qos, plan.options.account, plan.options.array) == \
        ("gpu", "normal", "team-a", "0-7%2")


@pytest.mark.parametrize(("key", "value"), [
    ("hpcbridge.io/partition", "gpu\n#SBATCH --x"),
    ("hpcbridge.io/partition", "a b"),
    ("hpcbridge.io/exclusive", "yes"),
    ("hpcbridge.io/array", "1-3;rm"),
    ("hpcbridge.io/partiton", "gpu"),
    ("hpcbridge.io/output", "/x\"y"),
])
def test_bad_annotations_rejected(key: str, value: str) -> None:
    job = trainjob(command=["x"])
    job.metadata.annotations = {key: value}
    with pytest.raises(InvalidSpec) as info:
        resolve(job, RT, cluster())
    assert key in info.value.field
    assert "\n" not in str(info.value)


def test_namespace_not_allowed_by_cluster() -> None:
    with pytest.raises(InvalidSpec, match="does not accept this namespace"):
        resolve(trainjob(command=["x"]), RT, cluster(allowedNamespaces=["prod"]))


def test_cluster_selection_order() -> None:
    clusters = {"local": cluster("local", "local"), "hpc": cluster(), "other": cluster(name="other")}
    job = trainjob()
    assert select_cluster(job, RT, clusters).name == "hpc"  # runtime annotation
    job.metadata.annotations = {"hpcbridge.io/cluster": "other"}
    assert select_cluster(job, RT, clusters).name == "other"  # TrainJob annotation wins
    assert select_cluster(job, RT, clusters, "local").name == "local"  # explicit choice wins
    with pytest.raises(InvalidSpec, match="no such cluster"):
        select_cluster(job, RT, clusters, "nope")


def test_uid_is_stable_for_the_same_trainjob() -> None:
    a, b = trainjob(), trainjob(numNodes=5)
    assert derive_uid(a) == derive_uid(b)
    c = copy.deepcopy(a)
    c.metadata.uid = "given"
    assert derive_uid(c) == "given"


def test_runtime_patch_is_strategic_merged() -> None:
    job = builders.trainjob("j", runtime="rt", runtimePatches=[{"manager": "example.com/tool", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
            "nodeSelector": {"zone": "a"}, "containers": [{"name": "node", "env": [{"name": "A", "value": "patched"}]}],
        }}}}}]}}}}])
    plan = resolve(job, RT, cluster("kubernetes"))
    pod = plan.on_kubernetes().jobset_template["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"zone": "a"}
    assert [(e.name, e.value) for e in plan.env] == [("A", "patched"), ("B", "runtime")]
    assert pod["containers"][0]["image"] == "runtime-image"


def test_patch_naming_a_missing_job_rejected() -> None:
    job = builders.trainjob("j", runtime="rt", runtimePatches=[{"manager": "example.com/tool", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [{"name": "ghost"}]}}}}])
    with pytest.raises(InvalidSpec, match="has no such replicated job"):
        resolve(job, RT, cluster())


def _builtin(name: str):
    return next(runtime for runtime in builtin_runtimes() if runtime.metadata.name == name)


def test_xgboost_counts_one_worker_per_gpu_and_validates_who_runs_the_tracker() -> None:
    xgb = _builtin("xgboost-distributed")
    plan = resolve(trainjob(numNodes=2, command=["python3", "t.py"],
                            resourcesPerNode={"limits": {"nvidia.com/gpu": 4}}), xgb, cluster())
    assert (plan.framework, plan.launcher, plan.nodes, plan.procs_per_node) == ("xgboost", Launcher.PLAIN, 2, 4)
    assert resolve(trainjob(command=["x"]), xgb, cluster()).procs_per_node == 1
    launch = [{"name": "HPCBRIDGE_XGBOOST_TRACKER", "value": "launch"}]
    assert resolve(trainjob(command=["x"], env=launch), xgb, cluster()).procs_per_node == 1
    with pytest.raises(InvalidSpec, match=r"spec\.trainer\.env\[HPCBRIDGE_XGBOOST_TRACKER\]: use one of script, launch \(got 'both'\)"):
        resolve(trainjob(command=["x"], env=[{"name": "HPCBRIDGE_XGBOOST_TRACKER", "value": "both"}]), xgb, cluster())
    with pytest.raises(InvalidSpec, match="only an xgboost runtime has a tracker"):
        resolve(trainjob(command=["x"], env=launch), _builtin("torch-distributed"), cluster())


def test_more_processes_than_gpus_per_node_is_said_once() -> None:
    plan = resolve(trainjob(numProcPerNode=6, command=["x"]), RT, cluster())
    assert [note for note in plan.notes if "share" in note] == [
        "spec.trainer.numProcPerNode: 6 processes per node share 4 nvidia.com/gpu per node in replicated job "
        "'node': some processes share a GPU (NCCL refuses two ranks on one GPU)"]
    assert not [note for note in resolve(trainjob(numProcPerNode=4, command=["x"]), RT, cluster()).notes
                if "share" in note]
