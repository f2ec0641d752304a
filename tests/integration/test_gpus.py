"""GPUs placed right on every backend: a 2-node x 2-GPU XGBoost job (one worker per GPU) on the local
cluster (its GPUs given by the cluster entry), Slurm (gres on /dev/null-style fake devices), Flux (an
instance whose resources list fake GPUs) and real kubelet pods (the fake device plugin): every worker gets
exactly one device, no two workers the same one, and each node's launch says once which GPUs it got.

A device is named as the backend names it physically: the local cluster's ids are the machine's; Slurm and
Flux number each node's GPUs from 0, so a device there is (node, index); in a pod, the index is an ordinal
of what the device plugin put in NVIDIA_VISIBLE_DEVICES (UUIDs).
"""

from __future__ import annotations

import re
import sys

import pytest
import yaml

from bridge import service
from bridge.adapters.base import JobState
from tests.integration.engines import finished

pytestmark = pytest.mark.integration

WORKER = """\
import os
nvd = [item for item in os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if item]
node = os.environ.get("SLURMD_NODENAME") or (f"flux-{os.environ['FLUX_TASK_RANK']}"
                                             if "FLUX_TASK_RANK" in os.environ else "")
devices = [nvd[int(item)] if nvd else f"{node}:{item}" if node else item
           for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item]
print(f"task {os.environ['DMLC_TASK_ID']} of {os.environ['DMLC_NUM_WORKER']}: devices {' '.join(devices)}", flush=True)
"""


def gpu_job(engine, python: str) -> str:
    metadata: dict = {"name": "gpus-2x2", "namespace": engine.namespace}
    if engine.workdir and not engine.real:
        metadata["annotations"] = {"hpcbridge.io/workdir": engine.workdir}
    trainer = {"numNodes": 2, "command": [python, "-c", WORKER],
               "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}}}
    if engine.real:
        trainer["image"] = "busybox:1.36"  # the cluster entry maps it to the node image
    return yaml.safe_dump({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": metadata,
                           "spec": {"runtimeRef": {"name": "xgboost-distributed"}, "trainer": trainer}})


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("slurm", marks=pytest.mark.slurm),
                                    pytest.param("flux-cli", marks=pytest.mark.flux),
                                    pytest.param("kubernetes-real", marks=pytest.mark.kubernetes)], indirect=True)
def test_a_2x2_gpu_job_gives_every_worker_its_own_gpu(engine) -> None:
    cluster = engine.cluster
    if engine.name == "local":
        cluster = cluster.model_copy(update={"spec": cluster.spec.model_copy(
            update={"gpus": ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]})})
    prepared = service.prepare(service.read_input("-", stdin=gpu_job(engine, "python3" if engine.real else
                                                                      sys.executable)),
                               cluster=cluster.name, configured={cluster.name: cluster})
    ref = service.submit(prepared, if_finished="rerun").ref
    status = finished(prepared.adapter, ref, timeout=240)
    text = "".join(service.logs(prepared.adapter, ref.job_id))
    assert status.state == JobState.SUCCEEDED, text
    workers = dict(re.findall(r"task (\d) of 4: devices (.*)", text))
    assert sorted(workers) == ["0", "1", "2", "3"], text
    assert all(len(devices.split()) == 1 for devices in workers.values()), workers  # one GPU each
    assert len(set(workers.values())) == 4, workers  # no two workers on one GPU
    assert len(re.findall(r"hpcbridge launch: node \d \(.*\): GPUs \S+", text)) == 2, text  # each node says once
