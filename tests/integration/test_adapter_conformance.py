"""One contract, every backend on its real engine: the same scenarios through the orchestration layer.

local runs processes here; slurm is the real Slurm cluster (its commands run here, over SSH on a login
host, or through slurmrestd in the newest API both speak); kubernetes the real control plane (JobSets on
kwok nodes, which schedule but run no process: scenarios that need a command's output or exit code read
``capabilities.runs_commands``); kubernetes-real the control plane with real kubelet nodes, whose pods run the
command (tests/harness/kubelet.py); flux a live instance when flux-core is on PATH (both transports).
A new backend passes this module: one package, one line in bridge.adapters.REGISTRY, one engine in
tests/integration/engines.py.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from bridge import service
from bridge.adapters.base import Capabilities, Identity, JobState
from bridge.errors import AlreadyRan, BridgeError
from tests.harness.polling import poll_until
from tests.integration.engines import Engine, finished

pytestmark = pytest.mark.integration

#: kwok's knobs (tests/harness/kube.py), as Job template patches: a labelled pod fails (no retries), a pod
#: whose completion is an hour away stays Running
KWOK_FAIL = {"backoffLimit": 0, "template": {"metadata": {"labels": {
    "pod-container-running-failed.stage.kwok.x-k8s.io": "true"}}}}
KWOK_NEVER_ENDS = {"template": {"metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}}}}


def test_submit_find_poll_logs_finish(engine: Engine) -> None:
    prepared = engine.prepare("conform-ok", ["sh", "-c", "echo conformance-marker-$((40+2)); sleep 1"])
    adapter = prepared.adapter
    first = service.submit(prepared)
    assert not first.existing
    found = adapter.find([Identity(prepared.plan.uid, prepared.plan.name, prepared.plan.namespace)])
    assert found[prepared.plan.uid].ref.job_id == first.ref.job_id
    status = finished(adapter, first.ref)
    assert status.state == JobState.SUCCEEDED, status
    assert status.exit_code in (0, None)
    if adapter.capabilities.runs_commands and not engine.kwok:
        assert "conformance-marker-42" in "".join(adapter.logs(first.ref))
    listed = {s.ref.job_id: s for s in service.list_jobs(adapter)}
    assert first.ref.job_id in listed and listed[first.ref.job_id].ref.uid == prepared.plan.uid


def test_submit_twice_is_one_job_and_a_finished_one_reruns_only_when_asked(engine: Engine) -> None:
    prepared = engine.prepare("conform-twice", ["sh", "-c", "sleep 2"])
    adapter = prepared.adapter
    first = service.submit(prepared)
    again = service.submit(prepared)
    assert again.existing and again.ref.job_id == first.ref.job_id
    assert finished(adapter, first.ref).state == JobState.SUCCEEDED
    with pytest.raises(AlreadyRan) as info:
        service.submit(prepared)
    assert info.value.job_id == first.ref.job_id and info.value.state == "Succeeded"
    attached = service.submit(prepared, if_finished="attach")
    assert attached.existing and attached.ref.job_id == first.ref.job_id
    rerun = service.submit(prepared, if_finished="rerun")
    assert not rerun.existing
    if not adapter.capabilities.unique_names:
        assert rerun.ref.job_id != first.ref.job_id
    assert finished(adapter, rerun.ref).state == JobState.SUCCEEDED
    # the newest run is the one found for the uid, also where the first run's id is handed over as the job last
    # recorded for it (the operator's annotation: a hint, never the answer by itself)
    assert service.submit(prepared, if_finished="attach").ref.job_id == rerun.ref.job_id
    recorded = Identity(prepared.plan.uid, prepared.plan.name, prepared.plan.namespace, first.ref.job_id)
    assert adapter.find([recorded])[prepared.plan.uid].ref.job_id == rerun.ref.job_id


def test_failing_command_is_failed_with_its_exit_code(engine: Engine) -> None:
    prepared = engine.prepare("conform-fails", ["sh", "-c", "echo going down; exit 3"], KWOK_FAIL)
    adapter = prepared.adapter
    ref = service.submit(prepared).ref
    status = finished(adapter, ref)
    assert status.state == JobState.FAILED, status
    if not engine.kwok:  # kwok's failing pods exit 1 whatever the command; JobSets report no exit code
        assert status.exit_code == 3, status


def test_cancel_running_job_ends_cancelled(engine: Engine) -> None:
    prepared = engine.prepare("conform-cancel", ["sleep", "300"], KWOK_NEVER_ENDS)
    adapter = prepared.adapter
    ref = service.submit(prepared).ref
    running = poll_until(adapter, ref, lambda s: s.state == JobState.RUNNING, timeout=120, interval=0.2)
    assert running.state == JobState.RUNNING, running
    service.cancel(adapter, [ref.job_id], grace_seconds=5)
    status = finished(adapter, ref, timeout=120)
    assert status.state == JobState.CANCELLED, status
    # and the record says so across a fresh adapter (another process would see the same)
    fresh = service.get_adapter(engine.cluster)
    assert fresh.poll([ref])[ref].state == JobState.CANCELLED


def test_a_listing_answers_a_recorded_live_job_as_the_lookup_by_uid_does(engine: Engine) -> None:
    """Where the backend says its listing holds what its lookup finds (``lists_every_job``), a re-attach burst
    shares one listing: it must answer a recorded unfinished job as ``find`` does, and leave everything else
    (another uid's job, a finished one) to ``find``."""
    prepared = engine.prepare("conform-listed", ["sleep", "300"], KWOK_NEVER_ENDS)
    adapter = prepared.adapter
    listing = service.listing(adapter)
    if not adapter.capabilities.lists_every_job:
        assert listing is None
        pytest.skip(f"{adapter.backend}: its lookup by uid reads more than one listing holds")
    ref = service.submit(prepared).ref
    recorded = Identity(prepared.plan.uid, prepared.plan.name, prepared.plan.namespace, ref.job_id)
    listing = service.listing(adapter)
    assert listing is not None
    listed = listing.live(recorded)
    assert listed is not None and listed.ref.job_id == adapter.find([recorded])[recorded.uid].ref.job_id == ref.job_id
    assert listing.live(replace(recorded, uid=str(uuid.uuid4()))) is None
    assert listing.live(replace(recorded, job_id=None)) is None
    # answered from the listing: nothing looked up, the job attached, not sent again
    again = service.submit_many([replace(prepared, recorded_job=ref.job_id)], if_finished="reattach",
                                listing=listing)[0]
    assert again.existing and again.ref.job_id == ref.job_id
    service.cancel(adapter, [ref.job_id])
    assert finished(adapter, ref, timeout=120).state == JobState.CANCELLED
    assert service.listing(adapter).live(recorded) is None  # type: ignore[union-attr]
    assert adapter.find([recorded])[recorded.uid].ref.job_id == ref.job_id


def test_signal_names_come_from_one_table(engine: Engine) -> None:
    prepared = engine.prepare("conform-signal", ["sleep", "300"], KWOK_NEVER_ENDS)
    adapter = prepared.adapter
    with pytest.raises(BridgeError) as info:
        service.cancel(adapter, ["1"], signal="SIGNOTHING")
    assert info.value.exit_code == 2 and "unknown signal" in str(info.value)


def test_unknown_job_is_unknown_not_an_exception(engine: Engine) -> None:
    adapter = service.get_adapter(engine.cluster)
    (status,) = service.status(adapter, [engine.unknown_id])
    assert status.state == JobState.UNKNOWN and status.reason


def test_options_the_backend_lacks_are_refused_before_anything_is_sent(engine: Engine) -> None:
    prepared = engine.prepare("conform-options", ["true"])
    adapter = prepared.adapter
    declared = {option.name for option in adapter.options}
    missing = next((name for name in ("array", "qos", "partition") if name not in declared), None)
    if missing is None:
        assert {"partition", "account", "qos", "array", "dependency"} <= declared  # slurm declares them all
        return
    plan = replace(prepared.plan, options=replace(prepared.plan.options, **{missing: "x"}))
    with pytest.raises(BridgeError) as info:
        adapter.check_options(plan)
    assert info.value.exit_code == 2 and f"hpcbridge.io/{missing}" in str(info.value)
    assert isinstance(adapter.capabilities, Capabilities)


def test_batch_script_steps_run_and_a_failed_step_fails_the_job(engine: Engine, tmp_path) -> None:
    """An unchanged batch script: its srun steps run on every backend (Slurm's own srun, hpc-bridge's shim
    elsewhere), and one whose step fails ends Failed with the step's code, never Succeeded because a later
    line did. Pods need an image, which a plain script does not name: refused before anything is sent."""
    # a name of its own: the uid of a converted script comes from its name, and engines may share an instance
    name = f"conform-steps-{uuid.uuid4().hex[:8]}"
    configured = {engine.cluster.name: engine.cluster}
    if engine.kwok:
        source = service.read_input("-", stdin=f"#!/bin/bash\n#SBATCH --job-name={name}\nsrun true\n")
        with pytest.raises(BridgeError) as info:
            service.prepare(source, cluster=engine.cluster.name, configured=configured)
        assert info.value.exit_code == 2 and "image" in str(info.value)
        return
    where = "#HPCBRIDGE --image=busybox:1.36" if engine.real else f"#SBATCH --chdir={tmp_path}"
    for suffix, steps, state, code in (("ok", "srun true\necho after-step\n", JobState.SUCCEEDED, (0, None)),
                                       ("fails", "srun sh -c 'exit 5'\n", JobState.FAILED, (5,))):
        script = f"#!/bin/bash\n#SBATCH --job-name={name}-{suffix}\n{where}\n{steps}"
        prepared = service.prepare(service.read_input("-", stdin=script), cluster=engine.cluster.name,
                                   configured=configured)
        ref = service.submit(prepared).ref
        status = finished(prepared.adapter, ref)
        assert status.state == state, status
        assert status.exit_code in code, status
        if suffix == "ok":
            assert "after-step" in "".join(prepared.adapter.logs(ref))


def test_logs_follow_streams_while_the_job_runs_and_ends_with_it(engine: Engine) -> None:
    if engine.kwok:
        pytest.skip("kwok nodes run no container, so there is no log to stream (real kubelets: issue 15)")
    prepared = engine.prepare("conform-follow", ["sh", "-c", "echo first-line; sleep 6; echo second-line"])
    adapter = prepared.adapter
    ref = service.submit(prepared).ref
    poll_until(adapter, ref, lambda s: s.state != JobState.PENDING, timeout=120, interval=0.2)
    seen, state_at_first = "", None
    for chunk in service.logs(adapter, ref.job_id, follow=True):
        seen += chunk
        if state_at_first is None and "first-line" in seen:
            state_at_first = adapter.poll([ref])[ref].state  # the job is still sleeping: output came live
    assert state_at_first == JobState.RUNNING
    assert "second-line" in seen  # and following ended only after the job's last words
    assert adapter.poll([ref])[ref].state.finished


def test_capacity_counts_the_nodes_that_fit_a_plan(engine: Engine) -> None:
    """--cluster auto asks every backend the same: how many nodes could take one node of this plan, now and
    at all (one batched query). A node asking for 10000 CPUs fits nowhere, but on the local cluster, whose
    emulated nodes share this machine's CPUs: it starts them, as its submit does."""
    from fractions import Fraction

    from bridge.adapters.base import Capacity

    prepared = engine.prepare("conform-capacity", ["true"])
    capacity = prepared.adapter.capacity(prepared.plan)
    assert isinstance(capacity, Capacity) and capacity.detail and capacity.limit is None
    assert 1 <= capacity.free <= capacity.fitting, capacity  # the test engines are idle enough for one CPU
    huge = replace(prepared.plan, resources=replace(prepared.plan.resources, cpu=Fraction(10000),
                                                    given_requests=(("cpu", "10000"),)))
    if engine.cluster.spec.type == "local":
        assert prepared.adapter.capacity(huge).fitting >= huge.nodes
    else:
        assert prepared.adapter.capacity(huge).fitting == 0


def test_size_says_what_the_cluster_has_and_nothing_it_cannot(engine: Engine) -> None:
    """A virtual node's capacity: every backend answers the same question from one query — the whole cluster's
    nodes, CPUs, memory and GPUs, in all and usable — and leaves None where it cannot say, never a guess."""
    from bridge.adapters.base import ClusterSize

    size = service.cluster_size(service.get_adapter(engine.cluster))
    assert isinstance(size, ClusterSize) and size.detail, size
    assert size.total.nodes is not None and size.total.nodes >= 1, size
    assert size.total.cpus is not None and size.total.cpus >= size.total.nodes, size
    for name in ("nodes", "cpus", "memory_mib", "gpus"):
        total, usable = getattr(size.total, name), getattr(size.usable, name)
        assert (total is None) == (usable is None), (name, size)
        assert total is None or 0 <= usable <= total, (name, size)
