"""Initializers on the HPC backends, against real servers: a dataset from a real S3 server (SeaweedFS, built
from its Go module) with credentials from a secret, a model from a hub-shaped HTTP server (hf://), staged by
the stage step into the cluster's shared stagingDir on the local cluster, real Slurm and Flux (when present).

- the trainer reads both where HPCBRIDGE_DATASET_DIR / HPCBRIDGE_MODEL_DIR say (the model without the
  formats Kubeflow's model initializer skips);
- the second job with the same URIs downloads nothing: the servers' own counters say so;
- two jobs started together download once (the cache's lock);
- a bad URI fails the job, naming the initializer and the URI, and the trainer never runs;
- while a slow model downloads, status says "Initializing (model)";
- the S3 secret appears in no artifact, log, status or state file;
- the same URI from another S3 endpoint is downloaded from there, never taken from the first one's entry;
- a tenant's stage step (as the plan renders it) stages into its own 0700 folder, reads its secret from its
  namespace's folder, gets the initializers' env on stdin, and another tenant with its own endpoint gets its
  own cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from bridge import service
from bridge.adapters.base import JobState
from tests import builders
from tests.harness.hf_hub import HubServer
from tests.harness.s3 import ACCESS_KEY, SECRET_KEY, S3Server
from tests.integration.engines import finished

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "datasets"
EXAMPLES = [f'{{"instruction": "say {i}", "output": "{i}"}}\n' for i in range(40)]
MODEL_FILES = {"config.json": b'{"model_type": "tiny", "hidden_size": 8}',
               "model.safetensors": os.urandom(64 * 1024), "tokenizer.model": b"tok",
               "pytorch_model.bin": b"skipped: Kubeflow's model initializer ignores *.bin"}

TRAINER = """\
import json, os, pathlib, sys
data = pathlib.Path(os.environ["HPCBRIDGE_DATASET_DIR"])
model = pathlib.Path(os.environ["HPCBRIDGE_MODEL_DIR"])
pathlib.Path(sys.argv[1]).touch()  # the trainer ran
rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
config = json.loads((model / "config.json").read_text())
assert not (model / "pytorch_model.bin").exists()
print(f"trainer read {len(rows)} examples, {(data / 'extra' / 'notes.txt').read_text()}, model "
      f"{config['model_type']} ({(model / 'model.safetensors').stat().st_size} bytes)", flush=True)
"""


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> S3Server:
    pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh --all installs it)")
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    _fill(server, tmp_path_factory)
    yield server
    server.stop()


def _fill(server: S3Server, tmp_path_factory) -> None:
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    for prefix in ("alpaca/v1", "alpaca/together", "alpaca/endpoints"):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/train.jsonl", Body="".join(EXAMPLES).encode())
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/extra/notes.txt", Body=b"notes ok")
    # what fetching one object costs in the server's GET count, as boto3's download_file fetches it (its HEAD
    # counts as a GET there): a dataset of 2 objects downloaded once costs twice that
    before = server.requests("GET", BUCKET)
    client.put_object(Bucket=BUCKET, Key="probe/one", Body=b"1")
    client.download_file(BUCKET, "probe/one", str(tmp_path_factory.mktemp("probe") / "one"))
    server.per_object = server.requests("GET", BUCKET) - before
    assert server.per_object > 0


@pytest.fixture(scope="module")
def s3_other(tmp_path_factory) -> S3Server:
    """Another S3 server holding the same bucket, keys and bytes (so the same listing): someone else's endpoint
    answering for the same URI."""
    pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh --all installs it)")
    server = S3Server(tmp_path_factory.mktemp("s3-other")).start()
    _fill(server, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hub() -> HubServer:
    pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (scripts/setup.sh --all)")
    server = HubServer().start()
    server.add("model", "tiny-org/tiny-model", MODEL_FILES)
    server.add("model", "tiny-org/slow-model", MODEL_FILES, delay=1.5)
    server.add("model", "tiny-org/private-model", MODEL_FILES, private=True)  # the token or nothing
    yield server
    server.stop()


@pytest.fixture
def cluster(engine, tmp_path):
    """The engine's cluster with shared storage for staging (this machine's disk: every node here sees it)
    and a secrets directory holding the S3 credentials."""
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "s3-credentials").write_text(f"ACCESS_KEY_ID={ACCESS_KEY}\nSECRET_ACCESS_KEY={SECRET_KEY}\n")
    (secrets / "s3-credentials").chmod(0o600)
    (secrets / "hf-token").write_text(f"ACCESS_TOKEN={HubServer.token}\n")
    (secrets / "hf-token").chmod(0o600)
    spec = engine.cluster.spec.model_copy(update={"staging_dir": str(tmp_path / "shared staging"),
                                                  "secrets_dir": str(secrets)})
    return engine.cluster.model_copy(update={"spec": spec})


ENGINES = [pytest.param("local", marks=pytest.mark.local), pytest.param("slurm", marks=pytest.mark.slurm),
           pytest.param("flux-cli", marks=pytest.mark.flux)]

#: a plain one-command runtime (no launcher to start): the tests time the staging, not torchrun
RUNTIME = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
           "metadata": {"name": "staged"}, "spec": {"mlPolicy": {"numNodes": 1}}}


def trainjob(name: str, workdir: Path, s3: S3Server, hub: HubServer, dataset: str = "s3://datasets/alpaca/v1",
             model: str = "hf://tiny-org/tiny-model", model_secret: str | None = None) -> str:
    (workdir / "train.py").write_text(TRAINER)
    return yaml.safe_dump_all([RUNTIME, builders.trainjob_doc(
        name, runtime="staged", uid=str(uuid.uuid4()), annotations={"hpcbridge.io/workdir": str(workdir)},
        initializer={
            "dataset": {"storageUri": dataset, "env": [{"name": "ENDPOINT", "value": s3.endpoint}],
                        "secretRef": {"name": "s3-credentials"}},
            "model": {"storageUri": model, "env": [{"name": "HF_ENDPOINT", "value": hub.endpoint}],
                      **({"secretRef": {"name": model_secret}} if model_secret else {})}},
        trainer={"numNodes": 1, "command": [sys.executable, "train.py", f"ran-{name}"]})])


def prepare(cluster, text: str):
    return service.prepare(service.read_input("-", stdin=text), cluster=cluster.name,
                           configured={cluster.name: cluster})


def run(cluster, text: str):
    prepared = prepare(cluster, text)
    ref = service.submit(prepared, if_finished="rerun").ref
    status = finished(prepared.adapter, ref, timeout=240)
    return prepared, status, "".join(service.logs(prepared.adapter, ref.job_id))


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_staged_data_reaches_the_trainer_and_the_second_job_downloads_nothing(engine, cluster, s3, hub,
                                                                              tmp_path) -> None:
    gets, files = s3.requests("GET", BUCKET), hub.downloads()
    _prepared, status, text = run(cluster, trainjob("first", tmp_path, s3, hub))
    assert status.state == JobState.SUCCEEDED, text
    assert "trainer read 40 examples, notes ok, model tiny (65536 bytes)" in text, text
    assert s3.requests("GET", BUCKET) - gets == 2 * s3.per_object  # two objects
    assert hub.downloads() - files == 3  # config.json, model.safetensors, tokenizer.model: not the .bin

    gets, files = s3.requests("GET", BUCKET), hub.downloads()
    _prepared, status, text = run(cluster, trainjob("second", tmp_path, s3, hub))
    assert status.state == JobState.SUCCEEDED, text
    assert "trainer read 40 examples" in text and "from the cache" in text, text
    assert (s3.requests("GET", BUCKET), hub.downloads()) == (gets, files)  # nothing downloaded again
    listed = service.cache_entries(cluster.spec.staging_dir)
    assert sorted(entry["uri"] for entry in listed) == ["hf://tiny-org/tiny-model", "s3://datasets/alpaca/v1"]


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_a_bad_uri_fails_the_job_naming_the_initializer_and_the_trainer_never_runs(engine, cluster, s3, hub,
                                                                                   tmp_path) -> None:
    _prepared, status, text = run(cluster, trainjob("bad-uri", tmp_path, s3, hub, dataset="s3://datasets/no/such"))
    assert status.state == JobState.FAILED, text
    assert status.reason == "InitializerFailed", status
    assert status.message.startswith("the dataset initializer failed for s3://datasets/no/such: no objects"), status
    assert not (tmp_path / "ran-bad-uri").exists()  # the trainer never started

    _prepared, status, text = run(cluster, trainjob("bad-model", tmp_path, s3, hub, model="hf://tiny-org/nope"))
    assert status.state == JobState.FAILED and "the model initializer failed for hf://tiny-org/nope" in \
        status.message, (status, text)
    assert not (tmp_path / "ran-bad-model").exists()


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_status_says_initializing_while_the_model_downloads(engine, cluster, s3, hub, tmp_path) -> None:
    prepared = prepare(cluster, trainjob("slow", tmp_path, s3, hub, model="hf://tiny-org/slow-model"))
    submitted: list = []
    # the local cluster stages inside submit; anything else returns at once
    sender = threading.Thread(target=lambda: submitted.append(service.submit(prepared, if_finished="rerun")))
    sender.start()
    seen = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if submitted:
            status = prepared.adapter.poll([submitted[0].ref])[submitted[0].ref]
        elif prepared.plan.backend == "local":
            # still inside submit, staging: another process's view of the job (its id is its uid)
            status = service.status(service.get_adapter(cluster), [prepared.plan.uid])[0]
        else:
            time.sleep(0.05)
            continue
        if status.message:
            seen.add(status.message)
        if status.state.finished:
            break
        time.sleep(0.2)
    sender.join(60)
    assert "Initializing (model): hf://tiny-org/slow-model" in seen, seen
    assert status.state == JobState.SUCCEEDED, status


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_two_jobs_started_together_download_once(engine, cluster, s3, hub, tmp_path) -> None:
    config = tmp_path / "clusters.yaml"
    config.write_text(yaml.safe_dump(cluster.to_wire()))
    env = {**os.environ, "HPCBRIDGE_CONFIG": str(config), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    gets = s3.requests("GET", BUCKET)
    procs = []
    for name in ("together-a", "together-b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(trainjob(name, tmp_path, s3, hub, dataset="s3://datasets/alpaca/together"))
        procs.append(subprocess.Popen([sys.executable, "-m", "bridge", "submit", str(path), "--cluster",
                                       cluster.name, "--wait"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert s3.requests("GET", BUCKET) - gets == 2 * s3.per_object, outputs  # two objects, fetched by one job


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_the_secret_appears_in_no_artifact_log_status_or_state(engine, cluster, s3, hub, tmp_path) -> None:
    """The S3 credentials and a private model's hub token, each from a secret file on the node."""
    text = trainjob("secretive", tmp_path, s3, hub, model="hf://tiny-org/private-model", model_secret="hf-token")
    rendered = prepare(cluster, text).artifact.text()
    assert "s3-credentials" in rendered and "hf-token" in rendered
    assert SECRET_KEY not in rendered and ACCESS_KEY not in rendered and hub.token not in rendered
    prepared, status, logs = run(cluster, text)
    assert status.state == JobState.SUCCEEDED, logs
    assert "trainer read 40 examples" in logs and f"Bearer {hub.token}" in hub.authorizations  # the token was used
    assert SECRET_KEY not in logs + repr(status) and hub.token not in logs
    failed_prepared, failed, failed_logs = run(cluster, trainjob("secretive-fails", tmp_path, s3, hub,
                                                                 dataset="s3://no-such-bucket/x"))
    assert failed.state == JobState.FAILED and SECRET_KEY not in failed_logs + repr(failed), failed
    # every file hpc-bridge or the backend wrote for these jobs: state, staging (not the data), job output
    for root in (Path(os.environ["XDG_STATE_HOME"]), Path(cluster.spec.staging_dir) / "jobs", tmp_path):
        for path in root.rglob("*"):
            if path.is_file() and path.parent.name != "secrets":
                assert SECRET_KEY.encode() not in path.read_bytes(), path
                assert hub.token.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_the_same_uri_from_another_endpoint_is_downloaded_from_there(engine, cluster, s3, s3_other, hub,
                                                                     tmp_path) -> None:
    """Two endpoints report the same listing for one URI: the job that names the second endpoint reads that
    endpoint, not the first one's cache entry (an endpoint can report any listing it likes)."""
    uri = "s3://datasets/alpaca/endpoints"
    _prepared, status, text = run(cluster, trainjob("endpoint-one", tmp_path, s3, hub, dataset=uri))
    assert status.state == JobState.SUCCEEDED, text
    gets = s3_other.requests("GET", BUCKET)
    _prepared, status, text = run(cluster, trainjob("endpoint-two", tmp_path, s3_other, hub, dataset=uri))
    assert status.state == JobState.SUCCEEDED and "trainer read 40 examples" in text, text
    assert s3_other.requests("GET", BUCKET) - gets == 2 * s3_other.per_object, text  # from its own endpoint
    origins = sorted(entry["key"] for entry in service.cache_entries(cluster.spec.staging_dir)
                     if entry["uri"] == uri)
    assert len(origins) == 2


def _tenant_stage(tmp_path: Path, tenant: str, namespace: str, endpoint: str) -> tuple[subprocess.CompletedProcess,
                                                                                     Path]:
    """The stage step of a tenant's plan, started as a backend starts it: its argv and its stdin as rendered,
    under the usual umask."""
    from bridge.api.cluster import Tenant
    from bridge.api.loader import load_documents
    from bridge.plan import find_runtime, resolve, stage_argv, stage_input

    staging, secrets = tmp_path / "tenant staging", tmp_path / "tenant secrets"
    cluster = builders.cluster("slurm", "shared", stagingDir=str(staging), secretsDir=str(secrets),
                               defaults={"launchCommand": [sys.executable, "-m", "bridge", "launch"]})
    job = yaml.safe_dump_all([RUNTIME, {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "tenant-job", "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": {"runtimeRef": {"name": "staged"},
                 "initializer": {"dataset": {"storageUri": "s3://datasets/alpaca/v1",
                                             "env": [{"name": "ENDPOINT", "value": endpoint}],
                                             "secretRef": {"name": "s3-credentials"}}},
                 "trainer": {"command": ["true"]}}}])
    runtime, trainjob_ = load_documents(job)
    plan = resolve(trainjob_, find_runtime(trainjob_, [runtime]), cluster,
                   Tenant(name=tenant, namespaces=[namespace]))
    argv = stage_argv(plan)
    assert not any(endpoint in arg for arg in argv), argv  # what ps would show
    done = subprocess.run(argv, input=stage_input(plan), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, cwd=ROOT, preexec_fn=lambda: os.umask(0o022), timeout=120)
    return done, staging / "tenants" / tenant / "jobs" / plan.uid


def test_a_tenants_stage_step_keeps_to_its_folder_and_its_namespace(s3, s3_other, tmp_path) -> None:
    secrets = tmp_path / "tenant secrets"
    for namespace in ("team-a", "team-b"):
        (secrets / namespace).mkdir(parents=True)
        (secrets / namespace / "s3-credentials").write_text(
            f"ACCESS_KEY_ID={ACCESS_KEY}\nSECRET_ACCESS_KEY={SECRET_KEY}\n")
        (secrets / namespace / "s3-credentials").chmod(0o600)
    # a secret of that name at the folder's top: a tenant's job never reads it (it would fail with these)
    (secrets / "s3-credentials").write_text("ACCESS_KEY_ID=wrong\nSECRET_ACCESS_KEY=wrong\n")
    (secrets / "s3-credentials").chmod(0o600)

    gets = s3.requests("GET", BUCKET)
    done, job_a = _tenant_stage(tmp_path, "tenant-a", "team-a", s3.endpoint)
    output = done.stdout
    assert done.returncode == 0, output
    assert s3.requests("GET", BUCKET) - gets == 2 * s3.per_object, output
    assert len((job_a / "dataset" / "train.jsonl").read_text().splitlines()) == 40
    mine = job_a.parents[1]
    for path in [mine, *mine.rglob("*")]:
        if not path.is_symlink():
            assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
    assert SECRET_KEY not in output

    # tenant B, its own endpoint with the same listing: its own cache, filled from its endpoint
    gets_other, gets = s3_other.requests("GET", BUCKET), s3.requests("GET", BUCKET)
    done, job_b = _tenant_stage(tmp_path, "tenant-b", "team-b", s3_other.endpoint)
    output = done.stdout
    assert done.returncode == 0, output
    assert s3_other.requests("GET", BUCKET) - gets_other == 2 * s3_other.per_object, output
    assert s3.requests("GET", BUCKET) == gets
    assert (job_b / "dataset").resolve().is_relative_to(job_b.parents[1] / "cache")
