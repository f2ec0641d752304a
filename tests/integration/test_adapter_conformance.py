"""One contract, every backend on its real engine: the same scenarios through the orchestration layer.

local runs processes here; slurm is the real Slurm cluster; kubernetes the real control plane (JobSets on
kwok nodes, which schedule but run no process: scenarios that need a command's output or exit code read
``capabilities.runs_commands``); kubernetes-real the control plane with real kubelet nodes, whose pods run the
command (tests/harness/kubelet.py); flux a live instance when flux-core is on PATH (both transports).
A new backend passes this module: one package, one line in bridge.adapters.REGISTRY, one engine here.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
import yaml

from bridge import service
from bridge.adapters.base import Capabilities, Identity, JobState
from bridge.api.cluster import BridgeCluster
from bridge.errors import AlreadyRan, BridgeError
from tests.harness.polling import poll_until

pytestmark = pytest.mark.integration

RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "conformance"},
    "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
        "name": "node", "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                                           "containers": [{"name": "node", "image": "busybox:1.36"}]}}}}}]}}},
}
#: kwok's knobs (tests/harness/kube.py), as Job template patches: a labelled pod fails (no retries), a pod
#: whose completion is an hour away stays Running
KWOK_FAIL = {"backoffLimit": 0, "template": {"metadata": {"labels": {
    "pod-container-running-failed.stage.kwok.x-k8s.io": "true"}}}}
KWOK_NEVER_ENDS = {"template": {"metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}}}}


@dataclass
class Engine:
    name: str
    cluster: BridgeCluster
    namespace: str = "default"
    #: a backend job id that names no job
    unknown_id: str = "999999"
    workdir: str | None = None
    #: Kubernetes with real kubelets: pods run the command
    real: bool = False

    @property
    def kwok(self) -> bool:
        return self.cluster.spec.type == "kubernetes" and not self.real

    def prepare(self, name: str, command: list[str], kwok_job: dict | None = None) -> service.Prepared:
        """A one-node TrainJob running *command* (on kwok, *kwok_job* patches the Job to fail or run on)."""
        spec: dict = {"runtimeRef": {"name": "conformance"}, "trainer": {"command": command}}
        if kwok_job and self.kwok:
            spec["runtimePatches"] = [{"manager": "hpcbridge.io/tests", "trainingRuntimeSpec": {"template": {
                "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": kwok_job}}]}}}}]
        metadata: dict = {"name": name, "namespace": self.namespace, "uid": str(uuid.uuid4())}
        if self.workdir and not self.kwok:
            metadata["annotations"] = {"hpcbridge.io/workdir": self.workdir}
        text = yaml.safe_dump_all([RUNTIME, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                             "metadata": metadata, "spec": spec}])
        source = service.read_input("-", stdin=text)
        return service.prepare(source, cluster=self.cluster.name, configured={self.cluster.name: self.cluster})


def _cluster(name: str, spec: dict) -> BridgeCluster:
    return BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                         "metadata": {"name": name}, "spec": spec})


LAUNCH = [sys.executable, "-m", "bridge", "launch"]


@pytest.fixture(params=[
    pytest.param("local", marks=pytest.mark.local),
    pytest.param("slurm", marks=pytest.mark.slurm),
    pytest.param("kubernetes", marks=pytest.mark.kubernetes),
    pytest.param("kubernetes-real", marks=pytest.mark.kubernetes),
    pytest.param("flux-cli", marks=pytest.mark.flux),
    pytest.param("flux-python", marks=pytest.mark.flux),
])
def engine(request, tmp_path, monkeypatch) -> Iterator[Engine]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the layer's record, per test
    kind = request.param
    if kind == "local":
        yield Engine("local", _cluster("local", {"type": "local"}), unknown_id=str(uuid.uuid4()),
                     workdir=str(tmp_path))
    elif kind == "slurm":
        slurm = request.getfixturevalue("slurm_cluster")
        yield Engine("slurm", _cluster("conformance-slurm", {
            "type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm.conf)},
            "defaults": {"partition": "debug", "launchCommand": LAUNCH}}), workdir=str(tmp_path))
    elif kind == "kubernetes":
        kube = request.getfixturevalue("kube_cluster")
        api = request.getfixturevalue("kube_api")
        from kubernetes import client

        namespace = f"conformance-{uuid.uuid4().hex[:8]}"
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": namespace}})
        try:
            yield Engine("kubernetes", _cluster("conformance-k8s", {
                "type": "kubernetes", "kubernetes": {"kubeconfig": str(kube.kubeconfig), "namespace": namespace}}),
                namespace=namespace, unknown_id=f"{namespace}/no-such-jobset")
        finally:
            core.delete_namespace(namespace)
    elif kind == "kubernetes-real":
        real = request.getfixturevalue("real_kube")
        from kubernetes import client

        api = real.api_client()
        namespace = f"conformance-{uuid.uuid4().hex[:8]}"
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": namespace}})
        for _ in range(600):  # pods are admitted once the namespace's default ServiceAccount exists
            if core.list_namespaced_service_account(namespace).items:
                break
            time.sleep(0.1)
        try:
            yield Engine("kubernetes-real", _cluster("conformance-k8s-real", {
                "type": "kubernetes", "kubernetes": {
                    "kubeconfig": str(real.kube.kubeconfig), "namespace": namespace, "imagePullPolicy": "Never",
                    "images": {"busybox:1.36": real.images["node"].ref}}}),
                namespace=namespace, unknown_id=f"{namespace}/no-such-jobset", real=True)
        finally:
            core.delete_namespace(namespace)
            api.close()
    else:
        uri = request.getfixturevalue("flux_uri")
        transport = kind.split("-", 1)[1]
        if transport == "python":
            pytest.importorskip("flux.job", reason="flux-python is not importable (add the built bindings to "
                                                   "PYTHONPATH)")
        import shutil

        yield Engine(kind, _cluster(f"conformance-{kind}", {
            "type": "flux", "flux": {"uri": uri, "transport": transport, "fluxCommand": shutil.which("flux")},
            "defaults": {"launchCommand": LAUNCH}}), unknown_id="ƒ2RyHVBf1", workdir=str(tmp_path))


def finished(adapter, ref, timeout: float = 180.0):
    return poll_until(adapter, ref, lambda s: s.state.finished, timeout=timeout, interval=0.2)


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
    # the newest run is the one found for the uid
    assert service.submit(prepared, if_finished="attach").ref.job_id == rerun.ref.job_id


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


def test_batch_script_whose_srun_step_cannot_run_fails(engine: Engine, tmp_path) -> None:
    """An unchanged batch script: on Slurm its srun step runs; elsewhere the step cannot run, and the job
    must fail instead of reading Succeeded because a later line did."""
    # a name of its own: the uid of a converted script comes from its name, and engines may share an instance
    name = f"conform-steps-{uuid.uuid4().hex[:8]}"
    script = f"#!/bin/bash\n#SBATCH --job-name={name}\n#SBATCH --chdir={tmp_path}\nsrun true\necho after-step\n"
    source = service.read_input("-", stdin=script)
    configured = {engine.cluster.name: engine.cluster}
    if engine.cluster.spec.type == "kubernetes":  # pods need an image, and a script names none: refused first
        with pytest.raises(BridgeError) as info:
            service.prepare(source, cluster=engine.cluster.name, configured=configured)
        assert info.value.exit_code == 2 and "image" in str(info.value)
        return
    prepared = service.prepare(source, cluster=engine.cluster.name, configured=configured)
    status = finished(prepared.adapter, service.submit(prepared).ref)
    if engine.cluster.spec.type == "slurm":
        assert status.state == JobState.SUCCEEDED, status
    else:
        assert status.state == JobState.FAILED and status.exit_code == 127, status


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
