"""The Slurm adapter against a real slurmctld + 4 slurmd: what sbatch receives, states, cancel, logs."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from bridge.adapters.base import JobState
from bridge.api import load_documents
from bridge.api.catalog import builtin_runtimes
from bridge.errors import BackendRejected
from bridge.plan import find_runtime, resolve
from tests import builders
from tests.harness import layer

from .conftest import finished, state_is, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

PLAIN = load_documents("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
                       "metadata: {name: plain}\nspec: {mlPolicy: {numNodes: 1}}\n")[0]


def trainjob(name: str, command: list[str], *, nodes: int = 1, runtime=PLAIN, annotations=None, env=None,
             resources=None, deadline=None, suspend=None, procs=None):
    trainer = {"numNodes": nodes, "command": command}
    if env:
        trainer["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if resources:
        trainer["resourcesPerNode"] = {"requests": resources}
    if procs:
        trainer["numProcPerNode"] = procs
    spec = {}
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    if suspend is not None:
        spec["suspend"] = suspend
    return builders.trainjob(name, runtime=runtime.name, annotations=annotations or {}, trainer=trainer, **spec)


def submit(adapter, job, runtime=PLAIN):
    plan = resolve(job, runtime, adapter.cluster)
    return plan, layer.submit(adapter, plan)


def scontrol(slurm_cluster, job_id: str) -> dict[str, str]:
    out = slurm_cluster.run("scontrol", "--oneliner", "show", "job", job_id).stdout
    return dict(re.findall(r"(\S+?)=(\S*)", out))


def test_two_node_job_is_what_slurm_gets(adapter, slurm_cluster, tmp_path) -> None:
    job = trainjob("two-nodes", ["sh", "-c", "sleep 1"], nodes=2, deadline=600,
                   resources={"cpu": "2", "memory": "512Mi", "nvidia.com/gpu": "1"},
                   annotations={"hpcbridge.io/workdir": str(tmp_path)})
    plan, ref = submit(adapter, job)
    info = scontrol(slurm_cluster, ref.job_id)
    assert info["JobName"] == "two-nodes"
    assert info["NumNodes"].split("-")[0] == "2"  # "2-2" while pending
    assert info["NumTasks"] == "2"  # one launcher per node for a plain job
    assert info["CPUs/Task"] == "2"
    assert info["MinMemoryNode"] == "512M"
    assert "gpu:1" in info.get("TresPerNode", "")
    assert info["TimeLimit"] == "00:10:00"
    assert info["Partition"] == "debug"
    assert info["Comment"] == f"hpcbridge.io/uid={plan.uid}"
    assert wait_for(adapter, ref, finished).state == JobState.SUCCEEDED


def test_completed_job_output_and_logs(adapter, tmp_path) -> None:
    job = trainjob("hello", ["sh", "-c", 'echo "hello from $SLURM_JOB_NODELIST"; echo "$GREETING"'],
                   env={"GREETING": "it's $(not) a `command`\nsecond line"},
                   annotations={"hpcbridge.io/workdir": str(tmp_path), "hpcbridge.io/output": f"{tmp_path}/%x-%j.out"})
    _, ref = submit(adapter, job)
    status = wait_for(adapter, ref, finished)
    assert (status.state, status.exit_code) == (JobState.SUCCEEDED, 0)
    text = "".join(adapter.logs(ref))
    assert "hello from node1" in text
    assert "it's $(not) a `command`\nsecond line" in text


def test_failed_job_exit_code(adapter, tmp_path) -> None:
    _, ref = submit(adapter, trainjob("fails", ["sh", "-c", "exit 3"],
                                      annotations={"hpcbridge.io/workdir": str(tmp_path)}))
    status = wait_for(adapter, ref, finished)
    assert (status.state, status.exit_code) == (JobState.FAILED, 3)


def test_cancel_running_and_pending(adapter, tmp_path) -> None:
    ann = {"hpcbridge.io/workdir": str(tmp_path)}
    _, running = submit(adapter, trainjob("runs-long", ["sleep", "300"], annotations=ann))
    assert wait_for(adapter, running, state_is(JobState.RUNNING)).state == JobState.RUNNING
    _, held = submit(adapter, trainjob("held", ["true"], annotations=ann, suspend=True))
    pending = adapter.poll([held])[held]
    assert pending.state == JobState.PENDING and "JobHeldUser" in (pending.reason or "")
    adapter.cancel(running)
    adapter.cancel(held)
    assert wait_for(adapter, running, finished).state == JobState.CANCELLED
    assert wait_for(adapter, held, finished).state == JobState.CANCELLED


def test_a_recorded_job_id_is_asked_for_first_and_trusted_only_where_its_job_carries_the_uid(
        adapter, monkeypatch, tmp_path) -> None:
    """The operator re-attaching after a restart hands find() the job id it recorded on the TrainJob (an
    annotation its tenant can write): that job is asked for by id, as this user's, and taken only where it carries
    the uid and is live; anything else is read from the listing of this user's jobs, as without one."""
    from bridge.adapters.base import Identity

    ann = {"hpcbridge.io/workdir": str(tmp_path)}
    a, job_a = submit(adapter, trainjob("recorded-a", ["true"], annotations=ann, suspend=True))
    b, job_b = submit(adapter, trainjob("recorded-b", ["true"], annotations=ann, suspend=True))
    asked: list[list[str]] = []
    run = adapter.transport.run
    monkeypatch.setattr(adapter.transport, "run", lambda argv, *args, **kw: asked.append(list(argv)) or run(
        argv, *args, **kw))
    try:
        found = adapter.find([Identity(a.uid, a.name, a.namespace, job_a.job_id)])
        assert {uid: (s.ref.job_id, s.state) for uid, s in found.items()} == {a.uid: (job_a.job_id, JobState.PENDING)}
        (squeue,) = asked
        assert f"--jobs={job_a.job_id}" in squeue and "--me" in squeue  # by id, as this user: not the queue
        # an id naming another TrainJob's job: not taken; the listing finds a's own
        asked.clear()
        found = adapter.find([Identity(a.uid, a.name, a.namespace, job_b.job_id)])
        assert {uid: s.ref.job_id for uid, s in found.items()} == {a.uid: job_a.job_id}
        assert len(asked) == 2 and not any(arg.startswith("--jobs=") for arg in asked[1])
        # a finished job (a rerun may be newer) and an id Slurm never gave: both from the listing
        adapter.cancel(job_b)
        assert wait_for(adapter, job_b, finished).state == JobState.CANCELLED
        found = adapter.find([Identity(b.uid, b.name, b.namespace, job_b.job_id),
                              Identity(a.uid, a.name, a.namespace, "999999")])
        assert {uid: (s.ref.job_id, s.state) for uid, s in found.items()} == {
            a.uid: (job_a.job_id, JobState.PENDING), b.uid: (job_b.job_id, JobState.CANCELLED)}
    finally:
        adapter.cancel(job_a)


def test_dependency_waits_for_parent(adapter, tmp_path) -> None:
    ann = {"hpcbridge.io/workdir": str(tmp_path)}
    _, parent = submit(adapter, trainjob("parent", ["sleep", "2"], annotations=ann))
    _, child = submit(adapter, trainjob("child", ["true"], annotations={
        **ann, "hpcbridge.io/dependency": f"afterok:{parent.job_id}"}))
    early = adapter.poll([child])[child]
    assert early.state == JobState.PENDING and "Dependency" in (early.reason or "")
    assert wait_for(adapter, child, finished).state == JobState.SUCCEEDED


def test_submit_twice_is_one_job(adapter, slurm_cluster, tmp_path) -> None:
    job = trainjob("idempotent", ["sleep", "5"], annotations={"hpcbridge.io/workdir": str(tmp_path)})
    _, first = submit(adapter, job)
    _, second = submit(adapter, job)
    assert first == second
    names = slurm_cluster.run("squeue", "-h", "-t", "all", "-n", "idempotent", "-o", "%i").stdout.split()
    assert names == [first.job_id]
    adapter.cancel(first)


def test_more_nodes_than_the_partition_has_pends_with_reason(adapter, slurm_cluster, tmp_path) -> None:
    job = trainjob("too-big", ["true"], nodes=8, annotations={"hpcbridge.io/workdir": str(tmp_path)})
    if slurm_cluster.release == "24.11":
        # 24.11 refuses at submit what 22.05 and 26.05 keep pending: Slurm's words, typed, nothing left behind
        with pytest.raises(BackendRejected, match="Requested node configuration is not available"):
            submit(adapter, job)
        return
    _, ref = submit(adapter, job)
    status = wait_for(adapter, ref, lambda s: bool(s.reason))
    assert status.state == JobState.PENDING
    assert status.reason.startswith("Partition")  # PartitionNodeLimit or PartitionConfig, Slurm's own words
    adapter.cancel(ref)


def test_bad_sbatch_option_is_rejected_with_slurms_message(adapter, tmp_path) -> None:
    job = trainjob("bad-qos", ["true"], annotations={"hpcbridge.io/workdir": str(tmp_path),
                                                      "hpcbridge.io/partition": "nosuchpartition"})
    with pytest.raises(BackendRejected, match="invalid partition"):
        submit(adapter, job)


def test_timeout_state(adapter, tmp_path) -> None:
    # Slurm rounds limits up to a minute and checks them every ~30 s: this test takes about 90 s
    _, ref = submit(adapter, trainjob("too-slow", ["sleep", "600"], deadline=1,
                                      annotations={"hpcbridge.io/workdir": str(tmp_path)}))
    status = wait_for(adapter, ref, finished, timeout=300)
    assert status.state == JobState.TIMEOUT


def test_mpi_job_on_the_allocation(adapter, tmp_path) -> None:
    """A 2-node x 2-rank Open MPI TrainJob: the batch script runs hpcbridge launch, which runs mpirun."""
    example = (Path(__file__).resolve().parents[3] / "examples" / "mpi_allreduce.py")
    runtime = find_runtime(load_documents("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n"
                                          "metadata: {name: x}\nspec: {runtimeRef: {name: mpi-distributed}}")[0],
                           builtin_runtimes())
    # All emulated nodes share one host name here, so Open MPI's shared-memory transport would collide
    # between "nodes"; real nodes don't need this. Multi-host MPI under Slurm: test_slurm_netns_*.
    job = trainjob("mpi-on-slurm", [sys.executable, str(example)], nodes=2, procs=2, runtime=runtime,
                   env={"OMPI_MCA_btl": "self,tcp"}, annotations={"hpcbridge.io/workdir": str(tmp_path)})
    _, ref = submit(adapter, job, runtime)
    status = wait_for(adapter, ref, finished)
    text = "".join(adapter.logs(ref))
    assert status.state == JobState.SUCCEEDED, text
    assert "allreduce result: 10 OK" in text
    assert len(re.findall(r"rank \d/4 on ", text)) == 4


def test_logs_follow_until_the_job_ends(adapter, tmp_path) -> None:
    job = trainjob("follows", ["sh", "-c", "for i in 1 2 3; do echo line $i; sleep 1; done"],
                   annotations={"hpcbridge.io/workdir": str(tmp_path), "hpcbridge.io/output": f"{tmp_path}/%x-%j.out"})
    _, ref = submit(adapter, job)
    wait_for(adapter, ref, state_is(JobState.RUNNING))
    text = "".join(adapter.logs(ref, follow=True, poll_interval=0.2))
    assert [line for line in text.splitlines() if line.startswith("line")] == ["line 1", "line 2", "line 3"]
    assert adapter.poll([ref])[ref].state.finished


def test_cancel_with_signal_and_grace(adapter, tmp_path) -> None:
    marker, started = tmp_path / "got-term", tmp_path / "started"
    # a loop, not `sleep & wait`: the step's TERM also reaches sleep, and sh must still be there to trap it
    job = trainjob("graceful", ["sh", "-c", f"trap 'touch {marker}; exit 0' TERM; touch {started}; "
                                            "while :; do sleep 0.2; done"],
                   annotations={"hpcbridge.io/workdir": str(tmp_path)})
    _, ref = submit(adapter, job)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:  # the trap is set
        time.sleep(0.1)
    adapter.cancel(ref, signal="TERM", grace_seconds=30)
    assert wait_for(adapter, ref, finished).state == JobState.CANCELLED
    assert marker.exists(), "".join(adapter.logs(ref))  # the job saw SIGTERM and could checkpoint
