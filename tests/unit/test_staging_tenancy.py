"""Staging among tenants (issue 36, Data and the initializers' secrets): the cache key covers where the bytes
came from and whose credentials read them; a tenant stages in a folder of its own, 0700, whatever the umask;
its secrets are its namespace's; a job's phase file speaks for that job only; the initializers' env never
reaches a command line. Each test fails on the code before these changes."""

from __future__ import annotations

import io
import json
import os
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bridge.adapters.base import JobRef, JobState, JobStatus
from bridge.api.cluster import BridgeCluster, Tenant
from bridge.api.loader import load_documents
from bridge.api.storage import StageSource
from bridge.errors import InvalidSpec
from bridge.plan import find_runtime, job_environment, resolve, stage_argv, stage_input
from bridge.staging.cache import cache_key
from bridge.staging.phase import PHASE_FILE, phase_path, read_phase, with_stage_phases
from bridge.staging.sources import StageError
from bridge.staging.stage import STAGE_FAILED, Stager, run
from tests import builders
from tests.harness.hf_hub import HubServer, Repo
from tests.unit.test_staging import RUNTIME
from tests.unit.test_staging import trainjob as staging_trainjob

GOOD = {"config.json": b'{"model_type": "good"}', "model.safetensors": b"the real weights"}
EVIL = {"config.json": b'{"model_type": "evil"}', "model.safetensors": b"someone else's weights"}


def trainjob(initializer: str, namespace: str = "team-a") -> str:
    return staging_trainjob(initializer, namespace)


def cluster(kind: str = "slurm", **spec) -> BridgeCluster:
    return builders.cluster(kind, f"my-{kind}", **{"stagingDir": "/shared/stage", **spec})


def plan_of(initializer: str, on: BridgeCluster, tenant: Tenant | None = None, namespace: str = "team-a"):
    job, runtime = load_documents(trainjob(initializer, namespace) + "---" + RUNTIME)
    return resolve(job, find_runtime(job, [runtime]), on, tenant)


TENANT = Tenant(name="tenant-a", namespaces=["team-a"])


@dataclass
class Claimed(Repo):
    """A repository on a hub someone else runs: it reports whatever revision it likes."""

    claimed: str = ""

    @property
    def sha(self) -> str:
        return self.claimed


@pytest.fixture
def hubs():
    pytest.importorskip("huggingface_hub")
    real, other = HubServer().start(), HubServer().start()
    genuine = real.add("model", "org/tiny", GOOD)
    # the other hub answers for the same repository with the real one's revision and its own bytes
    other.repos[("model", "org/tiny")] = Claimed(EVIL, claimed=genuine.sha)
    yield real, other
    real.stop()
    other.stop()


def _quiet(_line: str) -> None:
    pass


def _model(root: Path, uid: str, tenant: str | None = None) -> bytes:
    base = root if tenant is None else root / "tenants" / tenant
    return (base / "jobs" / uid / "model" / "model.safetensors").read_bytes()


# --- the cache key -----------------------------------------------------------------------------------------


def test_the_key_covers_the_origin_and_the_credentials_scope() -> None:
    base = cache_key("s3://b/d", "v1", ("s3", ()))
    assert cache_key("s3://b/d", "v1", ("s3", ()), {"endpoint": "http://a"}) != \
        cache_key("s3://b/d", "v1", ("s3", ()), {"endpoint": "http://b"}) != base
    assert cache_key("s3://b/d", "v1", ("s3", ()), None, {"tenant": "a", "secret": "creds"}) != \
        cache_key("s3://b/d", "v1", ("s3", ()), None, {"tenant": "b", "secret": "creds"})


def test_a_listing_from_another_endpoint_never_stands_for_the_real_ones_bytes(hubs, tmp_path: Path) -> None:
    """The other endpoint stages first, claiming the real repository's revision; the job that reads the real
    hub then downloads the real bytes, not the other endpoint's from the cache."""
    real, other = hubs
    root = tmp_path / "stage"
    uri = "hf://org/tiny"
    assert run("job-other", str(root), [StageSource("model", uri, (("HF_ENDPOINT", other.endpoint),))],
               say=_quiet) == 0
    assert _model(root, "job-other") == EVIL["model.safetensors"]
    assert run("job-real", str(root), [StageSource("model", uri, (("HF_ENDPOINT", real.endpoint),))],
               say=_quiet) == 0
    assert _model(root, "job-real") == GOOD["model.safetensors"]
    assert real.downloads() == 2  # it was asked for its files: no cache entry stood in for them
    # the same endpoint again is a hit
    assert run("job-real-2", str(root), [StageSource("model", uri, (("HF_ENDPOINT", real.endpoint),))],
               say=_quiet) == 0
    assert real.downloads() == 2 and _model(root, "job-real-2") == GOOD["model.safetensors"]


# --- a tenant's folders ------------------------------------------------------------------------------------


def _modes(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode) for path in [root, *root.rglob("*")]
            if not path.is_symlink()}


def test_a_tenant_stages_in_its_own_private_folder_whatever_the_umask(hubs, tmp_path: Path) -> None:
    real, _other = hubs
    root = tmp_path / "stage"
    previous = os.umask(0o022)
    try:
        code = run("job-1", str(root), [StageSource("model", "hf://org/tiny", (("HF_ENDPOINT", real.endpoint),))],
                   say=_quiet, tenant="tenant-a", namespace="team-a")
        assert os.umask(0o022) == 0o022  # the caller's umask is back
    finally:
        os.umask(previous)
    assert code == 0
    assert _model(root, "job-1", "tenant-a") == GOOD["model.safetensors"]
    assert not (root / "cache").exists() and not (root / "jobs").exists()  # nothing in the shared layout
    mine = root / "tenants" / "tenant-a"
    modes = _modes(mine)
    assert modes["."] == 0o700 and modes["cache"] == 0o700 and modes["jobs"] == 0o700, modes
    assert {name: mode for name, mode in modes.items() if mode & 0o077} == {}
    assert stat.S_IMODE((mine / "jobs" / "job-1" / PHASE_FILE).stat().st_mode) == 0o600
    assert read_phase(str(root), "job-1", "tenant-a")["phase"] == "ready"
    # another tenant staging the same URI gets a cache of its own
    assert run("job-2", str(root), [StageSource("model", "hf://org/tiny", (("HF_ENDPOINT", real.endpoint),))],
               say=_quiet, tenant="tenant-b", namespace="team-b") == 0
    assert real.downloads() == 4
    assert stat.S_IMODE((root / "tenants").stat().st_mode) == 0o1777  # each tenant's user makes its own


def test_a_tenant_folder_someone_else_made_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder another user owns")
    data = tmp_path / "data"
    data.mkdir()
    squatted = tmp_path / "stage" / "tenants" / "tenant-a"
    squatted.mkdir(parents=True)
    os.chown(squatted, 4242, 4242)
    said: list[str] = []
    assert run("job-1", str(tmp_path / "stage"), [StageSource("dataset", str(data))], say=said.append,
               tenant="tenant-a", namespace="team-a") == STAGE_FAILED
    assert "is not a folder of this job's user" in said[-1] and not (squatted / "jobs").exists()


def test_a_tenant_folder_left_open_is_closed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    mine = tmp_path / "stage" / "tenants" / "tenant-a"
    mine.mkdir(parents=True)
    mine.chmod(0o755)
    assert run("job-1", str(tmp_path / "stage"), [StageSource("dataset", str(data))], say=_quiet,
               tenant="tenant-a", namespace="team-a") == 0
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700


def test_a_tenants_plan_points_the_job_and_its_container_at_its_own_folder() -> None:
    plan = plan_of("    model: {storageUri: 'hf://org/m'}", cluster(defaults={"containerRuntime": "apptainer"}),
                   TENANT)
    mine = f"/shared/stage/tenants/tenant-a/jobs/{plan.uid}"
    assert dict(job_environment(plan))["HPCBRIDGE_MODEL_DIR"] == f"{mine}/model"
    argv = stage_argv(plan)
    assert argv[argv.index("--tenant") + 1] == "tenant-a" and argv[argv.index("--namespace") + 1] == "team-a"
    container = __import__("dataclasses").replace(plan, image="pytorch/pytorch:2.7.1").exec_argv
    assert container[:6] == ("apptainer", "exec", "--bind", "/shared/stage/tenants/tenant-a:/shared/stage/tenants/"
                             "tenant-a", "--bind", f"{mine}:/workspace")
    cli = plan_of("    model: {storageUri: 'hf://org/m'}", cluster())  # the CLI's plan keeps today's layout
    assert "--tenant" not in stage_argv(cli)
    assert dict(job_environment(cli))["HPCBRIDGE_MODEL_DIR"] == f"/shared/stage/jobs/{cli.uid}/model"


# --- secrets -----------------------------------------------------------------------------------------------


def _secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)


def test_a_tenants_secret_is_read_from_its_namespace_only(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    _secret(secrets / "creds", "ACCESS_TOKEN=top-level\n")
    _secret(secrets / "team-b" / "creds", "ACCESS_TOKEN=team-b's\n")
    _secret(secrets / "team-a" / "creds", "ACCESS_TOKEN=team-a's\n")
    mine = Stager("u", tmp_path, str(secrets), tenant="tenant-a", namespace="team-a")
    assert mine.read_secret("creds") == {"ACCESS_TOKEN": "team-a's"}
    (secrets / "team-a" / "creds").unlink()
    with pytest.raises(StageError, match="team-a/creds"):
        mine.read_secret("creds")  # never the folder's top, never another namespace's
    assert Stager("u", tmp_path, str(secrets)).read_secret("creds") == {"ACCESS_TOKEN": "top-level"}  # the CLI


@pytest.mark.parametrize("name", ["../team-b/creds", "team-b/creds", "..", "a..b"])
def test_a_secret_name_that_is_a_path_is_refused(name: str, tmp_path: Path, capsys) -> None:
    from bridge.cli import main

    with pytest.raises(StageError, match="no '/'"):
        Stager("u", tmp_path, str(tmp_path), tenant="tenant-a", namespace="team-a").read_secret(name)
    assert main(["stage", "--job-id", "u1", "--staging-dir", str(tmp_path), "--dataset", str(tmp_path),
                 "--dataset-secret", name]) == 2
    assert "--dataset-secret" in capsys.readouterr().err
    if "/" not in name and name != "..":  # the rest the plan's YAML refused before
        with pytest.raises(InvalidSpec, match="secretRef.name"):
            plan_of(f"    dataset: {{storageUri: 's3://b/d', secretRef: {{name: '{name}'}}}}", cluster(), TENANT)


# --- the phase file ----------------------------------------------------------------------------------------


def _sh(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout


def test_a_jobs_phase_file_cannot_speak_for_another_job(tmp_path: Path) -> None:
    root = str(tmp_path)
    a, b = JobRef("c", "slurm", "1", "uid-a", "a"), JobRef("c", "slurm", "2", "uid-b", "b")
    for ref in (a, b):
        Path(phase_path(root, ref.uid)).parent.mkdir(parents=True)
    Path(phase_path(root, "uid-b")).write_text(json.dumps({"uid": "uid-b", "phase": "model", "uri": "hf://b/m"})
                                               + "\n")
    # job A writes its own file: documents naming B, and a line that looks like B's path
    forged = {"uid": "uid-b", "phase": "dataset", "uri": "s3://forged"}
    Path(phase_path(root, "uid-a")).write_text("\n".join([json.dumps(forged), phase_path(root, "uid-b") + "\t"
                                                          + json.dumps(forged), json.dumps(forged)]) + "\n")
    statuses = {b: JobStatus(b, JobState.RUNNING), a: JobStatus(a, JobState.RUNNING)}
    seen = with_stage_phases(statuses, root, _sh)
    assert seen[b].message == "Initializing (model): hf://b/m", seen[b]
    assert seen[a].message is None and "forged" not in repr(seen)
    # a file that is a link elsewhere is not read
    Path(phase_path(root, "uid-b")).unlink()
    os.symlink(phase_path(root, "uid-a"), phase_path(root, "uid-b"))
    assert with_stage_phases(statuses, root, _sh)[b].message is None
    assert read_phase(root, "uid-b") is None


def test_a_tenants_phase_file_is_read_in_its_folder(tmp_path: Path) -> None:
    ref = JobRef("c", "slurm", "1", "uid-a", "a")
    path = Path(phase_path(str(tmp_path), "uid-a", "tenant-a"))
    assert str(path).startswith(str(tmp_path / "tenants" / "tenant-a" / "jobs"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"phase": "failed", "role": "model", "uri": "hf://o/m", "reason": "gone"}))
    seen = with_stage_phases({ref: JobStatus(ref, JobState.FAILED)}, str(tmp_path), _sh, tenant="tenant-a")
    assert seen[ref].message == "the model initializer failed for hf://o/m: gone"


# --- the initializers' env ---------------------------------------------------------------------------------

VALUE = "http://s3.internal:8333/not-on-a-command-line"
INITIALIZER = f"""    dataset:
      storageUri: s3://b/d
      env: [{{name: ENDPOINT, value: "{VALUE}"}}, {{name: IGNORE_PATTERNS, value: "*.md,'$(touch x)'"}}]"""


@pytest.mark.parametrize("kind", ["slurm", "flux"])
def test_the_initializers_env_is_on_no_command_line_of_the_script(kind: str, tmp_path: Path) -> None:
    """The stage step gets the env on its stdin: from a here-document in the batch script (a CLI plan), or, for
    a tenant's Slurm job, from the job's environment (sbatch --export-file), so not even the script holds a
    value; run in bash, the step's arguments hold no value, its stdin holds them all, and the trainer after it
    does not see them."""
    from bridge.adapters.flux.render import batch_script
    from bridge.adapters.slurm.render import job_env, render_script

    plan = plan_of(INITIALIZER, cluster(kind), TENANT if kind == "slurm" else None)
    script = render_script(plan) if kind == "slurm" else batch_script(plan)
    environment = dict(os.environ)
    if kind == "slurm":
        assert VALUE not in script
        environment.update(job_env(plan) or {})
    start = script.rindex("\n", 0, script.index("hpcbridge stage ")) + 1
    stage = script[start:script.index("\nexec ", start)]
    assert VALUE not in stage.splitlines()[0]  # the command line itself
    out = tmp_path / "out"
    body = (f'hpcbridge() {{ printf "%s\\n" "$@" > {shlex.quote(str(out))}.args; cat > {shlex.quote(str(out))}.in; }}'
            f"\n{stage}\n" f'printf "%s" "${{HPCBRIDGE_STAGE_INPUT-unset}}" > {shlex.quote(str(out))}.after\n')
    subprocess.run(["bash", "-euc", body], check=True, timeout=30, env=environment)
    args = Path(f"{out}.args").read_text()
    assert VALUE not in args and "--env-stdin" in args
    assert json.loads(Path(f"{out}.in").read_text()) == {
        "dataset": [["ENDPOINT", VALUE], ["IGNORE_PATTERNS", "*.md,'$(touch x)'"]]}
    assert Path(f"{out}.after").read_text() == "unset"
    assert not (tmp_path / "x").exists()


def test_the_stage_command_takes_the_env_from_stdin(hubs, tmp_path: Path, monkeypatch) -> None:
    from bridge.cli import main

    real, _other = hubs
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"model": [["HF_ENDPOINT", real.endpoint]]})))
    assert main(["stage", "--job-id", "uid-1", "--staging-dir", str(tmp_path), "--tenant", "tenant-a",
                 "--namespace", "team-a", "--env-stdin", "--model", "hf://org/tiny"]) == 0
    assert _model(tmp_path, "uid-1", "tenant-a") == GOOD["model.safetensors"]
    monkeypatch.setattr("sys.stdin", io.StringIO('["not", "env"]'))
    assert main(["stage", "--job-id", "uid-2", "--staging-dir", str(tmp_path), "--env-stdin",
                 "--model", "hf://org/tiny"]) == 2


def test_the_local_backend_passes_the_env_on_stdin() -> None:
    plan = plan_of(INITIALIZER, cluster("local"))
    assert not any(VALUE in arg for arg in stage_argv(plan))
    assert VALUE in stage_input(plan)
