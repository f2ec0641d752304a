"""Initializers off Kubernetes (bridge.staging, bridge.plan): URIs, the plan's checks, the shared cache's lock
and atomicity, secrets. The sources against real servers are in tests/integration/test_staging.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from bridge.api.cluster import BridgeCluster
from bridge.api.loader import load_documents
from bridge.api.storage import StageSource, parse_storage_uri
from bridge.errors import InvalidSpec
from bridge.plan import find_runtime, resolve, stage_argv, stage_input
from bridge.staging.cache import StageCache, cache_key
from bridge.staging.phase import phase_status, read_phase
from bridge.staging.sources import StageError, _safe_relative
from bridge.staging.stage import STAGE_FAILED, Stager, run
from tests import builders

RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: plain}
spec:
  mlPolicy: {numNodes: 1}
"""


def trainjob(initializer: str, namespace: str | None = None) -> str:
    where = f", namespace: {namespace}" if namespace else ""
    return f"""
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: tune{where}}}
spec:
  runtimeRef: {{name: plain}}
  initializer:
{initializer}
  trainer:
    command: [python3, train.py]
"""


def cluster(kind: str, **spec) -> BridgeCluster:
    return builders.cluster(kind, f"my-{kind}", **spec)


def plan_of(initializer: str, on: BridgeCluster):
    job, runtime = load_documents(trainjob(initializer) + "---" + RUNTIME)
    return resolve(job, find_runtime(job, [runtime]), on)


# --- URIs --------------------------------------------------------------------------------------------------


def test_uris_parse_as_kubeflow_reads_them() -> None:
    # Kubeflow: a dataset repo is netloc/first segment; a model repo is the whole path
    assert parse_storage_uri("hf://tatsu-lab/alpaca/extra", "dataset").authority == "tatsu-lab/alpaca"
    assert parse_storage_uri("hf://meta-llama/Llama-3.2-1B", "model").authority == "meta-llama/Llama-3.2-1B"
    s3 = parse_storage_uri("s3://bucket/some%20dir/v1")
    assert (s3.scheme, s3.authority, s3.path) == ("s3", "bucket", "some dir/v1")
    assert parse_storage_uri("/scratch/data/../data").path == "/scratch/data"
    assert parse_storage_uri("file:///scratch/x").path == "/scratch/x"


@pytest.mark.parametrize("uri, problem", [
    ("gs://bucket/x", "unknown scheme 'gs'"),
    ("hf://org", "hf:// needs org/name"),
    ("s3://bucket/../etc", "'.' and '..'"),
    ("file://host/x", "no host"),
    ("s3:///key", "needs a bucket"),
])
def test_unreadable_uris_say_why(uri: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_storage_uri(uri)


# --- the plan ----------------------------------------------------------------------------------------------


def test_unknown_scheme_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidSpec) as info:
        plan_of("    dataset: {storageUri: 'gs://bucket/x'}", cluster("slurm", stagingDir="/shared/stage"))
    assert "spec.initializer.dataset.storageUri" in str(info.value) and "gs://bucket/x" in str(info.value)


def test_a_cluster_without_shared_storage_refuses_initializers() -> None:
    with pytest.raises(InvalidSpec) as info:
        plan_of("    model: {storageUri: 'hf://org/m'}", cluster("slurm"))
    assert "spec.stagingDir" in str(info.value) and "my-slurm" in str(info.value)


def test_pvc_is_kubernetes_only() -> None:
    with pytest.raises(InvalidSpec, match="PersistentVolumeClaim"):
        plan_of("    model: {storageUri: 'pvc://claim/m'}", cluster("flux", stagingDir="/shared/stage"))


def test_kubernetes_needs_the_runtimes_initializer_job() -> None:
    """Kubeflow's webhook: a TrainJob with a dataset initializer on a runtime without that job is refused."""
    with pytest.raises(InvalidSpec) as info:
        plan_of("    dataset: {storageUri: 'hf://org/d'}", cluster("kubernetes"))
    assert "dataset-initializer" in str(info.value) and "'initializer' volume" in str(info.value)


def test_the_local_cluster_stages_under_the_state_dir(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    plan = plan_of("    dataset: {storageUri: 'hf://org/d'}", cluster("local"))
    assert plan.staging.dir == str(tmp_path / "hpcbridge" / "staging")


def test_the_stage_step_gets_names_never_secret_values() -> None:
    plan = plan_of("""    dataset:
      storageUri: s3://b/d
      env: [{name: ENDPOINT, value: "http://s3:8333"}]
      secretRef: {name: s3-creds}""", cluster("slurm", stagingDir="/shared/stage", secretsDir="~/.secrets"))
    argv = stage_argv(plan)
    assert argv[:2] == ("hpcbridge", "stage")
    assert ("--dataset-secret", "s3-creds") == argv[argv.index("--dataset-secret"):argv.index("--dataset-secret") + 2]
    assert "--secrets-dir" in argv and "--env-stdin" in argv and "--dataset-env" not in argv
    assert not any("http://s3:8333" in arg for arg in argv)  # env values go on stdin, never on the command line
    assert json.loads(stage_input(plan)) == {"dataset": [["ENDPOINT", "http://s3:8333"]]}
    env = dict((name, value) for name, value in __import__("bridge.plan").plan.job_environment(plan))
    assert env["HPCBRIDGE_DATASET_DIR"] == f"/shared/stage/jobs/{plan.uid}/dataset"


def test_off_kubernetes_an_initializers_env_is_literal() -> None:
    with pytest.raises(InvalidSpec, match="secretRef"):
        plan_of("""    dataset:
      storageUri: s3://b/d
      env: [{name: SECRET_ACCESS_KEY, valueFrom: {secretKeyRef: {name: s, key: k}}}]""",
                cluster("slurm", stagingDir="/shared/stage"))


def test_a_cluster_keeps_staging_off_kubernetes() -> None:
    with pytest.raises(ValueError, match="stagingDir"):
        cluster("kubernetes", stagingDir="/x")
    with pytest.raises(ValueError, match="absolute"):
        cluster("slurm", stagingDir="relative/dir")


# --- the cache ---------------------------------------------------------------------------------------------


def _slow_fill(root: str, marker: str) -> None:
    def download(into: Path) -> None:
        with open(marker, "a") as handle:
            handle.write("x")  # one character per download
        time.sleep(0.5)
        (into / "weights.bin").write_bytes(b"w" * 100)

    StageCache(root).fill("k1", "s3://b/m", "v1", download)


def test_two_jobs_starting_together_download_once(tmp_path: Path) -> None:
    marker = tmp_path / "downloads"
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_slow_fill, args=(str(tmp_path), str(marker))) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0
    assert marker.read_text() == "x"
    entry = StageCache(tmp_path).lookup("k1")
    assert entry is not None and (entry.data / "weights.bin").stat().st_size == 100


def test_a_failed_download_leaves_nothing_visible(tmp_path: Path) -> None:
    cache = StageCache(tmp_path)

    def broken(into: Path) -> None:
        (into / "half").write_bytes(b"partial")
        raise StageError("connection reset")

    with pytest.raises(StageError):
        cache.fill("k2", "s3://b/d", "v1", broken)
    assert cache.lookup("k2") is None
    assert [p.name for p in cache.dir.iterdir() if not p.name.startswith(".locks")] == []


def test_the_key_follows_the_version(tmp_path: Path) -> None:
    assert cache_key("hf://o/m", "sha1") != cache_key("hf://o/m", "sha2")
    assert cache_key("hf://o/m", "sha1", ("model", ["*.json"])) != cache_key("hf://o/m", "sha1", ("model", None))


def test_prune_keeps_what_was_used_recently_and_what_is_being_filled(tmp_path: Path) -> None:
    cache = StageCache(tmp_path)
    for key in ("old", "new", "busy"):
        cache.fill(key, f"s3://b/{key}", "v", lambda into: (into / "f").write_bytes(b"1234"))
    past = time.time() - 10 * 86400
    for key in ("old", "busy"):
        os.utime(cache.dir / key / "used", (past, past))
    assert sorted(e.key for e in cache.prune(7 * 86400, dry_run=True)) == ["busy", "old"]
    with cache._lock("busy"):  # a job filling or waiting on it right now
        removed = [e.key for e in cache.prune(7 * 86400)]
    assert removed == ["old"]
    assert sorted(e.key for e in cache.entries()) == ["busy", "new"]


# --- secrets and failures ----------------------------------------------------------------------------------


def test_a_secret_readable_by_others_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "s3"
    secret.write_text("SECRET_ACCESS_KEY=hunter2\n")
    secret.chmod(0o644)
    with pytest.raises(StageError, match="chmod 600"):
        Stager("u", tmp_path, str(tmp_path)).read_secret("s3")
    secret.chmod(0o600)
    assert Stager("u", tmp_path, str(tmp_path)).read_secret("s3") == {"SECRET_ACCESS_KEY": "hunter2"}


def test_a_failure_names_the_initializer_and_uri_and_hides_secrets(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "creds").write_text("ACCESS_TOKEN=tok-abc123\n")
    (secrets / "creds").chmod(0o600)
    said: list[str] = []
    missing = tmp_path / "nowhere tok-abc123"  # a reason that quotes the secret's value
    code = run("uid-1", str(tmp_path / "stage"), [StageSource("dataset", f"file://{missing}", (), "creds")],
               str(secrets), say=said.append)
    assert code == STAGE_FAILED
    doc = read_phase(str(tmp_path / "stage"), "uid-1")
    reason, message = phase_status(doc)
    assert reason == "InitializerFailed" and message.startswith(f"the dataset initializer failed for file://{missing}")
    assert "tok-abc123" not in doc["reason"] and doc["reason"].endswith("nowhere *** does not exist (on "
                                                                          f"{os.uname().nodename})")
    assert said[-1].endswith(doc["reason"])


def test_an_object_key_cannot_leave_the_staged_directory() -> None:
    with pytest.raises(StageError):
        _safe_relative("data/../../etc/passwd", "../../etc/passwd")
    assert _safe_relative("data/a/b.txt", "a/b.txt") == "a/b.txt"


def test_a_path_already_on_shared_storage_is_used_in_place(tmp_path: Path) -> None:
    data = tmp_path / "my data"
    data.mkdir()
    (data / "x.txt").write_text("1")
    assert run("uid-2", str(tmp_path / "stage"), [StageSource("dataset", str(data))], say=lambda _l: None) == 0
    link = tmp_path / "stage/jobs/uid-2/dataset"
    assert link.resolve() == data and (link / "x.txt").read_text() == "1"
    assert read_phase(str(tmp_path / "stage"), "uid-2")["phase"] == "ready"


def test_a_container_finds_the_data_at_kubeflows_workspace() -> None:
    plan = plan_of("    model: {storageUri: 'hf://org/m'}", cluster("slurm", stagingDir="/shared/stage",
                                                                    defaults={"containerRuntime": "apptainer"}))
    plan = __import__("dataclasses").replace(plan, image="pytorch/pytorch:2.7.1")
    argv = plan.exec_argv
    assert argv[:6] == ("apptainer", "exec", "--bind", "/shared/stage:/shared/stage", "--bind",
                        f"/shared/stage/jobs/{plan.uid}:/workspace")
    with pytest.raises(ValueError, match="bind"):
        cluster("slurm", stagingDir="/shared/a:b")


def test_a_jobset_says_which_initializer_failed_or_runs() -> None:
    from bridge.adapters.base import JobState
    from bridge.adapters.kubernetes.status import jobset_state

    spec = {"replicatedJobs": [{"name": "dataset-initializer", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": "dataset-initializer", "env": [{"name": "STORAGE_URI", "value": "s3://b/d"}]}]}}}}},
        {"name": "node"}]}
    running = {"spec": spec, "status": {"replicatedJobsStatus": [{"name": "dataset-initializer", "ready": 1},
                                                                 {"name": "node", "ready": 0}]}}
    assert jobset_state(running) == (JobState.RUNNING, "Initializing", "Initializing (dataset): s3://b/d")
    failed = {"spec": spec, "status": {
        "conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "jobset failed"}],
        "replicatedJobsStatus": [{"name": "dataset-initializer", "failed": 1}, {"name": "node"}]}}
    assert jobset_state(failed) == (JobState.FAILED, "InitializerFailed",
                                    "the dataset initializer failed for s3://b/d")
    trainer_failed = {"spec": spec, "status": {**failed["status"], "replicatedJobsStatus": [
        {"name": "dataset-initializer", "succeeded": 1}, {"name": "node", "failed": 1}]}}
    assert jobset_state(trainer_failed) == (JobState.FAILED, "FailedJobs", "jobset failed")


def test_without_a_container_kubeflows_workspace_is_the_jobs_staging_directory() -> None:
    job, runtime = load_documents(trainjob("    model: {storageUri: 'hf://org/m'}").replace(
        "command: [python3, train.py]",
        "command: [tune, run, tokenizer.path=/workspace/model/tokenizer.model, --out, /workspace, /workspaces]")
        + "---" + RUNTIME)
    plan = resolve(job, find_runtime(job, [runtime]), cluster("slurm", stagingDir="/shared/stage"))
    home = f"/shared/stage/jobs/{plan.uid}"
    assert plan.command == ("tune", "run", f"tokenizer.path={home}/model/tokenizer.model", "--out", home,
                            "/workspaces")
    assert any("staging directory" in note for note in plan.notes)


def test_upstreams_torchtune_runtime_renders_for_slurm_as_kubeflow_rewrites_it() -> None:
    """The runtime's own initializers are staged (no spec.initializer: Kubeflow runs them with their
    defaults), the recipe and config are chosen as Kubeflow's torch plugin chooses them, and the runtime's
    /workspace paths are the job's staging directory."""
    job = load_documents(trainjob("    model: {storageUri: 'hf://tiny-org/tiny-llama'}").replace(
        "command: [python3, train.py]", "command: [tune, run]\n    args: [device=cpu, epochs=1]\n"
        "    numProcPerNode: 2").replace("name: plain", "name: torchtune-llama3.2-1b"))[0]
    from tests.harness.tiny_llama import TORCHTUNE_RUNTIME

    runtime = load_documents(TORCHTUNE_RUNTIME)[0]
    plan = resolve(job, runtime, cluster("slurm", stagingDir="/shared/stage"))
    home = f"/shared/stage/jobs/{plan.uid}"
    assert [(s.role, s.uri) for s in plan.staging.sources] == [("dataset", "hf://tatsu-lab/alpaca"),
                                                               ("model", "hf://tiny-org/tiny-llama")]
    assert plan.command == ("tune", "run", "--nnodes=1", "--nproc_per_node=2", "full_finetune_distributed",
                            "--config", "llama3_2/1B_full", f"output_dir={home}/output",
                            f"tokenizer.path={home}/model/original/tokenizer.model",
                            f"checkpointer.checkpoint_dir={home}/model", "device=cpu", "epochs=1")
    single = resolve(load_documents(trainjob("    model: {storageUri: 'hf://o/m'}").replace(
        "command: [python3, train.py]", "command: [tune, run]\n    resourcesPerNode: {limits: {nvidia.com/gpu: '0'}}")
        .replace("name: plain", "name: torchtune-llama3.2-1b"))[0], runtime, cluster("local", stagingDir="/shared/stage"))
    assert single.command[2:5] == ("full_finetune_single_device", "--config", "llama3_2/1B_full_single_device")


def test_the_stage_command_refuses_a_job_id_that_is_not_a_uid(tmp_path: Path, capsys) -> None:
    from bridge.cli import main

    assert main(["stage", "--job-id", "../escape", "--staging-dir", str(tmp_path), "--dataset", str(tmp_path)]) == 2
    assert "--job-id" in capsys.readouterr().err and not (tmp_path / "escape").exists()
    assert main(["cache", "prune", "--dir", str(tmp_path)]) == 2  # how old: said, or --all


def test_a_claim_is_mounted_in_its_initializer_pod() -> None:
    from bridge.adapters.kubernetes.render import jobset
    from tests.harness.tiny_llama import TORCHTUNE_RUNTIME

    job = load_documents(trainjob("    dataset: {storageUri: 'pvc://team-data/alpaca'}").replace(
        "name: plain", "name: torchtune-llama3.2-1b"))[0]
    plan = resolve(job, load_documents(TORCHTUNE_RUNTIME)[0], cluster("kubernetes"))
    initializer = next(j for j in jobset(plan)[0]["spec"]["replicatedJobs"] if j["name"] == "dataset-initializer")
    pod = initializer["template"]["spec"]["template"]["spec"]
    assert {"name": "initializer-source", "persistentVolumeClaim": {"claimName": "team-data", "readOnly": True}} \
        in pod["volumes"]
    assert {"name": "initializer-source", "mountPath": "/mnt/initializer-source", "readOnly": True} in \
        pod["containers"][0]["volumeMounts"]
