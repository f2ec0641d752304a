"""A job that has left squeue (MinJobAge) on a cluster without slurmdbd: hpc-bridge still knows it.

Its own small Slurm cluster (one node, MinJobAge=2), so finished jobs are purged from slurmctld's memory
within a purge cycle instead of the session cluster's five minutes.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pytest

from bridge import service
from bridge.adapters.base import Identity, JobState
from bridge.errors import AlreadyRan
from tests import builders
from tests.harness.polling import poll_until
from tests.harness.slurm import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


@pytest.fixture(scope="module")
def forgetful_slurm():
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="hpcbridge-slurm-minjobage-")), nodes=1, min_job_age=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_finished_job_out_of_squeue_is_found_through_the_record_and_jobcomp(forgetful_slurm, tmp_path) -> None:
    cluster = builders.cluster("slurm", "forgetful",
                               slurm={"transport": "local", "slurmConf": str(forgetful_slurm.conf)},
                               defaults={"launchCommand": [sys.executable, "-m", "bridge", "launch"]})
    text = ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata: {name: plain}\n"
            "spec: {mlPolicy: {numNodes: 1}}\n---\napiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n"
            f"metadata: {{name: remembered, annotations: {{hpcbridge.io/workdir: '{tmp_path}'}}}}\n"
            "spec: {runtimeRef: {name: plain}, trainer: {command: [sh, -c, 'exit 0']}}\n")
    prepared = service.prepare(service.read_input("-", stdin=text), cluster="forgetful",
                               configured={"forgetful": cluster})
    adapter, plan = prepared.adapter, prepared.plan
    ref = service.submit(prepared).ref
    assert poll_until(adapter, ref, lambda s: s.state.finished, timeout=120).state == JobState.SUCCEEDED
    identity = Identity(plan.uid, plan.name, plan.namespace)
    deadline = time.monotonic() + 240  # slurmctld purges old jobs once a cycle
    while adapter.find([identity]) and time.monotonic() < deadline:
        time.sleep(2)
    assert adapter.find([identity]) == {}, "the job never left squeue"
    # squeue no longer knows it; the record names it and the job-completion log has its end
    assert adapter.poll([ref])[ref].state == JobState.SUCCEEDED
    with pytest.raises(AlreadyRan) as info:
        service.submit(prepared)
    assert info.value.job_id == ref.job_id and info.value.state == "Succeeded"
    rerun = service.submit(prepared, if_finished="rerun").ref
    assert rerun.job_id != ref.job_id
    assert poll_until(adapter, rerun, lambda s: s.state.finished, timeout=120).state == JobState.SUCCEEDED
