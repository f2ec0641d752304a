"""The CLI as a user runs it: a real subprocess, exit codes, one-line errors, no heavy imports."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"


def hpcbridge(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HPCBRIDGE_CONFIG": "", **(env or {})}
    full_env.pop("HPCBRIDGE_CONFIG") if not full_env["HPCBRIDGE_CONFIG"] else None
    return subprocess.run([sys.executable, "-m", "bridge", *args], input=stdin, capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=120)


def slurm_that_takes_test_only(tmp_path: Path) -> dict[str, str]:
    """PATH with an ``sbatch`` that answers ``--test-only`` with yes and refuses anything else: a dry run on a
    Slurm cluster asks sbatch --test-only (the real scheduler's answers: tests/integration/slurm)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    sbatch = bin_dir / "sbatch"
    sbatch.write_text('#!/bin/sh\ncase " $* " in *" --test-only "*) exit 0;; esac\n'
                      'echo "sbatch: error: a dry run submitted" >&2\nexit 1\n')
    sbatch.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_render_prints_three_artifacts_for_the_same_trainjob() -> None:
    slurm = hpcbridge("render", str(EXAMPLE), "--to", "slurm")
    flux = hpcbridge("render", str(EXAMPLE), "--to", "flux")
    k8s = hpcbridge("render", str(EXAMPLE), "--to", "kubernetes")
    assert slurm.returncode == flux.returncode == k8s.returncode == 0, slurm.stderr + flux.stderr + k8s.stderr
    assert slurm.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=mpi-allreduce")
    assert json.loads(flux.stdout)["version"] == 1
    kinds = [doc["kind"] for doc in yaml.safe_load_all(k8s.stdout)]
    assert kinds == ["Secret", "ConfigMap", "JobSet"]


def test_dry_run_equals_render() -> None:
    render = hpcbridge("render", str(EXAMPLE))
    dry = hpcbridge("submit", str(EXAMPLE), "--dry-run")
    assert render.returncode == dry.returncode == 0
    assert render.stdout == dry.stdout


def test_render_json_output() -> None:
    result = hpcbridge("render", str(EXAMPLE), "--to", "slurm", "-o", "json")
    document = json.loads(result.stdout)
    assert document["backend"] == "slurm" and document["files"][0]["content"].startswith("#!/bin/bash")


def test_stdin_input() -> None:
    result = hpcbridge("validate", "-", stdin=EXAMPLE.read_text())
    assert result.returncode == 0, result.stderr
    assert "valid: -: default/mpi-allreduce: runtime mpi-distributed, cluster local, 2 node(s) x 2 proc(s)" in result.stdout


@pytest.mark.parametrize(("text", "fragment"), [
    ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\n"
     "spec: {runtimeRef: {name: torch-distributed}, trainer: {numNodes: -1}}\n", "spec.trainer.numNodes"),
    ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\n"
     "spec: {runtimeRef: {name: torch-distributed}, bogus: 1}\n", "spec.bogus: unknown field"),
    ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\n"
     "spec: {runtimeRef: {name: no-such-runtime}, trainer: {command: [x]}}\n", "spec.runtimeRef.name: no ClusterTrainingRuntime"),
    ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: " + "a" * 64 + "}\n"
     "spec: {runtimeRef: {name: torch-distributed}}\n", "metadata.name: must be at most 63"),
    ("%%%: [\n", "not valid YAML"),
])
@pytest.mark.parametrize("command", ["validate", "render", "submit"])
def test_bad_input_is_one_line_exit_2(text: str, fragment: str, command: str) -> None:
    result = hpcbridge(command, "-", stdin=text)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.stderr


def test_missing_file_is_exit_2() -> None:
    result = hpcbridge("render", "/no/such/file.yaml")
    assert result.returncode == 2 and "no such file" in result.stderr


def test_unknown_cluster_is_exit_2() -> None:
    result = hpcbridge("render", str(EXAMPLE), "--cluster", "nowhere")
    assert result.returncode == 2 and "no such cluster" in result.stderr


def test_clusters_from_config_file(tmp_path: Path) -> None:
    config = tmp_path / "clusters.yaml"
    config.write_text("apiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\nmetadata: {name: hpc}\n"
                      "spec: {type: slurm, defaults: {partition: batch}}\n")
    listing = hpcbridge("clusters", env={"HPCBRIDGE_CONFIG": str(config)})
    assert listing.stdout.split() == ["hpc", "slurm", "local", "local"]
    rendered = hpcbridge("render", str(EXAMPLE), "--cluster", "hpc", env={"HPCBRIDGE_CONFIG": str(config)})
    assert "#SBATCH --partition=batch" in rendered.stdout


def test_render_does_not_import_heavy_clients() -> None:
    code = ("import sys; from bridge.cli import main; main(['render', " + repr(str(EXAMPLE)) + ", '--to', 'slurm']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'kopf', 'paramiko', 'flux'}), "
            "file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stderr.strip() == "[]"


def test_launch_requires_a_command() -> None:
    result = hpcbridge("launch", "--launcher", "plain")
    assert result.returncode == 2


SCRIPT = "#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=4 -t 30 -p gpu\n#SBATCH --mail-type=END\nsrun ./train\n"


def test_convert_script_to_trainjob_and_back(tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(SCRIPT)
    trainjob = hpcbridge("convert", str(path), "--to", "trainjob")
    assert trainjob.returncode == 0, trainjob.stderr
    doc = yaml.safe_load(trainjob.stdout)
    assert doc["spec"]["trainer"]["numNodes"] == 2 and doc["spec"]["activeDeadlineSeconds"] == 1800
    assert "passed through verbatim as hpcbridge.io/sbatch.mail-type" in trainjob.stderr
    back = tmp_path / "job.yaml"
    back.write_text(trainjob.stdout)
    script = hpcbridge("convert", str(back), "--to", "sbatch")
    assert script.returncode == 0, script.stderr
    assert "srun ./train" in script.stdout and "--mail-type=END" in script.stdout


def test_sbatch_flags_override_script_and_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(SCRIPT)
    # for Slurm a batch script is sent as it is, the flags after it given to sbatch as they are
    rendered = hpcbridge("render", str(path), "--to", "slurm")
    assert rendered.stdout.endswith(f"# --- job.sbatch ---\n{SCRIPT}")
    command = rendered.stdout.split("\n")[1]
    assert shlex.split(command)[:2] == ["sbatch", "--parsable"] and command.endswith(f" {path}")
    config = tmp_path / "clusters.yaml"
    config.write_text("apiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\nmetadata: {name: hpc}\n"
                      "spec: {type: slurm}\n")
    overridden = hpcbridge("submit", str(path), "--dry-run", "--cluster", "hpc", "-N", "3", "-o", "json",
                           env={"HPCBRIDGE_CONFIG": str(config), **slurm_that_takes_test_only(tmp_path)})
    assert overridden.returncode == 0, overridden.stderr
    sent = json.loads(overridden.stdout)
    assert sent["command"][:4] == ["sbatch", "--parsable", "-N", "3"] and sent["command"][-1] == str(path)
    assert re.fullmatch(r"--comment=hpcbridge\.io/uid=[0-9a-f-]{36}", sent["command"][4])
    assert sent["files"][0]["content"] == SCRIPT
    # the other backends run what it means
    plain = tmp_path / "plain.sbatch"
    plain.write_text("#!/bin/bash\n#SBATCH -N 2\nsrun ./train\n")
    flux = hpcbridge("convert", str(plain), "--to", "jobspec", "-N", "3")
    assert json.loads(flux.stdout)["resources"][0]["count"] == 3, flux.stderr
    # the local cluster has no partitions: the script's -p is refused, naming the line and the cluster
    local = hpcbridge("submit", str(path), "--dry-run", "--cluster", "local", "-N", "3")
    assert local.returncode == 2 and len(local.stderr.strip().splitlines()) == 1
    assert "#SBATCH line 2: -p: " in local.stderr and "cluster 'local'" in local.stderr
    yaml_flags = hpcbridge("convert", str(EXAMPLE), "--to", "jobspec", "-N", "5", "-t", "10")
    spec = json.loads(yaml_flags.stdout)
    assert spec["resources"][0]["count"] == 5 and spec["attributes"]["system"]["duration"] == 600.0


def test_bad_sbatch_flag_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(SCRIPT)
    result = hpcbridge("submit", str(path), "--dry-run", "--time", "soon")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "soon" in result.stderr
    unknown = hpcbridge("render", str(EXAMPLE), "-N", "3")
    assert unknown.returncode == 2 and "unrecognized arguments" in unknown.stderr


def test_convert_to_sbatch_is_what_render_to_slurm_prints(tmp_path: Path) -> None:
    """One sbatch writer: converting a TrainJob (or a batch script) to sbatch renders it for Slurm, launch included."""
    torch = ROOT / "examples" / "torch-ddp.yaml"
    converted = hpcbridge("convert", str(torch), "--to", "sbatch")
    rendered = hpcbridge("render", str(torch), "--to", "slurm")
    assert converted.returncode == 0 and converted.stdout == rendered.stdout
    assert "srun --nodes=2" in converted.stdout and "--launcher torchrun" in converted.stdout
    path = tmp_path / "job.sbatch"
    path.write_text(SCRIPT.replace(" -p gpu", ""))
    # a batch script is a new job each time it is sent (as with sbatch): a fresh uid, the rest the same
    def without_uid(text: str) -> str:
        return re.sub(r"hpcbridge\.io/uid=[0-9a-f-]+", "hpcbridge.io/uid=<uid>", text)

    script = hpcbridge("convert", str(path), "--to", "sbatch").stdout
    assert without_uid(script) == without_uid(hpcbridge("render", str(path), "--to", "slurm").stdout)
    assert script.endswith(f"# --- job.sbatch ---\n{SCRIPT.replace(' -p gpu', '')}")


# --- one meaning per flag, did-you-mean, unknown jobs, completion (issue 40) ----------------------------------


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1 and result.stdout == "", result.stderr
    return lines[0]


def test_short_flags_mean_the_same_on_submit_and_sbatchs_go_after_the_separator(tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text("#!/bin/bash\nsrun ./train\n")
    config = tmp_path / "clusters.yaml"
    config.write_text("apiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\nmetadata: {name: hpc}\n"
                      "spec: {type: slurm}\n")
    env = {"HPCBRIDGE_CONFIG": str(config), **slurm_that_takes_test_only(tmp_path)}
    # -c is --cluster and -o is --output, as on every other subcommand: sbatch's meanings are refused with a hint
    cpus = one_line_error(hpcbridge("submit", str(path), "--dry-run", "-c", "4", env=env), 2)
    assert "'4' is not a cluster name" in cpus and "go after --" in cpus
    output = one_line_error(hpcbridge("submit", str(path), "--dry-run", "-o", "out.log", env=env), 2)
    assert "not an output format: 'out.log'" in output and "go after --" in output
    sent = hpcbridge("submit", str(path), "--dry-run", "-c", "hpc", "-o", "json", "-N", "2", "--", "-c", "4",
                     "-o", "out.log", "--wait", env=env)
    assert sent.returncode == 0, sent.stderr
    command = json.loads(sent.stdout)["command"]
    assert command[:4] == ["sbatch", "--parsable", "-N", "2"] and " -c 4 -o out.log --wait " in f" {' '.join(command)} "
    # --format stays as the old name of submit's -o
    assert json.loads(hpcbridge("submit", str(path), "--dry-run", "-c", "hpc", "--format", "json", env=env).stdout)


def test_a_mistyped_flag_or_command_is_named_with_the_nearest() -> None:
    wait = one_line_error(hpcbridge("submit", str(EXAMPLE), "--wiat"), 2)
    assert "unknown option --wiat (did you mean --wait?)" in wait and "sbatch" not in wait
    assert "unknown option --folow (did you mean --follow?)" in one_line_error(hpcbridge("logs", "x", "--folow"), 2)
    assert "unknown command 'stauts' (did you mean status?)" in one_line_error(hpcbridge("stauts", "1"), 2)
    assert "(did you mean slurm?)" in one_line_error(hpcbridge("render", str(EXAMPLE), "--to", "slrum"), 2)


def test_bare_hpcbridge_prints_its_usage() -> None:
    result = hpcbridge()
    assert result.returncode == 2 and result.stderr.startswith("usage: hpcbridge") and "submit" in result.stderr


@pytest.mark.parametrize("command", [("status",), ("cancel",), ("logs",), ("status", "-o", "json")])
def test_an_unknown_job_is_one_line_and_exit_1(command: tuple[str, ...]) -> None:
    line = one_line_error(hpcbridge(command[0], "nosuchjob", *command[1:]), 1)
    assert "nosuchjob" in line and "Traceback" not in line


@pytest.mark.parametrize("command", ["logs", "cancel"])
def test_commands_without_output_refuse_dash_o(command: str) -> None:
    assert "unrecognized arguments: -o json" in one_line_error(hpcbridge(command, "x", "-o", "json"), 2)


def test_list_and_status_default_to_the_local_cluster_like_submit(tmp_path: Path) -> None:
    config = tmp_path / "clusters.yaml"
    config.write_text("apiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\nmetadata: {name: hpc}\n"
                      "spec: {type: slurm}\n")
    listing = hpcbridge("list", "-o", "wide", env={"HPCBRIDGE_CONFIG": str(config)})
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.split() == ["JOB", "NAME", "STATE", "EXIT", "REASON", "NODES", "UID", "MESSAGE"]


def test_a_local_submit_prints_its_job_id_first(tmp_path: Path) -> None:
    path = tmp_path / "hello.sbatch"
    path.write_text("#!/bin/bash\necho hello\n")
    result = hpcbridge("submit", str(path))
    assert result.returncode == 0, result.stderr
    job_id, output = result.stdout.splitlines()
    assert output == "hello" and re.fullmatch(r"[0-9a-f-]{36}", job_id)
    status = hpcbridge("status", job_id, "-o", "json")
    assert json.loads(status.stdout)[0]["state"] == "Succeeded"


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_is_valid_shell(shell: str, tmp_path: Path) -> None:
    script = hpcbridge("completion", shell)
    assert script.returncode == 0, script.stderr
    path = tmp_path / "completion"
    path.write_text(script.stdout)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize(("words", "expected"), [
    ("hpcbridge sta", ["status", "stage"]),
    ("hpcbridge logs --fo", ["--follow"]),
    ("hpcbridge status -o ''", ["text", "wide", "yaml", "json"]),
    ("hpcbridge render x.yaml --to f", ["flux"]),
    ("hpcbridge completion ''", ["bash", "zsh"]),
])
def test_completion_completes_subcommands_options_and_choices(words: str, expected: list[str], tmp_path: Path) -> None:
    path = tmp_path / "completion.bash"
    path.write_text(hpcbridge("completion", "bash").stdout)
    harness = (f"source {shlex.quote(str(path))}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); "
               "_hpcbridge; printf '%s\\n' \"${COMPREPLY[@]}\"")
    result = subprocess.run(["bash", "-c", harness], capture_output=True, text=True)
    assert result.stdout.split() == expected, result.stderr
