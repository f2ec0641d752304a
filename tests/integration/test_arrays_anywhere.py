"""A job array off Slurm (issue 17): the same batch script with ``--array=0-6:2%2`` on the real Slurm cluster
(native arrays: the oracle) and on the local cluster, Flux (when present) and real kubelet pods, where
hpc-bridge sends one job per element with the SLURM_ARRAY_* variables Slurm gives and at most 2 unfinished at
once. Every element runs once, with the same variables as under Slurm."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bridge import service
from bridge.adapters.base import JobState
from tests.integration.engines import LAUNCH, Engine, cluster_entry, finished

pytestmark = pytest.mark.integration

SCRIPT = """#!/bin/bash
#SBATCH --job-name=arr
#SBATCH --array=0-6:2%2
{where}
echo "element $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT: min $SLURM_ARRAY_TASK_MIN max $SLURM_ARRAY_TASK_MAX \\
step $SLURM_ARRAY_TASK_STEP name $SLURM_JOB_NAME" {sink}
"""
EXPECTED = [f"element {i} of 4: min 0 max 6 step 2 name arr" for i in (0, 2, 4, 6)]


def _lines(workdir: Path) -> list[str]:
    path = workdir / "array.out"
    return sorted(path.read_text().splitlines()) if path.exists() else []


def test_slurm_runs_the_array_natively_and_says_what_each_element_sees(slurm_cluster, tmp_path) -> None:
    """The oracle: what Slurm 22.05 itself gives each element of the array."""
    cluster = cluster_entry("array-slurm", {"type": "slurm", "slurm": {"transport": "local",
                                                                       "slurmConf": str(slurm_cluster.conf)},
                                            "defaults": {"partition": "debug", "launchCommand": LAUNCH}})
    text = SCRIPT.format(where=f"#SBATCH --chdir={tmp_path}", sink=">> array.out")
    prepared = service.prepare(service.read_input("-", stdin=text), cluster=cluster.name,
                               configured={cluster.name: cluster})
    service.submit(prepared)
    for _ in range(600):
        if len(_lines(tmp_path)) == 4:
            break
        time.sleep(0.2)
    assert _lines(tmp_path) == EXPECTED


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("flux-cli", marks=pytest.mark.flux),
                                    pytest.param("kubernetes-real", marks=pytest.mark.kubernetes)], indirect=True)
def test_the_same_array_runs_element_by_element_elsewhere(engine: Engine, tmp_path) -> None:
    where = "#HPCBRIDGE --image=busybox:1.36" if engine.real else f"#SBATCH --chdir={tmp_path}"
    text = SCRIPT.format(where=where, sink="" if engine.real else ">> array.out")
    prepared = service.prepare(service.read_input("-", stdin=text), cluster=engine.cluster.name,
                               configured={engine.cluster.name: engine.cluster})
    assert [e.plan.name for e in prepared.elements] == ["arr-0", "arr-2", "arr-4", "arr-6"]
    high = [0]

    def watch(_seconds: float) -> None:  # while an element waits for the %2 limit: how many are unfinished
        states = prepared.adapter.poll([s.ref for s in sent])
        high[0] = max(high[0], sum(1 for status in states.values() if not status.state.finished))
        time.sleep(0.2)

    sent: list = []
    service.submit_array(prepared, sleep=watch, on_sent=sent.append)
    statuses = [finished(prepared.adapter, submitted.ref, timeout=240) for submitted in sent]
    assert [status.state for status in statuses] == [JobState.SUCCEEDED] * 4
    assert high[0] <= 2
    if engine.real:
        lines = sorted(line for submitted in sent for line in
                       "".join(prepared.adapter.logs(submitted.ref)).splitlines() if line.startswith("element"))
    else:
        lines = _lines(tmp_path)
    assert lines == EXPECTED


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("kubernetes-real", marks=pytest.mark.kubernetes)], indirect=True)
def test_a_dependent_job_is_created_only_once_its_dependency_ended_as_it_must(engine: Engine) -> None:
    """--dependency where the backend keeps none (the local cluster, Kubernetes): submit creates the job only
    after the jobs it names have ended (afterok: succeeded); one that can never hold sends nothing."""
    import threading

    from bridge.errors import BackendRejected

    first = engine.prepare("dep-first", ["sh", "-c", "sleep 4; echo first"])
    failing = engine.prepare("dep-failing", ["sh", "-c", "exit 3"])
    refs = [service.submit(first).ref, service.submit(failing).ref]
    if engine.name == "local":  # the owner of a local job is the process that started it: it follows them
        for prepared, ref in zip((first, failing), refs, strict=True):
            threading.Thread(target=prepared.adapter.wait, args=(ref,), daemon=True).start()
    second = engine.prepare("dep-second", ["sh", "-c", "echo second"],
                            annotations={"hpcbridge.io/dependency": f"afterok:{refs[0].job_id}"})
    assert second.waits_for == f"afterok:{refs[0].job_id}"
    told: list[str] = []
    sent = service.submit(second, on_wait=told.append, sleep=lambda _: time.sleep(0.2))
    assert first.adapter.poll([refs[0]])[refs[0]].state == JobState.SUCCEEDED  # ended before the other was sent
    assert told and told[0].startswith("dep-second waits for")
    assert finished(second.adapter, sent.ref).state == JobState.SUCCEEDED
    never = engine.prepare("dep-never", ["sh", "-c", "echo never"],
                           annotations={"hpcbridge.io/dependency": f"afterok:{refs[1].job_id}"})
    with pytest.raises(BackendRejected, match="can never hold"):
        service.submit(never, sleep=lambda _: time.sleep(0.2))
    assert never.plan.uid not in {s.ref.uid for s in never.adapter.list_jobs()}  # nothing was sent


@pytest.mark.parametrize("engine", [pytest.param("flux-cli", marks=pytest.mark.flux)], indirect=True)
def test_flux_keeps_a_dependency_on_flux_job_ids_itself(engine: Engine) -> None:
    """On Flux a dependency is Flux's own (RFC 26, afterok on the ƒ… id submit printed): sent at once, held by
    Flux until the job it names succeeded; one on a job that failed never runs."""
    first = engine.prepare("fdep-first", ["sh", "-c", "sleep 3"])
    failing = engine.prepare("fdep-failing", ["sh", "-c", "exit 3"])
    refs = [service.submit(first).ref, service.submit(failing).ref]
    second = engine.prepare("fdep-second", ["sh", "-c", "echo second"],
                            annotations={"hpcbridge.io/dependency": f"afterok:{refs[0].job_id}"})
    assert second.waits_for is None and second.plan.options.dependency == f"afterok:{refs[0].job_id}"
    sent = service.submit(second)
    assert second.adapter.poll([sent.ref])[sent.ref].state == JobState.PENDING  # held by Flux, not by us
    assert finished(second.adapter, sent.ref).state == JobState.SUCCEEDED
    assert first.adapter.poll([refs[0]])[refs[0]].state == JobState.SUCCEEDED
    assert finished(failing.adapter, refs[1]).state == JobState.FAILED
    never = engine.prepare("fdep-never", ["sh", "-c", "echo never"],
                           annotations={"hpcbridge.io/dependency": f"afterok:{refs[1].job_id}"})
    from bridge.errors import BackendRejected

    with pytest.raises(BackendRejected, match="failed or was canceled"):  # Flux's own word, as ours elsewhere
        service.submit(never)
