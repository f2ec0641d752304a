"""Property tests for every parser that reads hostile text (issue #24): whatever the input, the parser returns a
value or raises ``InvalidSpec`` with a one-line message — never another exception.

What tests/unit already covers is not repeated here: the #SBATCH tokenizer on one line without newlines
(test_convert_sbatch), valid hostlists round-tripping (test_hostlist), YAML dumped from random documents and
random short text (test_api_validation). These add what an attacker writes instead: whole batch scripts and
argv with quotes, CR, unicode line breaks, NUL and privileged options; arbitrary hostlist text; quantities of
every type; YAML with anchors, aliases, cycles, tags and odd scalars placed in TrainJob fields; and loaded
TrainJobs rendered for every backend. Examples are derandomized so the suite is deterministic.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.api.loader import load_documents
from bridge.api.quantity import parse_quantity
from bridge.convert.sbatch import to_trainjob
from bridge.errors import InvalidSpec
from bridge.mpi import hostlist
from bridge.sbatch.directives import parse_flags
from bridge.sbatch.options import OPTIONS
from bridge.sbatch.script import parse_script

pytestmark = pytest.mark.fuzz

#: sbatch options that make a job run as another user or with another user's login environment
PRIVILEGED = {"uid", "gid", "get-user-env"}

DETERMINISTIC = settings(derandomize=True, deadline=None, database=None, max_examples=300,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: characters that mean something to sbatch's tokenizer, to bash, or end a line for some reader
_ODD = list("\"'\\#: \t\r\x0b\x0c=,-$`;|&<>(){}[]*?~!%@") + ["\n", "\x00", "\x85", "\u2028", "\u2029", "\u202e",
                                                                "\ufeff", "\x1b"]
_WORD = st.text(alphabet=st.sampled_from(_ODD + list("abzAZ0129")), max_size=12)
_OPTION = st.sampled_from(sorted(OPTIONS))
_PIECE = st.one_of(
    _OPTION.map(lambda o: f"--{o}"),
    st.tuples(_OPTION, _WORD).map(lambda p: f"--{p[0]}={p[1]}"),
    st.sampled_from([f"-{opt.short}" for opt in OPTIONS.values() if opt.short]),
    st.sampled_from(["--uid=0", "--gid=0", "--get-user-env", "--ui=0", "--get-user", "hetjob", "packjob", "--",
                     "''", '""', "=", ":x", "-HkO", "-N2", "--wrap=id", "--comment=\"a\" --uid=0", "-J'a b'"]),
    _WORD,
)


def _one_line(exc: InvalidSpec) -> None:
    assert "\n" not in str(exc) and "\r" not in str(exc), repr(str(exc))


def _no_control(value: str | None) -> bool:
    return value is None or not any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in value)


_DIRECTIVE_LINE = st.tuples(st.sampled_from(["#SBATCH ", "#SBATCH\t", "#SBATCH", "#SLURM ", " #SBATCH ", "#sbatch "]),
                            st.lists(_PIECE, max_size=5), st.sampled_from([" ", "\t", "\r", " \x0b"])) \
    .map(lambda t: t[0] + t[2].join(t[1]))
_SCRIPT = st.tuples(
    st.sampled_from(["#!/bin/bash\n", "#!/bin/sh -e\n", "#!\n", "", "#!/usr/bin/env python3\n", "#!/bin/bash\r\n",
                     "#!bash\n", "\ufeff#!/bin/bash\n"]),
    st.lists(st.one_of(_DIRECTIVE_LINE, _WORD.map(lambda w: "# " + w), st.just("")), max_size=8),
    st.sampled_from(["", "echo hi\n", "srun hostname\n", "exec python3 train.py\n", "#SBATCH --uid=0\n",
                     "export A='x\n#SBATCH --gid=0'\nexec python3 t.py\n"]),
    st.sampled_from(["\n", "\r\n", "\r"]),
).map(lambda t: t[0] + t[3].join(t[1]) + t[3] + t[2])


@DETERMINISTIC
@given(_SCRIPT)
def test_parse_script_refuses_with_invalid_spec_only(script: str) -> None:
    """A whole batch script: parsed (every value one line, every option sbatch's) or refused; the request
    converts to a TrainJob or is refused — by InvalidSpec alone."""
    try:
        request = parse_script(script, "fuzz.sbatch")
    except InvalidSpec as exc:
        _one_line(exc)
        return
    for name, directive in request.options.items():
        assert name in OPTIONS or name == "ntasks-per-node", name
        assert _no_control(directive.value), directive
    try:
        trainjob, _ = to_trainjob(request)
    except InvalidSpec as exc:
        _one_line(exc)
        return
    # what a converted script carries to the Slurm script: never an option that runs the job as someone else
    passed = [key.removeprefix("hpcbridge.io/sbatch.") for key in trainjob.metadata.annotations or {}
              if key.startswith("hpcbridge.io/sbatch.")]
    assert not [name for name in passed if _resolve(name) in PRIVILEGED], passed


def _resolve(name: str) -> str:
    matches = {opt for opt in OPTIONS if opt.startswith(name)}
    return name if name in OPTIONS else matches.pop() if len(matches) == 1 else name


@DETERMINISTIC
@given(st.lists(_PIECE, max_size=8))
def test_parse_flags_refuses_with_invalid_spec_only(argv: list[str]) -> None:
    try:
        request = parse_flags(argv)
    except InvalidSpec as exc:
        _one_line(exc)
        return
    for directive in request.options.values():
        assert _no_control(directive.value), directive


_HOSTLIST = st.lists(st.sampled_from(list("[]-,0123456789abn_.") + [" ", "\t", "\n", "\x00", "é", "\u2028", "0" * 12,
                                                                     "9" * 20, "n[1-99999]"]), max_size=30).map("".join)


@DETERMINISTIC
@given(_HOSTLIST)
def test_hostlist_expand_refuses_with_invalid_spec_only(text: str) -> None:
    try:
        hosts = hostlist.expand(text)
    except InvalidSpec as exc:
        _one_line(exc)
        return
    # what expands compresses, and the compressed form expands to the same hosts
    try:
        compressed = hostlist.compress(hosts)
    except InvalidSpec as exc:
        _one_line(exc)
        return
    assert hostlist.expand(compressed) == hosts


@DETERMINISTIC
@given(st.lists(st.text(alphabet=st.sampled_from(list("[]-,0123456789abn_.") + [" ", "\n", "\x00", "é"]),
                        max_size=10), max_size=12))
def test_hostlist_compress_refuses_with_invalid_spec_only(names: list[str]) -> None:
    try:
        text = hostlist.compress(names)
    except InvalidSpec as exc:
        _one_line(exc)
        return
    assert hostlist.expand(text) == names


_QUANTITY_TEXT = st.text(alphabet=st.sampled_from(list("0123456789.eE+-KMGTPEimnuk \t\n") + ["\x00", "٣", "Ⅻ", "½"]),
                         max_size=24)


@DETERMINISTIC
@given(st.one_of(_QUANTITY_TEXT, st.integers(), st.integers(min_value=2**60), st.floats(), st.booleans(), st.none(),
                 st.text(max_size=12), st.sampled_from(["1e308", "9" * 5000, "1e30", "1e31", "1e-30", "1e-31",
                                                        "999999999999Ei", "0.0001m", "Infinity", "NaN", "1_000"])))
def test_parse_quantity_refuses_with_value_error_only(value) -> None:
    """parse_quantity's contract is ValueError (the models turn it into InvalidSpec, tested below)."""
    try:
        amount = parse_quantity(value)
    except ValueError:
        return
    assert isinstance(amount, Fraction)


# --- YAML: hostile fragments in TrainJob fields ----------------------------------------------------------

_FRAGMENTS = [
    "*undefined", "&a [*a]", "&a {x: *a}", "!!python/object/apply:os.system ['id']", "!!python/name:os.system",
    "!!binary '=='", "!!binary aGk=", "!!timestamp 2001-13-45", "2001-12-14t21:59:43.10-05:00", "!!set {a, b}",
    "!!omap [a: 1]", "!fuzz x", "!!int 0x" + "f" * 5000, "!!float 1e99999", "1e400", ".nan", "-.inf", "~", "0o777",
    "190:20:30", "[" * 200 + "]" * 200, "[" * 3000 + "]" * 3000, "'" + "9" * 400 + "'", "1" + "0" * 400, "{a: 1, a: 2}", "'a\u2028b'", "\"\\x85\"", "\"\\u202e\"", "\"\\0\"",
    "\"\\ud800\"", "\"a\\nb\"", "\"a\\rb\"", "'$(id)'", "'`id`'", "\"a\\\" --uid=0\"", "yes", "no", "on", "''",
    "[1, [2, [3]]]", "{? [a]: b}", "!!str", "- a", "|\n  a\n  b", ">-\n  a", str(2**64), str(-2**63 - 1), "1_000",
    "&b [x, x, x, x, x, x, x, x]", "<<: {a: 1}", "%", "@x", "`x`",
]
_PATHS = ["metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations",
          "metadata.annotations.x", "spec.runtimeRef.name", "spec.trainer.numNodes", "spec.trainer.command",
          "spec.trainer.args", "spec.trainer.env", "spec.trainer.resourcesPerNode.requests.cpu",
          "spec.trainer.resourcesPerNode.requests.memory", "spec.trainer.image", "spec.runtimePatches",
          "spec.activeDeadlineSeconds", "spec.suspend", "spec", "metadata", "kind", "apiVersion"]


def _trainjob_yaml(path: str, fragment: str) -> str:
    """A valid TrainJob with the raw YAML *fragment* as the value at *path* (dotted)."""
    import yaml

    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "fz", "annotations": {"hpcbridge.io/partition": "gpu"}},
           "spec": {"runtimeRef": {"name": "mpi-distributed"},
                    "trainer": {"numNodes": 2, "command": ["python3", "t.py"],
                                "resourcesPerNode": {"requests": {"cpu": "2", "memory": "1Gi"}}}}}
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = "FRAGMENT_HERE"
    return yaml.safe_dump(doc, sort_keys=False).replace("FRAGMENT_HERE", fragment)


@pytest.mark.parametrize("fragment", _FRAGMENTS, ids=range(len(_FRAGMENTS)))
def test_load_documents_refuses_hostile_yaml_with_invalid_spec_only(fragment: str) -> None:
    """Every fragment in every field (exhaustive: a few milliseconds each)."""
    for path in _PATHS:
        try:
            load_documents(_trainjob_yaml(path, fragment), "fuzz.yaml")
        except InvalidSpec as exc:
            _one_line(exc)


#: a hostile value as a YAML string (JSON-quoted, so it arrives verbatim), or a raw fragment
_VALUE_YAML = st.one_of(st.sampled_from(_FRAGMENTS), _WORD.map(json.dumps), st.lists(_WORD, max_size=3).map(json.dumps))


@DETERMINISTIC
@given(st.sampled_from(_PATHS), _VALUE_YAML, st.sampled_from(["slurm", "flux", "kubernetes", "local"]))
def test_whatever_loads_renders_or_is_refused_with_invalid_spec(path: str, fragment: str, backend: str) -> None:
    """A TrainJob that loads dumps back to YAML, and is planned and rendered for every backend type or refused
    with InvalidSpec."""
    _loads_and_renders_or_is_refused(_trainjob_yaml(path, fragment), backend)


def _loads_and_renders_or_is_refused(text: str, backend: str) -> None:
    """*text* read as `submit` reads it dumps back to YAML and is planned and rendered for *backend*, or is
    refused with one InvalidSpec line."""
    from bridge import service
    from bridge.api.loader import to_yaml

    try:
        source = service.read_input("-", stdin=text)
    except InvalidSpec as exc:
        _one_line(exc)
        return
    to_yaml(source.objects)
    try:
        service.prepare(source, to=backend)
    except InvalidSpec as exc:
        _one_line(exc)


# --- YAML: hostile fragments in Training Operator v1 jobs ---------------------------------------------------

_V1_CASES = Path(__file__).resolve().parent.parent / "cases" / "v1"
_V1_PATHS = {
    "pytorchjob-full": ["metadata.name", "metadata", "spec", "spec.nprocPerNode", "spec.runPolicy",
                        "spec.runPolicy.schedulingPolicy", "spec.runPolicy.schedulingPolicy.queue",
                        "spec.pytorchReplicaSpecs", "spec.pytorchReplicaSpecs.Worker",
                        "spec.pytorchReplicaSpecs.Worker.replicas", "spec.pytorchReplicaSpecs.Worker.template",
                        "spec.pytorchReplicaSpecs.Worker.template.spec",
                        "spec.pytorchReplicaSpecs.Worker.template.spec.containers",
                        "spec.pytorchReplicaSpecs.Worker.template.metadata",
                        "spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelector", "spec.elasticPolicy"],
    "mpijob-defaults": ["spec.slotsPerWorker", "spec.mpiImplementation", "spec.sshAuthMountPath",
                        "spec.runLauncherAsWorker", "spec.mpiReplicaSpecs.Launcher",
                        "spec.mpiReplicaSpecs.Launcher.template.spec.containers", "spec.mpiReplicaSpecs.Worker",
                        "spec.mpiReplicaSpecs.Worker.replicas", "metadata.namespace"],
    "tfjob-ps": ["spec.tfReplicaSpecs", "spec.tfReplicaSpecs.PS", "spec.tfReplicaSpecs.PS.replicas",
                 "spec.tfReplicaSpecs.Worker.template.spec.containers", "spec.successPolicy",
                 "spec.tfReplicaSpecs.Evaluator.replicas", "kind", "apiVersion"],
}
_V1_TARGETS = [(case, path) for case, paths in _V1_PATHS.items() for path in paths]


def _v1_yaml(case: str, path: str, fragment: str) -> str:
    import yaml

    doc = yaml.safe_load((_V1_CASES / f"{case}.yaml").read_text())
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {}) if isinstance(node.get(key), dict) or key not in node else node[key]
    node[keys[-1]] = "FRAGMENT_HERE"
    return yaml.safe_dump(doc, sort_keys=False).replace("'FRAGMENT_HERE'", fragment).replace(
        "FRAGMENT_HERE", fragment)


@DETERMINISTIC
@given(st.sampled_from(_V1_TARGETS), _VALUE_YAML, st.sampled_from(["slurm", "flux", "kubernetes", "local"]))
def test_a_hostile_v1_job_converts_renders_or_is_refused_with_invalid_spec(target, fragment: str,
                                                                          backend: str) -> None:
    """A PyTorchJob, MPIJob or TFJob with a hostile value anywhere converts, plans and renders, or is refused
    with one InvalidSpec line: never a traceback."""
    _loads_and_renders_or_is_refused(_v1_yaml(*target, fragment), backend)
