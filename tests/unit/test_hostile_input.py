"""Hostile input (#24): no value becomes a command or a directive; no input crashes or exhausts hpc-bridge.

One test (or a few) per finding of the issue, grouped as the issue groups them. Values are validated where
they enter (YAML files, stdin, batch scripts, the cluster config), so most tests expect an InvalidSpec
naming the field; the renderers' own second line of defence is tested with plans built around the checks.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bridge.adapters.flux.render import batch_script
from bridge.adapters.kubernetes.render import render_objects
from bridge.adapters.slurm.render import render_script
from bridge.api.catalog import builtin_runtimes, load_clusters
from bridge.api.loader import MAX_INPUT_BYTES, load_documents, parse_object
from bridge.errors import InvalidSpec
from bridge.plan import find_runtime, resolve
from bridge.sbatch.directives import directive_line, tokenize_directive
from bridge.service import Input, prepare, read_input
from bridge.shell import comment, join, quote
from tests import builders
from tests.builders import cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"

RUNTIME = "mpi-distributed"


def trainjob_doc(trainer: dict | None = None, annotations: dict | None = None, spec: dict | None = None,
                 **meta) -> dict:
    """A TrainJob ``j`` on RUNTIME running train.py; *meta* are its other metadata fields."""
    return builders.trainjob_doc("j", runtime=RUNTIME, annotations=annotations, metadata=meta,
                                 trainer={"command": ["python3", "train.py"]} if trainer is None else trainer,
                                 **(spec or {}))


def plan_for(doc: dict, kind: str = "slurm", **cluster_spec):
    job = parse_object(doc)
    return resolve(job, find_runtime(job, builtin_runtimes()), cluster(kind, **cluster_spec))


def render(doc: dict, kind: str) -> str:
    return prepare(Input((parse_object(doc),), "t.yaml", None), to=kind).artifact.text()


def refused(fn, *args, field: str | None = None, **kwargs) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    if field is not None:
        assert field in message, message
    return info.value


def write_config(tmp_path: Path, monkeypatch, text: str) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(text)
    monkeypatch.setenv("HPCBRIDGE_CONFIG", str(path))
    return path


CLUSTER_HEAD = "apiVersion: hpcbridge.io/v1alpha1\nkind: BridgeCluster\n"


# --- command injection: a line break in an identity or a config value ----------------------------------------


@pytest.mark.parametrize("kind", ["slurm", "flux", "kubernetes"])
def test_namespace_with_a_newline_is_refused(kind: str) -> None:
    refused(render, trainjob_doc(namespace="team\nrm -rf ~"), kind, field="metadata.namespace")


@pytest.mark.parametrize("kind", ["slurm", "flux", "kubernetes"])
def test_uid_with_a_newline_is_refused(kind: str) -> None:
    refused(render, trainjob_doc(uid="0b7f\ntouch /tmp/pwned"), kind, field="metadata.uid")


def test_runtime_name_with_a_newline_is_refused() -> None:
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "rt\nrm -rf ~"}, "spec": {}}
    refused(parse_object, runtime, field="metadata.name")
    ref = trainjob_doc()
    ref["spec"]["runtimeRef"]["name"] = "rt\nid"
    refused(parse_object, ref, field="spec.runtimeRef.name")


@pytest.mark.parametrize("spec, field", [
    ("  type: slurm\n", "metadata.name"),
])
def test_cluster_name_with_a_newline_is_refused(tmp_path, monkeypatch, spec: str, field: str) -> None:
    write_config(tmp_path, monkeypatch, CLUSTER_HEAD + 'metadata: {name: "hpc\\nrm -rf ~"}\nspec:\n' + spec)
    refused(load_clusters, field=field)


@pytest.mark.parametrize("defaults, field", [
    ('accountMapping: {default: "acct\\n#SBATCH --chdir=/"}', "spec.accountMapping"),
    ('accountMapping: {"bad ns": acct}', "spec.accountMapping"),
    ('defaults: {constraint: "gpu\\nrm -rf ~"}', "spec.defaults.constraint"),
    ('defaults: {workdir: "/scratch\\n#SBATCH --uid=0"}', "spec.defaults.workdir"),
    ("defaults: {workdir: \"/x' --wrap='id\"}", "spec.defaults.workdir"),
    ('allowedNamespaces: ["a\\nb"]', "spec.allowedNamespaces"),
    ('slurm: {transport: ssh, host: "login\\nid"}', "spec.slurm.host"),
    ('slurm: {transport: ssh, host: login, user: "alice; id"}', "spec.slurm.user"),
])
def test_cluster_config_values_that_reach_a_script_are_checked(tmp_path, monkeypatch, defaults: str,
                                                               field: str) -> None:
    write_config(tmp_path, monkeypatch, CLUSTER_HEAD + "metadata: {name: hpc}\nspec:\n  type: slurm\n  "
                 + defaults + "\n")
    refused(load_clusters, field=field)


@pytest.mark.parametrize("field, value", [("runtime_name", "rt\nid"), ("namespace", "ns\r\nid"),
                                          ("cluster", "c\x00id"), ("uid", "u\n#SBATCH --uid=0"), ("name", "j\nid")])
def test_renderers_check_identity_again(field: str, value: str) -> None:
    """Second line of defence: a plan built around the load-time checks is still refused by every renderer."""
    for kind, render_fn in (("slurm", render_script), ("flux", batch_script), ("kubernetes", render_objects)):
        refused(render_fn, dataclasses.replace(plan_for(trainjob_doc(), kind), **{field: value}))


def test_comment_text_cannot_end_its_line() -> None:
    text = comment("# TrainJob ns/j (runtime rt\nid) on cluster c\r\u2028x\x00")
    assert text.isprintable() and text.startswith("# TrainJob ns/j (runtime rt\\nid)")


def test_nul_in_a_command_or_env_value_is_refused_not_cut_short() -> None:
    refused(load_documents, yaml.safe_dump(trainjob_doc(trainer={"command": ["echo", "a\x00rm -rf ~"]})),
            field="spec.trainer.command[1]")
    refused(load_documents, yaml.safe_dump(trainjob_doc(trainer={"command": ["x"], "env": [
        {"name": "A", "value": "a\x00b"}]})), field="spec.trainer.env[0].value")
    with pytest.raises(ValueError):
        quote("a\x00b")


def test_cr_in_a_value_stays_inside_its_word() -> None:
    """A guard: free text keeps its CR, escaped, inside its own word."""
    plan = plan_for(trainjob_doc(trainer={"command": ["echo", "a\rb"], "env": [{"name": "A", "value": "x\ry"}]}))
    script = render_script(plan)
    assert "\r" not in script
    assert "$'a\\rb'" in script and "export A=$'x\\ry'" in script


# --- directive smuggling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a' --wrap='id", 'a" --uid="0', "a\\' --x", "plain", "with space", "a#b"])
def test_directive_value_reads_back_exactly(value: str) -> None:
    assert tokenize_directive(directive_line("chdir", value)[len("#SBATCH"):]) == [f"--chdir={value}"]


@pytest.mark.parametrize("value", ["a\n#SBATCH --chdir=/", "a\rb", "a\x00b", "a\u2028b"])
def test_directive_value_refuses_line_breaks(value: str) -> None:
    refused(directive_line, "chdir", value, field="#SBATCH --chdir")


def test_runtime_working_dir_cannot_smuggle_a_directive() -> None:
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "rt"}, "spec": {"template": {"spec": {"replicatedJobs": [{
                   "name": "node", "template": {"spec": {"template": {"spec": {"containers": [{
                       "name": "node", "workingDir": "/x' --wrap='id"}]}}}}}]}}}}
    job = trainjob_doc()
    job["spec"]["runtimeRef"]["name"] = "rt"
    source = Input((parse_object(job), parse_object(runtime)), "t.yaml", None)
    refused(prepare, source, to="slurm", field="workingDir")


def test_annotation_with_a_quote_cannot_split_a_directive() -> None:
    """A guard: annotations were already checked; the same rule now covers every source of these values."""
    doc = trainjob_doc(annotations={"hpcbridge.io/output": "o' --wrap='id"})
    refused(render, doc, "slurm", field="hpcbridge.io/output")


def test_privileged_option_in_a_batch_script_is_refused(tmp_path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text("#!/bin/bash\n#SBATCH --uid=0\n#SBATCH -N 1\nid\n")
    source = read_input(str(path))
    refused(prepare, source, to="slurm", field="#SBATCH line 2: --uid")  # the line the user wrote
    # the same on the command line, named as it was typed
    flags = read_input(str(EXAMPLE), ["--get-user-env"])
    refused(prepare, flags, to="slurm", field="command line: --get-user-env")


def test_privileged_option_passes_where_the_cluster_allows_it(tmp_path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text("#!/bin/bash\n#SBATCH --uid=0\nid\n")
    hpc = cluster(defaults={"allowPrivilegedOptions": ["uid"]})
    script = prepare(read_input(str(path)), configured={"hpc": hpc}, cluster="hpc").artifact.text()
    assert "#SBATCH --uid=0\n" in script
    with pytest.raises(ValidationError):
        cluster(defaults={"allowPrivilegedOptions": ["partition"]})


@pytest.mark.parametrize("option, value", [("ui", "0"), ("wrap", "id"), ("test-only", "true"), ("hold", "x"),
                                           ("bogus", "1")])
def test_pass_through_option_must_be_a_real_full_sbatch_option(option: str, value: str) -> None:
    doc = trainjob_doc(annotations={f"hpcbridge.io/sbatch.{option}": value})
    refused(render, doc, "slurm", field=f"hpcbridge.io/sbatch.{option}")


# --- line breaks that aren't newlines ----------------------------------------------------------------------


def test_crlf_batch_script_file_is_refused_like_sbatch(tmp_path) -> None:
    path = tmp_path / "dos.sbatch"
    path.write_bytes(b"#!/bin/bash\r\n#SBATCH -N 2\r\nsrun hostname\r\n")
    assert "DOS line break" in refused(read_input, str(path)).problem


def test_lone_cr_in_a_directive_line_is_refused(tmp_path) -> None:
    path = tmp_path / "cr.sbatch"
    path.write_bytes(b"#!/bin/bash\n#SBATCH -N 1\r#SBATCH --uid=0\nsrun hostname\n")
    assert "carriage return" in refused(read_input, str(path)).problem


def test_stdin_is_read_byte_exact(monkeypatch) -> None:
    data = b"#!/bin/bash\r\n#SBATCH -N 2\r\nsrun hostname\r\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert "DOS line break" in refused(read_input, "-").problem


def test_input_that_is_not_utf8_is_refused(tmp_path, monkeypatch) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"kind: \xff\n")
    refused(read_input, str(path), field="file")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"kind: \xff\n")))
    refused(read_input, "-", field="file")


# --- objects the API server refuses ------------------------------------------------------------------------


@pytest.mark.parametrize("meta, field", [
    ({"labels": {"team": "a;b"}}, "metadata.labels"),
    ({"labels": {"bad key!": "x"}}, "metadata.labels"),
    ({"labels": {"team": "x" * 64}}, "metadata.labels"),
    ({"annotations": {"not a key": "x"}}, "metadata.annotations"),
    ({"uid": "u" * 8192}, "metadata.uid"),
    ({"namespace": "Team_A"}, "metadata.namespace"),
    ({"finalizers": ["bad finalizer"]}, "metadata.finalizers"),
])
def test_metadata_the_api_server_would_refuse_is_refused_on_load(meta: dict, field: str) -> None:
    refused(parse_object, trainjob_doc(**meta), field=field)


def test_uuid_uids_and_kubernetes_style_labels_still_load() -> None:
    job = parse_object(trainjob_doc(uid="0b7f9d2e-0000-4000-8000-000000000004", namespace="ml-team",
                                    labels={"app.kubernetes.io/name": "train", "kueue.x-k8s.io/queue-name": "q",
                                            "empty": ""}))
    assert job.metadata.uid == "0b7f9d2e-0000-4000-8000-000000000004"


def test_jobset_labels_are_checked_before_anything_is_sent() -> None:
    """A label that got past loading (set in code, not validated) is still refused by the renderer."""
    plan = plan_for(trainjob_doc(), "kubernetes")
    kubernetes = dataclasses.replace(plan.on_kubernetes(), jobset_metadata={"labels": {"team": "a;b"}})
    refused(render_objects, dataclasses.replace(plan, kubernetes=kubernetes),
            field="metadata.labels[team]")


def test_runtime_template_labels_and_node_selector_are_checked() -> None:
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "rt"}, "spec": {"template": {"spec": {"replicatedJobs": [{
                   "name": "node", "template": {"metadata": {"labels": {"x": "a b"}}}}]}}}}
    refused(parse_object, runtime, field="labels")
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"] = {"spec": {"template": {"spec": {
        "nodeSelector": {"zone": "a;b"}, "containers": [{"name": "node"}]}}}}
    refused(parse_object, runtime, field="nodeSelector")


def test_jobset_subdomain_cannot_add_hostfile_lines() -> None:
    doc = trainjob_doc(trainer={"command": ["x"], "image": "img", "numNodes": 2}, spec={"runtimePatches": [{
        "manager": "example.com/x", "trainingRuntimeSpec": {"template": {"spec": {"network": {
            "subdomain": "svc\nattacker.example.com slots=64"}}}}}]})
    refused(render, doc, "kubernetes", field="network.subdomain")


# --- looser than Kubernetes --------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer, field", [
    ({"numNodes": True}, "spec.trainer.numNodes"),
    ({"numNodes": "2"}, "spec.trainer.numNodes"),
    ({"numNodes": 2.0}, "spec.trainer.numNodes"),
    ({"numProcPerNode": True}, "spec.trainer.numProcPerNode"),
    ({"resourcesPerNode": {"requests": {"cpu": True}}}, "spec.trainer.resourcesPerNode.requests"),
    ({"num_nodes": 2}, "spec.trainer.num_nodes"),
    ({"resources_per_node": {}}, "spec.trainer.resources_per_node"),
])
def test_types_are_as_strict_as_the_kubernetes_schema(trainer: dict, field: str) -> None:
    refused(parse_object, trainjob_doc(trainer={"command": ["x"], **trainer}), field=field)


def test_snake_case_names_are_unknown_fields_everywhere() -> None:
    doc = trainjob_doc()
    doc["spec"]["runtime_ref"] = doc["spec"].pop("runtimeRef")
    assert "runtime_ref" in str(refused(parse_object, doc)) or "runtimeRef" in str(refused(parse_object, doc))
    doc = trainjob_doc()
    doc["api_version"] = doc.pop("apiVersion")
    refused(parse_object, doc)


def test_duplicate_keys_are_refused() -> None:
    text = ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\nspec:\n"
            "  runtimeRef: {name: mpi-distributed}\n  trainer:\n    numNodes: 1\n    numNodes: 64\n")
    error = refused(load_documents, text, field="spec.trainer.numNodes")
    assert "duplicate key" in error.problem and "line 8" in error.problem


def test_yaml_merge_keys_may_be_overridden() -> None:
    text = ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\nspec:\n"
            "  runtimeRef: {name: mpi-distributed}\n  trainer:\n    <<: {numNodes: 1}\n    numNodes: 2\n")
    assert load_documents(text)[0].spec.trainer.num_nodes == 2


# --- tracebacks and exhaustion -----------------------------------------------------------------------------

_HEAD = ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: j}\nspec:\n"
         "  runtimeRef: {name: mpi-distributed}\n  trainer: {command: [x]}\n")


def test_alias_cycle_is_invalid_spec() -> None:
    text = _HEAD + "  runtimePatches: [{manager: example.com/x, trainingRuntimeSpec: &a {template: *a}}]\n"
    assert "cycle" in refused(load_documents, text).problem
    assert "cycle" in refused(load_documents, _HEAD.replace("[x]", "&b [*b]")).problem


def test_python_cycles_and_depth_are_refused_on_every_path() -> None:
    doc = trainjob_doc()
    loop: dict = {}
    loop["template"] = loop
    doc["spec"]["runtimePatches"] = [{"manager": "example.com/x", "trainingRuntimeSpec": loop}]
    assert "refers to itself" in refused(parse_object, doc).problem
    deep: dict = {"x": 1}
    for _ in range(200):
        deep = {"a": deep}
    doc["spec"]["runtimePatches"] = [{"manager": "example.com/x", "trainingRuntimeSpec": deep}]
    assert "levels deep" in refused(parse_object, doc).problem


def test_deeply_nested_runtime_patch_is_invalid_spec() -> None:
    depth = 900  # libyaml's own limit is 1000; Python's recursion limit is lower
    text = _HEAD + ("  runtimePatches: [{manager: example.com/x, trainingRuntimeSpec: {template: {spec: "
                    + "{a: " * depth + "1" + "}" * depth + "}}}]\n")
    assert "levels deep" in refused(load_documents, text).problem


def test_deeply_nested_cluster_config_is_invalid_spec(tmp_path, monkeypatch) -> None:
    depth = 900
    write_config(tmp_path, monkeypatch, CLUSTER_HEAD + "metadata: {name: hpc}\nspec:\n  type: slurm\n"
                 "  defaults: {launchCommand: " + "[" * depth + "x" + "]" * depth + "}\n")
    assert "levels deep" in refused(load_clusters).problem


def test_alias_references_are_bounded() -> None:
    anchors = "x-values: &v [1, 2, 3]\n"
    text = _HEAD.replace("kind: TrainJob\n", "kind: TrainJob\n" + anchors) + \
        "  extra: [" + ", ".join(["*v"] * 150) + "]\n"
    assert "alias" in refused(load_documents, text).problem


def test_alias_bomb_is_refused_fast() -> None:
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    text = _HEAD + "  bomb:\n" + "".join(f"    {line}\n" for line in levels)
    start = time.monotonic()
    refused(load_documents, text)
    assert time.monotonic() - start < 2


def test_value_count_is_bounded_before_nodes_are_built() -> None:
    """4 MiB of '1,' is two million YAML nodes (~1 GB once composed): refused from the event stream first."""
    text = _HEAD + "  x: [" + "1," * 1_000_000 + "1]\n"
    start = time.monotonic()
    assert "more than" in refused(load_documents, text).problem
    assert time.monotonic() - start < 3


def test_oversized_input_is_refused(tmp_path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * MAX_INPUT_BYTES + b"\n")
    assert "larger than" in refused(read_input, str(path)).problem


@pytest.mark.parametrize("kind, trainer, field", [
    ("kubernetes", {"numNodes": 2**31 - 1}, "spec.trainer.numNodes"),
    ("kubernetes", {"numNodes": 5001}, "spec.trainer.numNodes"),
    ("local", {"numNodes": 65}, "spec.trainer.numNodes"),
    ("slurm", {"numNodes": 100_001}, "spec.trainer.numNodes"),
    ("slurm", {"numNodes": 2, "numProcPerNode": 1025}, "spec.trainer.numProcPerNode"),
    ("flux", {"numNodes": 1, "resourcesPerNode": {"requests": {"nvidia.com/gpu": "100000"}}},
     "spec.trainer.numProcPerNode"),
])
def test_counts_are_bounded_before_rendering(kind: str, trainer: dict, field: str) -> None:
    start = time.monotonic()
    refused(render, trainjob_doc(trainer={"command": ["x"], **trainer}), kind, field=field)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("kind", ["slurm", "flux", "kubernetes", "local"])
def test_huge_quantities_are_refused_not_overflowed(kind: str) -> None:
    """Fuzz finding: a memory request of 400 nines overflowed a float division (OverflowError)."""
    trainer = {"command": ["x"], "resourcesPerNode": {"requests": {"memory": "9" * 400}}}
    refused(render, trainjob_doc(trainer=trainer), kind, field="resourcesPerNode.requests")
    trainer["resourcesPerNode"]["requests"] = {"memory": "7Ei"}  # within 2^63-1, as Kubernetes bounds it
    assert render(trainjob_doc(trainer=trainer), "slurm").count("#SBATCH --mem=") == 1


@pytest.mark.parametrize("resources, field", [
    ({"requests": {"bad\nname": "1"}}, "resourcesPerNode.requests"),
    ({"requests": {"cpu": " 2"}}, "resourcesPerNode.requests"),
])
def test_resource_names_and_quantities_follow_kubernetes(resources: dict, field: str) -> None:
    refused(parse_object, trainjob_doc(trainer={"command": ["x"], "resourcesPerNode": resources}), field=field)


@pytest.mark.parametrize("patch, field", [
    ({"template": {"spec": ["x"]}}, "trainingRuntimeSpec.template.spec"),
    ({"template": "x"}, "trainingRuntimeSpec.template"),
    ({"template": {"spec": {"replicatedJobs": {"name": "node"}}}}, "spec.replicatedJobs"),
    ({"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": ["unhashable"]}]}}}}}]}}}, "runtimePatches"),
])
def test_runtime_patch_of_the_wrong_shape_is_invalid_spec(patch: dict, field: str) -> None:
    """Fuzz finding: a list where the planner expected a mapping raised AttributeError."""
    doc = trainjob_doc(spec={"runtimePatches": [{"manager": "example.com/x", "trainingRuntimeSpec": patch}]})
    for kind in ("slurm", "kubernetes"):
        refused(render, doc, kind, field=field)


def test_time_limit_is_bounded_for_hpc_backends() -> None:
    doc = trainjob_doc(spec={"activeDeadlineSeconds": 10**30})
    refused(parse_object, doc, field="spec.activeDeadlineSeconds")
    doc = trainjob_doc(spec={"activeDeadlineSeconds": 2**40})
    refused(render, doc, "flux", field="spec.activeDeadlineSeconds")


@pytest.mark.parametrize("array", ["0-99999999", "0-" + "9" * 5000, "5-1", "0-10:0", "0-3%0"])
def test_array_specs_are_bounded(array: str) -> None:
    refused(render, trainjob_doc(annotations={"hpcbridge.io/array": array}), "slurm", field="hpcbridge.io/array")


def test_array_specs_within_slurm_bounds_pass() -> None:
    assert "#SBATCH --array=0-4000000:2%10\n" in render(
        trainjob_doc(annotations={"hpcbridge.io/array": "0-4000000:2%10"}), "slurm")


def _cli(args: list[str], stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "HPCBRIDGE_CONFIG"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "bridge", *args], input=stdin, capture_output=True,
                          env=full_env, cwd=ROOT, timeout=60)


_CLI_CASES = {
    "alias-cycle": _HEAD.encode() + b"  runtimePatches: [{manager: e.com/x, trainingRuntimeSpec: &a {t: *a}}]\n",
    "deep": _HEAD.encode() + b"  runtimePatches: [{manager: e.com/x, trainingRuntimeSpec: "
    + b"{a: " * 900 + b"1" + b"}" * 900 + b"}]\n",
    "not-utf8": b"apiVersion: \xff\xfe\n",
    "crlf-script": b"#!/bin/bash\r\n#SBATCH -N 1\r\nhostname\r\n",
    "huge-int": _HEAD.replace("[x]}", "[x], numNodes: " + "9" * 5000 + "}").encode(),
    "surrogate": _HEAD.replace("[x]", '["\\ud800"]').encode(),
    "binary-tag": _HEAD.encode() + b"  runtimePatches: [{manager: e.com/x, trainingRuntimeSpec: {x: !!binary AAE=}}]\n",
    "k8s-nodes": _HEAD.replace("[x]}", "[x], numNodes: 2147483647}").encode(),
    # fuzz finding: repr() of an int of more than 4300 digits raises ValueError
    "huge-hex-int": _HEAD.replace("{name: j}", "{name: !!int 0x" + "f" * 5000 + "}").encode(),
}


@pytest.mark.parametrize("case", sorted(_CLI_CASES))
def test_cli_answers_hostile_input_with_one_line_and_exit_2(case: str) -> None:
    result = _cli(["render", "-", "--to", "kubernetes"], stdin=_CLI_CASES[case])
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert stderr.startswith("hpcbridge: error: ") and stderr.count("\n") == 1, stderr


def test_cli_alias_bomb_ends_quickly() -> None:
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    text = _HEAD + "  bomb:\n" + "".join(f"    {line}\n" for line in levels)
    start = time.monotonic()
    result = _cli(["validate", "-"], stdin=text.encode())
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    assert time.monotonic() - start < 20


# --- quoting -----------------------------------------------------------------------------------------------


def _bash_words(line: str, locale: str = "C") -> list[bytes]:
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True,
                         env={"LC_ALL": locale, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}).stdout
    return out.split(b"\0")[:-1]


def test_quote_is_locale_independent_for_invisible_characters() -> None:
    values = ["a\u2028b", "bidi\u202eevil", "nel\x85x", "zero\u200bwidth", "tab\there", "bell\x07"]
    for locale in ("C", "C.UTF-8"):
        assert _bash_words(join(values), locale) == [v.encode() for v in values]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                        max_size=12), min_size=1, max_size=4))
def test_quote_keeps_every_value_on_one_line_and_exact(values: list[str]) -> None:
    line = join(values)
    assert line.isprintable(), line
    assert _bash_words(line) == [v.encode() for v in values]


@pytest.mark.parametrize("port", [{"containerPort": 2**40}, {"containerPort": 0}, {"containerPort": 80, "hostPort": 70000},
                                  {"containerPort": 80, "protocol": "HTTP"}])
def test_container_ports_are_bounded_as_the_api_server_bounds_them(port: dict) -> None:
    """Fuzz finding: a runtime patch's containerPort of 2**40 rendered a JobSet the API server refused."""
    patch = {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": "node", "ports": [port]}]}}}}}]}}}
    doc = trainjob_doc(spec={"runtimePatches": [{"manager": "example.com/x", "trainingRuntimeSpec": patch}]})
    refused(render, doc, "kubernetes", field="runtimePatches")
