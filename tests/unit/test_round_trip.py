"""sbatch → TrainJob → sbatch keeps the Slurm job: the script that comes back asks Slurm for the node and task
options the original asked for, no more (real Slurm checks the whole job: tests/integration/slurm/
test_sbatch_fidelity.py::test_through_a_trainjob_the_same_job)."""

from __future__ import annotations

import pytest

from bridge import service
from bridge.adapters.slurm.render import render_script
from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX, SLURM_LAYOUT_ANNOTATION
from bridge.api.catalog import builtin_runtimes
from bridge.api.cluster import BridgeCluster, builtin_local_cluster
from bridge.api.loader import to_yaml
from bridge.api.trainjob import TrainJob
from bridge.convert.sbatch import apply_flags, to_trainjob
from bridge.errors import InvalidSpec
from bridge.plan import find_runtime, resolve
from bridge.sbatch.directives import merge, parse_flags
from bridge.sbatch.script import parse_script
from tests.builders import cluster, trainjob_doc

SLURM = cluster("slurm", "hpc")
#: the options that make a job's node and task layout, and the GPU and thread options that ride with them
LAYOUT = ("nodes", "ntasks", "ntasks-per-node", "gpus", "gpus-per-node", "gpus-per-task", "gres",
          "threads-per-core", "cpus-per-task")


def script(*directives: str) -> str:
    return "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + "srun hostname\n"


def convert(*directives: str) -> tuple[TrainJob, list[str]]:
    return to_trainjob(parse_script(script(*directives), "job"))


def plan(job: TrainJob, cluster: BridgeCluster = SLURM):
    return resolve(job, find_runtime(job, builtin_runtimes(job.spec.runtime_ref.name)), cluster)


def layout_of(text: str) -> dict[str, str | None]:
    return {name: d.value for name, d in parse_script(text).options.items() if name in LAYOUT}


def back(job: TrainJob) -> str:
    """``convert - --to sbatch`` of the TrainJob's YAML, as a user pipes it."""
    source = service.read_input("-", stdin=to_yaml([job]))
    return service.prepare(source, to="slurm").artifact.text()


def trainer(job: TrainJob) -> tuple[int | None, int | None]:
    return job.spec.trainer.num_nodes, job.spec.trainer.num_proc_per_node


# (directives, numNodes, numProcPerNode, layout annotation)
CASES = [
    ((), None, None, "none"),
    (("-n 1",), None, 1, "none"),
    (("-n 6",), None, 6, "none"),
    (("-n 16 --ntasks-per-node=4",), 4, 4, "ntasks-per-node"),
    (("-n 6 --ntasks-per-node=4",), 2, 4, "ntasks-per-node"),
    (("--ntasks-per-node=2",), None, 2, "ntasks-per-node"),
    (("-N 2",), 2, None, "nodes"),
    (("-N 2 -n 3",), 2, 2, "nodes"),
    (("-N 2 --ntasks-per-node=2",), 2, 2, "nodes,ntasks-per-node"),
    (("--nodes=1-3",), 1, None, "nodes"),
    (("--nodes=2-4", "-n 6"), 2, 3, "nodes"),
    (("--nodes=2-4", "--tasks-per-node=3"), 2, 3, "nodes,ntasks-per-node"),
    (("--gpus=3",), None, None, "none"),
    (("--gpus-per-task=1 -n 2",), None, 2, "none"),
    (("--threads-per-core=1", "-c 2"), None, None, "none"),
    (("-N 2", "--gpus=a100:4", "-c 2"), 2, None, "nodes"),
    (("-n 4", "-c 2", "--gres=gpu:2"), None, 4, "none"),
]


@pytest.mark.parametrize(("directives", "nodes", "procs", "layout"), CASES, ids=[" ".join(c[0]) or "none"
                                                                                 for c in CASES])
def test_round_trip_asks_slurm_what_the_script_asked(directives, nodes, procs, layout) -> None:
    job, _ = convert(*directives)
    # numNodes only where the script fixes the count; the layout says which of --nodes and
    # --ntasks-per-node it gave
    assert trainer(job) == (nodes, procs)
    assert (job.metadata.annotations or {})[SLURM_LAYOUT_ANNOTATION] == layout
    original = layout_of(script(*directives))
    assert layout_of(render_script(plan(job))) == original
    # and through YAML, as `convert x --to trainjob | convert - --to sbatch` does it
    assert layout_of(back(job)) == original


def test_the_issues_script_comes_back_as_itself() -> None:
    # was: --nodes=1 --ntasks-per-node=4 --ntasks=16, which Slurm refuses, and a note "over 1 node(s)"
    job, report = convert("-n 16 --ntasks-per-node=4")
    text = back(job)
    assert "#SBATCH --nodes" not in text
    assert [line for line in text.splitlines() if line.startswith("#SBATCH --n")] == [
        "#SBATCH --ntasks-per-node=4", "#SBATCH --ntasks=16"]
    assert not any("over 1 node(s)" in line for line in report), report
    assert any(line.startswith("--ntasks=16 --ntasks-per-node=4: numNodes 4") for line in report), report


def test_a_single_task_script_gets_no_task_options() -> None:
    # --ntasks-per-node=1 would make sbatch set SLURM_NTASKS, SLURM_NPROCS and SLURM_NTASKS_PER_NODE
    text = back(convert("-t 5", "-c 2")[0])
    assert [line for line in text.splitlines() if line.startswith("#SBATCH")][2:] == [
        "#SBATCH --cpus-per-task=2", "#SBATCH --time=00:05:00"]


@pytest.mark.parametrize(("directives", "edit", "field"), [
    # the script left the node count to Slurm: a numNodes of the user's is not silently dropped
    (("-n 6",), {"numNodes": 3}, "spec.trainer.numNodes"),
    ((), {"numNodes": 2}, "spec.trainer.numNodes"),
    (("-n 16 --ntasks-per-node=4",), {"numNodes": 2}, "spec.trainer.numNodes"),
    (("--nodes=2-4",), {"numNodes": 3}, "spec.trainer.numNodes"),
    # nor a numProcPerNode the script's --ntasks would not give
    (("-n 6",), {"numProcPerNode": 2}, "spec.trainer.numProcPerNode"),
    ((), {"numProcPerNode": 4}, "spec.trainer.numProcPerNode"),
])
def test_fields_the_layout_would_not_ask_for_are_refused(directives, edit, field) -> None:
    job, _ = convert(*directives)
    doc = job.to_wire()
    doc["spec"]["trainer"].update(edit)
    edited = TrainJob.model_validate(doc)
    with pytest.raises(InvalidSpec) as excinfo:
        plan(edited)
    assert excinfo.value.field == field and "\n" not in str(excinfo.value)
    assert SLURM_LAYOUT_ANNOTATION in str(excinfo.value) or "nodes" in str(excinfo.value)
    # without the annotation the fields are what Slurm is asked for, as for any TrainJob
    del doc["metadata"]["annotations"][SLURM_LAYOUT_ANNOTATION]
    text = render_script(plan(TrainJob.model_validate(doc)))
    assert "#SBATCH --nodes=" in text


@pytest.mark.parametrize("value", ["", "nodes,nodes", "ntasks", "all", "none,nodes", "Nodes"])
def test_a_bad_layout_annotation_is_refused(value) -> None:
    job, _ = convert("-N 2")
    job.metadata.annotations[SLURM_LAYOUT_ANNOTATION] = value
    with pytest.raises(InvalidSpec) as excinfo:
        plan(job)
    assert excinfo.value.field == f"metadata.annotations[{SLURM_LAYOUT_ANNOTATION}]"


def test_the_layout_is_a_batch_scripts_only() -> None:
    # under an ML runtime hpc-bridge lays the job out (one launcher per node): no layout is written, and one
    # written by hand is refused
    text = script("-N 2", "--gpus-per-node=4")
    job, _ = to_trainjob(parse_script(text, "train"), runtime="torch-distributed")
    assert SLURM_LAYOUT_ANNOTATION not in (job.metadata.annotations or {})
    job.metadata.annotations = {**(job.metadata.annotations or {}), SLURM_LAYOUT_ANNOTATION: "nodes"}
    with pytest.raises(InvalidSpec, match="only a batch script"):
        plan(job)


def test_off_slurm_the_fields_say_what_runs() -> None:
    job, _ = convert("--ntasks-per-node=2")
    local = plan(job, builtin_local_cluster())
    assert (local.nodes, local.procs_per_node, local.slurm) == (1, 2, None)


@pytest.mark.parametrize(("directives", "flags"), [
    (("-n 6",), ["-N", "3"]),
    (("-n 6",), ["--ntasks-per-node=3"]),
    (("-n 16 --ntasks-per-node=4",), ["-n", "8"]),
    (("-N 2 --ntasks-per-node=2",), ["-n", "3"]),
    (("--nodes=1-3",), ["-N", "2"]),
    (("-N 4",), ["--nodes=2-3", "-n", "5"]),
    ((), ["-n", "2"]),
])
def test_flags_over_a_converted_trainjob_are_flags_over_the_script(directives, flags) -> None:
    # `hpcbridge submit job.yaml -N 3` gives the job `sbatch -N 3 job.sbatch` gives
    job, _ = convert(*directives)
    laid, _ = apply_flags(job, parse_flags(flags))
    direct, _ = to_trainjob(merge(parse_script(script(*directives), "job"), parse_flags(flags)))
    assert trainer(laid) == trainer(direct)
    assert laid.metadata.annotations == direct.metadata.annotations
    assert layout_of(render_script(plan(laid))) == layout_of(script(*directives, " ".join(flags)))


def test_flags_without_layout_options_keep_the_layout() -> None:
    job, _ = convert("-n 16 --ntasks-per-node=4")
    held, _ = apply_flags(job, parse_flags(["--hold", "-t", "10"]))
    assert held.metadata.annotations[SLURM_LAYOUT_ANNOTATION] == "ntasks-per-node"
    assert trainer(held) == (4, 4) and held.spec.suspend is True


def test_flags_over_a_hand_written_trainjob_add_no_layout() -> None:
    job = TrainJob.model_validate(trainjob_doc("steps", runtime="sbatch-script", trainer={
        "command": ["/bin/bash", "-c", "true"], "numNodes": 2, "numProcPerNode": 2}))
    laid, _ = apply_flags(job, parse_flags(["-n", "3"]))
    assert SLURM_LAYOUT_ANNOTATION not in (laid.metadata.annotations or {})
    assert laid.metadata.annotations[f"{SBATCH_PASSTHROUGH_PREFIX}ntasks"] == "3"
    # hpc-bridge's own layout, as before: the node count stated
    assert layout_of(render_script(plan(laid)))["nodes"] == "2"
