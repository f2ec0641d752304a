"""Kubeflow's torchtune runtime (torchtune-llama3.2-1b, as Trainer v2.3 ships it) fine-tunes on CPU through
the local cluster, real Slurm and Flux (when present): a tiny random Llama-3.2-shaped model and an alpaca-style
dataset staged from a real S3 server (SeaweedFS), `tune run` given the recipe and config Kubeflow's torch plugin
picks, the runtime's /workspace paths as the job's staging directory. torchtune 0.6.1 and its dependencies
come from scripts/setup.sh --all, beside the venv (~/.cache/hpcbridge/torchtune-0.6.1).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from bridge import service
from bridge.adapters.base import JobState
from tests.harness.s3 import ACCESS_KEY, SECRET_KEY, S3Server
from tests.harness.tiny_llama import TORCHTUNE_RUNTIME, TUNE_ARGS
from tests.integration.engines import finished

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SITE = Path.home() / ".cache" / "hpcbridge" / "torchtune-0.6.1" / "site"

@pytest.fixture(scope="module")
def staged_s3(tmp_path_factory) -> S3Server:
    if not (SITE / "torchtune").is_dir():
        pytest.skip(f"torchtune is not installed at {SITE} (scripts/setup.sh --all installs it)")
    pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh --all installs it)")
    made = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, "-m", "tests.harness.tiny_llama", str(made)], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": f"{SITE}{os.pathsep}{ROOT}"}, capture_output=True)
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    client = server.client()
    for bucket, source in (("models", made / "model"), ("datasets", made / "dataset")):
        client.create_bucket(Bucket=bucket)
        for path in source.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), bucket, f"tiny/{path.relative_to(source)}")
    yield server
    server.stop()


@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("slurm", marks=pytest.mark.slurm),
                                    pytest.param("flux-cli", marks=pytest.mark.flux)], indirect=True)
def test_kubeflows_torchtune_runtime_fine_tunes_a_model_staged_from_s3(engine, staged_s3, tmp_path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "s3").write_text(f"ACCESS_KEY_ID={ACCESS_KEY}\nSECRET_ACCESS_KEY={SECRET_KEY}\n")
    (secrets / "s3").chmod(0o600)
    staging = tmp_path / "staging"
    spec = engine.cluster.spec.model_copy(update={"staging_dir": str(staging), "secrets_dir": str(secrets)})
    cluster = engine.cluster.model_copy(update={"spec": spec})
    s3_env = [{"name": "ENDPOINT", "value": staged_s3.endpoint}]
    # `tune` first; then what this process finds (the venv, and flux where Flux's batch script needs it)
    path = os.pathsep.join([str(SITE / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]])
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "tune-tiny", "uid": str(uuid.uuid4()),
                        "annotations": {"hpcbridge.io/workdir": str(tmp_path)}},
           "spec": {"runtimeRef": {"name": "torchtune-llama3.2-1b"},
                    "initializer": {"dataset": {"storageUri": "s3://datasets/tiny", "env": s3_env,
                                                "secretRef": {"name": "s3"}},
                                    "model": {"storageUri": "s3://models/tiny", "env": s3_env,
                                              "secretRef": {"name": "s3"}}},
                    # the SDK's BuiltinTrainer: `tune run` and config overrides; a CPU node, one process
                    "trainer": {"command": ["tune", "run"], "args": TUNE_ARGS, "numProcPerNode": 1,
                                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "0"}},
                                "env": [{"name": "PYTHONPATH", "value": str(SITE)}, {"name": "PATH", "value": path},
                                        {"name": "OMP_NUM_THREADS", "value": "1"}]}}}
    prepared = service.prepare(service.read_input("-", stdin=yaml.safe_dump_all([yaml.safe_load(TORCHTUNE_RUNTIME), job])),
                               cluster=cluster.name, configured={cluster.name: cluster})
    home = f"{staging}/jobs/{prepared.plan.uid}"
    assert prepared.plan.command[:5] == ("tune", "run", "full_finetune_single_device", "--config",
                                         "llama3_2/1B_full_single_device")
    assert f"tokenizer.path={home}/model/original/tokenizer.model" in prepared.plan.command
    ref = service.submit(prepared, if_finished="rerun").ref
    status = finished(prepared.adapter, ref, timeout=600)
    text = "".join(service.logs(prepared.adapter, ref.job_id))
    assert status.state == JobState.SUCCEEDED, (status, text[-4000:])
    losses = [float(x) for x in re.findall(r"Step \d+ \| loss:([0-9.]+)", text)]
    assert len(losses) == 3 and losses[-1] < losses[0], text[-4000:]  # a random model learns the repetition
    assert (Path(home) / "output" / "epoch_0" / "model-00001-of-00001.safetensors").is_file()
    assert SECRET_KEY not in text
