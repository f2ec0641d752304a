"""A deterministic catalogue of hostile and malformed inputs for every hpc-bridge command.

``generate(seed)`` returns the same list of ``Case`` objects, byte for byte, for the same seed: the fields and
payloads are enumerated systematically; the seed only chooses which runtime (and so which launcher and artifact
shape) each TrainJob case uses and the filler around some values. Every payload that would run a command if it
ever reached a shell creates the case's marker file (``FZMARK-<n>``) in the current directory; the oracles run
each rendered script in a sandbox and look for it.

Kinds of case:
  trainjob   one field of a TrainJob (metadata, annotations and hpcbridge.io/* knobs, sbatch.<opt>, runtimeRef,
             trainer command/args/env/image/resources, runtimePatches, initializer) × a payload
  runtime    one field of an inline runtime the TrainJob references (name, container workingDir/env/image, MPI)
  config     one field of the cluster config file (HPCBRIDGE_CONFIG) the TrainJob targets × a payload
  types      wrong types and huge numbers where the API wants ints, bools, strings, lists
  yaml       YAML bombs (billion laughs), alias cycles, deep nesting, tags, odd streams
  file       empty, binary, non-UTF-8 and over-long files
  sbatch     batch scripts: broken, smuggled (quotes sbatch re-parses, lone CR, CRLF) and privileged directives
  flags      sbatch flags after the file on submit/convert
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

SEED = 24
FILE = "{file}"

#: every command an input goes through; FILE is replaced by the input's path (or "-" for stdin)
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("validate", FILE),
    ("render", FILE, "-o", "json"),
    ("render", FILE, "--to", "slurm", "-o", "json"),
    ("render", FILE, "--to", "flux", "-o", "json"),
    ("render", FILE, "--to", "kubernetes", "-o", "json"),
    ("render", FILE, "--to", "local", "-o", "json"),
    ("convert", FILE, "--to", "trainjob"),
    ("convert", FILE, "--to", "sbatch"),
    ("convert", FILE, "--to", "jobspec"),
    ("convert", FILE, "--to", "jobset"),
    ("submit", FILE, "--dry-run", "-o", "json"),
)
#: the commands that take sbatch flags after the file
FLAG_COMMANDS = tuple(c for c in COMMANDS if c[0] in ("convert", "submit"))


@dataclass(frozen=True)
class Case:
    """One hostile input and how to run it."""

    index: int
    kind: str
    #: the field or structure made hostile, e.g. ``spec.trainer.env[0].value``
    field: str
    #: the payload's name, e.g. ``cmdsubst``
    payload: str
    #: the input file's bytes
    data: bytes
    #: the cluster config (HPCBRIDGE_CONFIG) bytes, None for no config file
    config: bytes | None = None
    #: sbatch flags given after the file (submit and convert only)
    flags: tuple[str, ...] = ()
    #: run as a real subprocess (exhaustion candidates: bombs, huge inputs)
    heavy: bool = False
    #: give the input on stdin ("-") instead of as a file
    stdin: bool = False
    #: argv templates (FILE marks the input)
    commands: tuple[tuple[str, ...], ...] = COMMANDS
    #: name of the input file (the suffix matters to nothing, the name is the sbatch default job name)
    filename: str = "input.yaml"

    @property
    def id(self) -> str:
        return f"{self.index:04d}-{self.kind}-{self.field}-{self.payload}"

    @property
    def marker(self) -> str:
        return marker_name(self.index)

    def describe(self, limit: int = 160) -> str:
        """A short, one-line, printable description of the input for reports."""
        text = self.data.decode("utf-8", "backslashreplace")
        shown = text if len(text) <= limit else text[:limit] + f"…(+{len(text) - limit} chars)"
        extra = f" flags={list(self.flags)!r}" if self.flags else ""
        if self.config is not None:
            cfg = self.config.decode("utf-8", "backslashreplace")
            extra += f" config={cfg[:limit]!r}"
        return f"{self.id}: {shown!r}{extra}"


def marker_name(index: int) -> str:
    return f"FZMARK-{index}"


# --- payloads ----------------------------------------------------------------------------------------------
# Each is a function of the marker file name. The ones that would run `touch` end with " #" so whatever a
# renderer writes after the value on the same line becomes a comment: the command runs intact if injected.

PAYLOADS: dict[str, Callable[[str], str]] = {
    "newline": lambda m: f"a\ntouch {m} #",
    "cr": lambda m: f"a\rtouch {m} #",
    "crlf": lambda m: f"a\r\ntouch {m} #",
    "cmdsubst": lambda m: f"$(touch {m})",
    "backtick": lambda m: f"`touch {m}`",
    "semicolon": lambda m: f"a; touch {m} #",
    "squote": lambda m: f"a'; touch {m} #'",
    "dquote": lambda m: f'a"; touch {m} #"',
    "sbatch-newline": lambda m: f"a\n#SBATCH --uid=0\ntouch {m} #",
    "sbatch-quote": lambda m: 'a" --uid=0 --comment="b',
    "nul": lambda m: f"a\x00touch {m}",
    "u2028": lambda m: f"a\u2028touch {m} #",
    "bidi": lambda m: f"a\u202e; touch {m} #\u2066",
    "overlong": lambda m: "a" * 70_000 + f"$(touch {m})",
}
EXTRA_PAYLOADS: dict[str, Callable[[str], str]] = {
    "u0085": lambda m: f"a\u0085touch {m} #",
    "u2029": lambda m: "a\u2029#SBATCH --gid=0",
    "hash": lambda m: "a #SBATCH --uid=0",
    "dollar-brace": lambda m: f"${{IFS}}$(touch${{IFS}}{m})",
    "backslash-newline": lambda m: f"a\\\ntouch {m} #",
    "vt-ff": lambda m: f"a\x0b\x0ctouch {m} #",
    "tab-option": lambda m: "a\t--uid=0",
    "squote-sbatch": lambda m: "a' --gid=0 '",
    "empty": lambda m: "",
    "dash-option": lambda m: "--uid=0",
    "redirect": lambda m: f"a\n: > {m} #",
    "escape-seq": lambda m: f"a\x1b[2J\x1b]0;touch {m}\x07",
    "lone-cr-sbatch": lambda m: "a\r#SBATCH --get-user-env",
    "glob-tilde": lambda m: "~root/*",
}
ALL_PAYLOADS = {**PAYLOADS, **EXTRA_PAYLOADS}


# --- documents ---------------------------------------------------------------------------------------------

API = "trainer.kubeflow.org/v1alpha1"
RUNTIMES = ("mpi-distributed", "torch-distributed", "mpich-distributed", "sbatch-script", "flux-distributed",
            "fz-plain")
#: an inline runtime without a policy (plain launcher) and with a full container, for runtime-field cases
PLAIN_RUNTIME = {
    "apiVersion": API, "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "fz-plain"},
    "spec": {"mlPolicy": {"numNodes": 1},
             "template": {"spec": {"replicatedJobs": [{
                 "name": "node",
                 "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                              "spec": {"template": {"spec": {"containers": [{
                                  "name": "node", "image": "ghcr.io/example/base:1", "workingDir": "/work",
                                  "env": [{"name": "BASE", "value": "1"}]}]}}}}}]}}},
}
MPI_RUNTIME = {
    "apiVersion": API, "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "fz-mpi"},
    "spec": {"mlPolicy": {"numNodes": 1, "mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                                                 "sshAuthMountPath": "/home/mpiuser/.ssh"}},
             "template": {"spec": {"replicatedJobs": [{
                 "name": "node",
                 "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                              "spec": {"template": {"spec": {"containers": [{
                                  "name": "node", "image": "ghcr.io/example/mpi:1"}]}}}}}]}}},
}


def base_trainjob(runtime: str = "mpi-distributed") -> dict[str, Any]:
    return {
        "apiVersion": API, "kind": "TrainJob",
        "metadata": {"name": "fz", "namespace": "fuzz", "labels": {"team": "ml"},
                     "annotations": {"example.com/note": "x"}},
        "spec": {
            "managedBy": "hpcbridge.io/bridge",
            "runtimeRef": {"name": runtime},
            "trainer": {
                "numNodes": 2,
                "numProcPerNode": 2,
                "command": ["python3", "train.py"],
                "args": ["--lr", "0.1"],
                "env": [{"name": "A", "value": "1"}],
                "image": "ghcr.io/example/train:1",
                "resourcesPerNode": {"requests": {"cpu": "2", "memory": "4Gi"}},
            },
        },
    }


#: libyaml's emitter when PyYAML has it (same output on every run; several times faster than the Python one)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(*documents: Any) -> bytes:
    """YAML that loads back to exactly *documents* (JSON flow style where block YAML would not round-trip)."""
    parts = []
    for document in documents:
        text = yaml.dump(document, Dumper=_DUMPER, allow_unicode=True, sort_keys=False, width=1_000_000)
        try:
            same = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) == document
        except yaml.YAMLError:
            same = False
        if not same:
            text = json.dumps(document, ensure_ascii=True) + "\n"
        parts.append(text)
    return "---\n".join(parts).encode("utf-8", "surrogatepass")


def _trainer(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["trainer"]


def _annotate(key: str) -> Callable[[dict[str, Any], str], None]:
    def setter(doc: dict[str, Any], value: str) -> None:
        doc["metadata"]["annotations"][key] = value
    return setter


def _annotate_key(prefix: str) -> Callable[[dict[str, Any], str], None]:
    def setter(doc: dict[str, Any], value: str) -> None:
        doc["metadata"]["annotations"][prefix + value] = "1"
    return setter


def _patch(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"manager": "example.com/fuzz", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [
            {"name": "node", **container}]}}}}}]}}}}]


def _set(path: str) -> Callable[[dict[str, Any], str], None]:
    """A setter for a dotted path into the TrainJob (``[n]`` indexes lists)."""
    def setter(doc: dict[str, Any], value: str) -> None:
        node: Any = doc
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[int(key[1:-1])] if key.startswith("[") else node.setdefault(key, {})
        last = keys[-1]
        if last.startswith("["):
            node[int(last[1:-1])] = value
        else:
            node[last] = value
    return setter


# field name → (setter on the TrainJob, uses the full payload list)
TRAINJOB_FIELDS: dict[str, tuple[Callable[[dict[str, Any], str], None], bool]] = {
    "metadata.name": (_set("metadata.name"), True),
    "metadata.namespace": (_set("metadata.namespace"), True),
    "metadata.uid": (_set("metadata.uid"), True),
    "metadata.labels.value": (lambda d, v: d["metadata"]["labels"].__setitem__("team", v), True),
    "metadata.labels.key": (lambda d, v: d["metadata"]["labels"].__setitem__(v, "x"), False),
    "metadata.annotations.value": (_annotate("example.com/note"), False),
    "metadata.annotations.key": (lambda d, v: d["metadata"]["annotations"].__setitem__(v, "x"), False),
    **{f"annotations.hpcbridge.io/{knob}": (_annotate(f"hpcbridge.io/{knob}"), knob in ("partition", "output",
                                                                                          "workdir", "constraint"))
       for knob in ("partition", "account", "qos", "constraint", "exclusive", "array", "dependency", "output",
                    "error", "workdir", "cluster", "migrate-to")},
    "annotations.hpcbridge.io/sbatch.comment": (_annotate("hpcbridge.io/sbatch.comment"), True),
    "annotations.hpcbridge.io/sbatch.mail-user": (_annotate("hpcbridge.io/sbatch.mail-user"), False),
    "annotations.hpcbridge.io/sbatch.begin": (_annotate("hpcbridge.io/sbatch.begin"), False),
    "annotations.hpcbridge.io/sbatch.<opt>": (_annotate_key("hpcbridge.io/sbatch."), False),
    "annotations.hpcbridge.io/<knob>": (_annotate_key("hpcbridge.io/"), False),
    "spec.runtimeRef.name": (_set("spec.runtimeRef.name"), False),
    "spec.runtimeRef.kind": (_set("spec.runtimeRef.kind"), False),
    "spec.managedBy": (_set("spec.managedBy"), False),
    "spec.trainer.command[0]": (_set("spec.trainer.command.[0]"), True),
    "spec.trainer.command[1]": (_set("spec.trainer.command.[1]"), True),
    "spec.trainer.args[0]": (_set("spec.trainer.args.[0]"), True),
    "spec.trainer.env[0].name": (lambda d, v: _trainer(d)["env"][0].__setitem__("name", v), True),
    "spec.trainer.env[0].value": (lambda d, v: _trainer(d)["env"][0].__setitem__("value", v), True),
    "spec.trainer.env[+].value": (lambda d, v: _trainer(d)["env"].append({"name": "ZZ", "value": v}), False),
    "spec.trainer.image": (_set("spec.trainer.image"), True),
    "spec.trainer.resourcesPerNode.requests.cpu": (
        lambda d, v: _trainer(d)["resourcesPerNode"]["requests"].__setitem__("cpu", v), False),
    "spec.trainer.resourcesPerNode.requests.key": (
        lambda d, v: _trainer(d)["resourcesPerNode"]["requests"].__setitem__(v, "1"), False),
    "spec.trainer.resourcesPerNode.limits.gpu": (
        lambda d, v: _trainer(d)["resourcesPerNode"].__setitem__("limits", {"nvidia.com/gpu": v}), False),
    "spec.runtimePatches.manager": (lambda d, v: d["spec"].__setitem__("runtimePatches", [
        {"manager": v, "trainingRuntimeSpec": {}}]), False),
    "spec.runtimePatches.workingDir": (lambda d, v: d["spec"].__setitem__("runtimePatches", _patch(
        {"workingDir": v})), True),
    "spec.runtimePatches.env": (lambda d, v: d["spec"].__setitem__("runtimePatches", _patch(
        {"env": [{"name": "PATCHED", "value": v}]})), True),
    "spec.runtimePatches.image": (lambda d, v: d["spec"].__setitem__("runtimePatches", _patch({"image": v})), False),
    "spec.runtimePatches.command": (lambda d, v: d["spec"].__setitem__("runtimePatches", _patch(
        {"command": ["python3", v]})), False),
    "spec.runtimePatches.jobName": (lambda d, v: d["spec"].__setitem__("runtimePatches", [
        {"manager": "example.com/fuzz", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": v}]}}}}]), False),
    "spec.initializer.dataset.storageUri": (_set("spec.initializer.dataset.storageUri"), False),
}

# inline-runtime fields: (setter on (trainjob, runtime), which runtime document)
RUNTIME_FIELDS: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any], str], None], dict[str, Any]]] = {
    "runtime.metadata.name": (lambda tj, rt, v: (rt["metadata"].__setitem__("name", v),
                                                 tj["spec"]["runtimeRef"].__setitem__("name", v)), PLAIN_RUNTIME),
    "runtime.container.workingDir": (lambda tj, rt, v: _container(rt).__setitem__("workingDir", v), PLAIN_RUNTIME),
    "runtime.container.env.value": (lambda tj, rt, v: _container(rt)["env"][0].__setitem__("value", v),
                                    PLAIN_RUNTIME),
    "runtime.container.env.name": (lambda tj, rt, v: _container(rt)["env"][0].__setitem__("name", v),
                                   PLAIN_RUNTIME),
    "runtime.container.image": (lambda tj, rt, v: (_container(rt).__setitem__("image", v),
                                                   _trainer(tj).pop("image")), PLAIN_RUNTIME),
    "runtime.container.command": (lambda tj, rt, v: (_container(rt).__setitem__("command", ["python3", v]),
                                                     _trainer(tj).pop("command"), _trainer(tj).pop("args")),
                                  PLAIN_RUNTIME),
    "runtime.mpi.sshAuthMountPath": (lambda tj, rt, v: rt["spec"]["mlPolicy"]["mpi"].__setitem__(
        "sshAuthMountPath", v), MPI_RUNTIME),
    "runtime.labels.hpcbridge.io/cluster": (lambda tj, rt, v: rt["metadata"].__setitem__(
        "labels", {"hpcbridge.io/cluster": v}), PLAIN_RUNTIME),
}


def _container(runtime: dict[str, Any]) -> dict[str, Any]:
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]


# --- cluster configs ---------------------------------------------------------------------------------------

CLUSTER = "fzc"


def cluster_doc(kind: str, name: str = CLUSTER) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": kind}
    if kind == "slurm":
        spec["slurm"] = {"transport": "ssh", "host": "login.example.org", "user": "alice"}
    elif kind == "flux":
        spec["flux"] = {"uri": "local:///run/flux/local", "environment": {"LANG": "C"}}
    elif kind == "kubernetes":
        spec["kubernetes"] = {"namespace": "fuzz"}
    spec["defaults"] = {"partition": "gpu", "account": "ml", "workdir": "/scratch/fz",
                        "launchCommand": ["hpcbridge", "launch"]}
    return {"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": name},
            "spec": spec}


def _default_setter(knob: str) -> Callable[[dict[str, Any], dict[str, Any], str], None]:
    def setter(cluster: dict[str, Any], trainjob: dict[str, Any], value: str) -> None:
        cluster["spec"]["defaults"][knob] = value
    return setter


# field → (setter on (cluster doc, trainjob doc, value), cluster types it applies to)
CONFIG_FIELDS: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any], str], None], tuple[str, ...]]] = {
    "cluster.metadata.name": (lambda c, tj, v: (c["metadata"].__setitem__("name", v),
                                                tj["metadata"]["annotations"].__setitem__("hpcbridge.io/cluster", v)),
                              ("slurm", "flux", "kubernetes")),
    **{f"defaults.{knob}": (_default_setter(knob), ("slurm", "flux", "kubernetes"))
       for knob in ("partition", "account", "qos", "constraint", "workdir")},
    "defaults.launchCommand[0]": (lambda c, tj, v: c["spec"]["defaults"].__setitem__("launchCommand", [v, "launch"]),
                                  ("slurm", "flux")),
    "defaults.launchCommand[1]": (lambda c, tj, v: c["spec"]["defaults"].__setitem__(
        "launchCommand", ["hpcbridge", v]), ("slurm", "flux")),
    "defaults.containerRuntime+image": (lambda c, tj, v: (c["spec"]["defaults"].__setitem__(
        "containerRuntime", "apptainer"), _trainer(tj).__setitem__("image", v)), ("slurm", "flux")),
    "accountMapping.value": (lambda c, tj, v: (c["spec"]["defaults"].pop("account"),
                                               c["spec"].__setitem__("accountMapping", {"fuzz": v})),
                             ("slurm", "flux", "kubernetes")),
    "accountMapping.key": (lambda c, tj, v: c["spec"].__setitem__("accountMapping", {v: "ml"}), ("slurm",)),
    "allowedNamespaces": (lambda c, tj, v: (c["spec"].__setitem__("allowedNamespaces", [v]),
                                            tj["metadata"].__setitem__("namespace", v)), ("slurm", "kubernetes")),
    "flux.uri": (lambda c, tj, v: c["spec"]["flux"].__setitem__("uri", "local://" + v), ("flux",)),
    "flux.environment.value": (lambda c, tj, v: c["spec"]["flux"]["environment"].__setitem__("LANG", v), ("flux",)),
    "flux.environment.key": (lambda c, tj, v: c["spec"]["flux"]["environment"].__setitem__(v, "1"), ("flux",)),
    "flux.environment.PATH": (lambda c, tj, v: c["spec"]["flux"]["environment"].__setitem__("PATH", v), ("flux",)),
    "flux.fluxCommand": (lambda c, tj, v: c["spec"]["flux"].__setitem__("fluxCommand", "/opt/" + v), ("flux",)),
    "slurm.host": (lambda c, tj, v: c["spec"]["slurm"].__setitem__("host", v), ("slurm",)),
    "slurm.user": (lambda c, tj, v: c["spec"]["slurm"].__setitem__("user", v), ("slurm",)),
    "slurm.slurmConf": (lambda c, tj, v: c["spec"]["slurm"].__setitem__("slurmConf", v), ("slurm",)),
    "slurm.rest": (lambda c, tj, v: c["spec"].__setitem__("slurm", {"transport": "rest", "restUrl": "http://h:6820",
                                                                    "user": v}), ("slurm",)),
    "kubernetes.namespace": (lambda c, tj, v: c["spec"]["kubernetes"].__setitem__("namespace", v), ("kubernetes",)),
}


# --- YAML structures, types, files, scripts ----------------------------------------------------------------

def _yaml_trainjob(extra_spec: str = "", extra_meta: str = "", trainer: str = "") -> str:
    return ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: fz\n"
            f"{extra_meta}spec:\n  runtimeRef:\n    name: mpi-distributed\n"
            f"  trainer:\n    command: [python3, train.py]\n{trainer}{extra_spec}")


def yaml_cases() -> Iterator[tuple[str, str, bytes, bool]]:
    """(field, payload name, file bytes, heavy)."""
    laugh_defs = "".join(f"x-lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
    bomb_head = "x-lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + laugh_defs
    # anchors must be defined before use: build the bomb inside the document where it is used
    def in_place(path_prefix: str, suffix: str) -> str:
        chain = "&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"
        for i in range(1, 10):
            chain = f"&l{i} [{chain}, {', '.join([f'*l{i - 1}'] * 9)}]"
        return path_prefix + chain + suffix
    yield "top-level", "billion-laughs", (bomb_head + "apiVersion: v1\n").encode(), True
    yield "spec.runtimePatches.trainingRuntimeSpec", "billion-laughs", _yaml_trainjob(
        extra_spec="  runtimePatches:\n  - manager: example.com/x\n    trainingRuntimeSpec:\n      bomb: "
        + in_place("", "\n")).encode(), True
    yield "metadata.managedFields", "billion-laughs", _yaml_trainjob(
        extra_meta="  managedFields:\n  - bomb: " + in_place("", "\n")).encode(), True
    yield "spec.trainer.args", "billion-laughs", _yaml_trainjob(
        trainer="    args: " + in_place("", "\n")).encode(), True
    yield "metadata.labels", "billion-laughs", _yaml_trainjob(
        extra_meta="  labels: {a: " + in_place("", "}\n")).encode(), True
    yield "runtime.template.volumes", "billion-laughs", (
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata: {name: fz-bomb}\n"
        "spec:\n  template:\n    spec:\n      replicatedJobs:\n      - name: node\n        template:\n"
        "          spec:\n            template:\n              spec:\n                containers: [{name: node, "
        "image: x}]\n                volumes:\n                - name: v\n                  bomb: "
        + in_place("", "\n") + "---\n" + _yaml_trainjob().replace("mpi-distributed", "fz-bomb")).encode(), True
    yield "spec.runtimePatches.trainingRuntimeSpec", "alias-cycle", _yaml_trainjob(
        extra_spec="  runtimePatches:\n  - manager: example.com/x\n    trainingRuntimeSpec: &c {template: {spec: "
                   "{replicatedJobs: [{name: node, x: *c}]}}}\n").encode(), True
    yield "metadata.managedFields", "alias-cycle", _yaml_trainjob(
        extra_meta="  managedFields: &c [*c]\n").encode(), True
    yield "metadata.labels", "alias-cycle", _yaml_trainjob(extra_meta="  labels: &c {a: *c}\n").encode(), True
    yield "top-level", "alias-cycle", b"&c [*c]\n", True
    yield "spec", "alias-cycle-merge", _yaml_trainjob().replace("spec:\n", "spec: &s\n  <<: *s\n", 1).encode(), True
    for depth in (1_000, 100_000):
        yield "spec.runtimePatches.trainingRuntimeSpec", f"deep-flow-{depth}", _yaml_trainjob(
            extra_spec="  runtimePatches:\n  - manager: example.com/x\n    trainingRuntimeSpec: "
            + "{a: " * depth + "1" + "}" * depth + "\n").encode(), True
        yield "top-level", f"deep-list-{depth}", ("[" * depth + "]" * depth + "\n").encode(), True
    yield "metadata.managedFields", "deep-block-5000", _yaml_trainjob(
        extra_meta="  managedFields:\n" + "".join("  " * (i + 2) + "- \n" for i in range(5000))).encode(), True
    yield "stream", "many-documents", ("---\n" * 50_000 + "apiVersion: v1\n").encode(), True
    yield "stream", "many-trainjobs", "---\n".join([_yaml_trainjob()] * 2000).encode(), True
    yield "metadata.annotations", "many-keys", _yaml_trainjob(
        extra_meta="  annotations:\n" + "".join(f"    k{i}: v\n" for i in range(100_000))).encode(), True
    yield "metadata.name", "long-key", _yaml_trainjob(extra_meta="  " + "k" * 2_000_000 + ": 1\n").encode(), True
    yield "spec.trainer.args", "long-string", _yaml_trainjob(
        trainer="    args: ['" + "a" * 20_000_000 + "']\n").encode(), True
    yield "spec.trainer.args", "many-args", _yaml_trainjob(trainer="    args: [" + "a, " * 200_000 + "b]\n").encode(), True
    yield "spec.trainer.env", "many-env", _yaml_trainjob(
        trainer="    env:\n" + "".join(f"    - {{name: V{i}, value: x}}\n" for i in range(100_000))).encode(), True
    # tags and odd scalars
    for name, text in (
        ("python-object", "!!python/object/apply:os.system ['touch {m}']"),
        ("python-name", "!!python/name:os.system"),
        ("binary-tag", "!!binary aGVsbG8="),
        ("set-tag", "!!set {a, b}"),
        ("timestamp", "2001-12-14t21:59:43.10-05:00"),
        ("bad-timestamp", "!!timestamp 9999-99-99"),
        ("huge-int-tag", "!!int 0x" + "f" * 5000),
        ("huge-float-tag", "!!float 1e99999"),
        ("sexagesimal", "190:20:30"),
        ("omap", "!!omap [a: 1, b: 2]"),
        ("local-tag", "!fuzz {a: 1}"),
        ("null-tag", "!!null ''"),
    ):
        yield "spec.trainer.numNodes", name, _yaml_trainjob(trainer=f"    numNodes: {text}\n").encode(), False
        yield "metadata.name", name, _yaml_trainjob().replace("name: fz", f"name: {text}").encode(), False
    yield "metadata", "duplicate-keys", _yaml_trainjob(extra_meta="  name: other\n").encode(), False
    yield "top-level", "directive-yaml-1.1", b"%YAML 1.1\n%TAG ! tag:example.com,2000:\n---\n" + \
        _yaml_trainjob().encode(), False
    yield "top-level", "bad-directive", b"%YAML 9.9\n---\n" + _yaml_trainjob().encode(), False
    yield "top-level", "tab-indent", _yaml_trainjob().replace("  name: fz", "\tname: fz").encode(), False
    yield "top-level", "unterminated-quote", _yaml_trainjob().replace("name: fz", "name: 'fz").encode(), False
    yield "top-level", "bom", b"\xef\xbb\xbf" + _yaml_trainjob().encode(), False
    yield "top-level", "crlf", _yaml_trainjob().replace("\n", "\r\n").encode(), False
    yield "top-level", "lone-cr", _yaml_trainjob().replace("\n", "\r").encode(), False
    yield "top-level", "scalar", b"just a string\n", False
    yield "top-level", "list", b"- 1\n- 2\n", False
    yield "top-level", "null", b"null\n", False
    yield "top-level", "comments-only", b"# nothing\n# here\n", False
    yield "top-level", "separator-only", b"---\n...\n---\n", False
    yield "top-level", "json", json.dumps(base_trainjob()).encode(), False
    yield "top-level", "kind-list", b"apiVersion: v1\nkind: List\nitems: []\n", False
    yield "top-level", "wrong-kind", b"apiVersion: trainer.kubeflow.org/v1alpha1\nkind: $(touch M)\n", False


def type_cases() -> Iterator[tuple[str, str, dict[str, Any] | list[Any], bool]]:
    """(field, value name, document(s), heavy) with wrong types and huge numbers."""
    numbers = {"str": "2", "bool": True, "null": None, "neg": -1, "zero": 0, "2**31": 2**31, "2**63": 2**63,
               "2**64": 2**64, "1e308": 1e308, "inf": float("inf"), "nan": float("nan"), "float": 1.5,
               "list": [1], "map": {"a": 1}, "huge": 10**400}
    int_fields = {
        "spec.trainer.numNodes": lambda d, v: _trainer(d).__setitem__("numNodes", v),
        "spec.trainer.numProcPerNode": lambda d, v: _trainer(d).__setitem__("numProcPerNode", v),
        "spec.activeDeadlineSeconds": lambda d, v: d["spec"].__setitem__("activeDeadlineSeconds", v),
    }
    for field_name, setter in int_fields.items():
        for name, value in numbers.items():
            doc = base_trainjob()
            setter(doc, value)
            yield field_name, name, doc, name == "huge"
    quantities = {"1e308": 1e308, "str-1e308": "1e308", "2**64": 2**64, "neg": "-1", "frac-gpu": "1.5",
                  "exa": "999999999999Ei", "long-digits": "9" * 400, "e30": "1e30", "e31": "1e31", "bool": True,
                  "nan": float("nan"), "inf": "Infinity", "milli": "0.0001m", "space": " 1", "list": [1]}
    for resource in ("cpu", "memory", "nvidia.com/gpu", "example.com/fpga"):
        for name, value in quantities.items():
            doc = base_trainjob("torch-distributed")
            _trainer(doc)["resourcesPerNode"]["requests"][resource] = value
            yield f"spec.trainer.resourcesPerNode.requests.{resource}", name, doc, False
    others = {
        "spec.trainer.command:str": lambda d: _trainer(d).__setitem__("command", "python3 train.py; touch M"),
        "spec.trainer.command:ints": lambda d: _trainer(d).__setitem__("command", [1, 2]),
        "spec.trainer.command:null-item": lambda d: _trainer(d).__setitem__("command", [None]),
        "spec.trainer.command:empty": lambda d: (_trainer(d).__setitem__("command", []), _trainer(d).pop("args")),
        "spec.trainer.command:129-items": lambda d: _trainer(d).__setitem__("command", ["a"] * 129),
        "spec.trainer.env.value:int": lambda d: _trainer(d)["env"][0].__setitem__("value", 1),
        "spec.trainer.env.value:bool": lambda d: _trainer(d)["env"][0].__setitem__("value", True),
        "spec.trainer.env:map": lambda d: _trainer(d).__setitem__("env", {"A": "1"}),
        "spec.trainer.env:duplicate": lambda d: _trainer(d)["env"].append({"name": "A", "value": "2"}),
        "metadata.labels:int": lambda d: d["metadata"]["labels"].__setitem__("team", 1),
        "metadata.labels:list": lambda d: d["metadata"].__setitem__("labels", ["a"]),
        "metadata.annotations.exclusive:bool": lambda d: d["metadata"]["annotations"].__setitem__(
            "hpcbridge.io/exclusive", True),
        "metadata:list": lambda d: d.__setitem__("metadata", []),
        "spec:str": lambda d: d.__setitem__("spec", "x"),
        "spec.suspend:str": lambda d: d["spec"].__setitem__("suspend", "yes"),
        "spec.runtimePatches:map": lambda d: d["spec"].__setitem__("runtimePatches", {"a": 1}),
        "spec.runtimePatches:17": lambda d: d["spec"].__setitem__("runtimePatches", [
            {"manager": f"example.com/m{i}"} for i in range(17)]),
        "spec.runtimePatches.spec:list": lambda d: d["spec"].__setitem__("runtimePatches", [
            {"manager": "example.com/m", "trainingRuntimeSpec": {"template": {"spec": ["x"]}}}]),
        "spec.runtimePatches.jobs:str": lambda d: d["spec"].__setitem__("runtimePatches", [
            {"manager": "example.com/m", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": "x"}}}}]),
        "spec.runtimePatches.jobs:items-str": lambda d: d["spec"].__setitem__("runtimePatches", [
            {"manager": "example.com/m", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": ["x"]}}}}]),
        "spec.runtimePatches.containers:str": lambda d: d["spec"].__setitem__("runtimePatches", [
            {"manager": "example.com/m", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": "node", "template": {"spec": {"template": {"spec": {"containers": "x"}}}}}]}}}}]),
        "spec.runtimePatches.env:null": lambda d: d["spec"].__setitem__("runtimePatches", _patch({"env": None})),
        "spec.runtimePatches.ports:huge": lambda d: d["spec"].__setitem__("runtimePatches", _patch(
            {"ports": [{"containerPort": 2**40}]})),
        "spec.runtimePatches.parallelism:huge": lambda d: d["spec"].__setitem__("runtimePatches", [
            {"manager": "example.com/m", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": "node", "replicas": 2**63, "template": {"spec": {"parallelism": 2**40}}}]}}}}]),
        "spec.runtimeRef:str": lambda d: d["spec"].__setitem__("runtimeRef", "mpi-distributed"),
        "apiVersion:int": lambda d: d.__setitem__("apiVersion", 1),
        "kind:null": lambda d: d.__setitem__("kind", None),
    }
    for field_name, mutate in others.items():
        doc = base_trainjob()
        mutate(doc)
        base, _, name = field_name.partition(":")
        yield base, name, doc, False
    config_types = {
        "slurm.port:2**31": {"slurm": {"transport": "ssh", "host": "h", "port": 2**31}},
        "slurm.port:bool": {"slurm": {"transport": "ssh", "host": "h", "port": True}},
        "slurm.transport:bad": {"slurm": {"transport": "telnet"}},
        "slurm.ssh-without-host": {"slurm": {"transport": "ssh"}},
        "defaults.launchCommand:empty": {"defaults": {"launchCommand": []}},
        "defaults.launchCommand:str": {"defaults": {"launchCommand": "hpcbridge launch; touch M"}},
        "defaults.containerRuntime:bad": {"defaults": {"containerRuntime": "docker; touch M"}},
        "flux.environment:list": {"flux": {"environment": ["A=1"]}},
        "type:bad": {"type": "pbs"},
    }
    for field_name, spec in config_types.items():
        base, _, name = field_name.partition(":")
        kind = "flux" if base.startswith("flux") else "slurm"
        cluster = cluster_doc(kind)
        cluster["spec"].update(spec)
        yield f"config.{base}", name or "wrong", [cluster], False


SBATCH_OK = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\n#SBATCH -t 10\n"


def sbatch_cases(m: Callable[[int], str], start: int) -> Iterator[tuple[str, str, str | bytes, bool]]:
    """(field, payload name, script text (str, or bytes for raw files), heavy); *m* gives the marker of a case
    numbered from *start* in yield order."""
    n = start
    scripts: list[tuple[str, str, Callable[[str], str | bytes], bool]] = [
        # privileged directives: the job would run as another user, or with another user's environment
        ("directive", "uid=0", lambda k: SBATCH_OK + "#SBATCH --uid=0\necho hi\n", False),
        ("directive", "uid-abbrev", lambda k: SBATCH_OK + "#SBATCH --ui=root\necho hi\n", False),
        ("directive", "gid=0", lambda k: SBATCH_OK + "#SBATCH --gid=0\necho hi\n", False),
        ("directive", "gid-space", lambda k: SBATCH_OK + "#SBATCH --gid root\necho hi\n", False),
        ("directive", "get-user-env", lambda k: SBATCH_OK + "#SBATCH --get-user-env\necho hi\n", False),
        ("directive", "get-user-env=10L", lambda k: SBATCH_OK + "#SBATCH --get-user-env=10L\necho hi\n", False),
        ("directive", "get-user-abbrev", lambda k: SBATCH_OK + "#SBATCH --get-user\necho hi\n", False),
        ("directive", "uid-in-comment-quote", lambda k: SBATCH_OK + "#SBATCH --comment=\"x\" --uid=0\necho hi\n",
         False),
        ("directive", "uid-late-line", lambda k: SBATCH_OK + "#SBATCH --comment x\n#SBATCH --uid 0\necho hi\n",
         False),
        # smuggling through quotes sbatch re-parses, lone CR, CRLF, unicode line breaks
        ("directive", "quote-smuggle-jobname", lambda k: SBATCH_OK + "#SBATCH --job-name='a b' --gid=0\necho hi\n",
         False),
        ("directive", "escaped-quote", lambda k: SBATCH_OK + '#SBATCH --comment="a\\" --uid=0 \\"b"\necho hi\n',
         False),
        ("directive", "lone-cr", lambda k: SBATCH_OK + "#SBATCH --comment=a\r#SBATCH --uid=0\necho hi\n", False),
        ("directive", "lone-cr-value", lambda k: SBATCH_OK + "#SBATCH --comment=a\r--uid=0\necho hi\n", False),
        ("directive", "crlf", lambda k: SBATCH_OK.replace("\n", "\r\n") + "echo hi\r\n", False),
        ("directive", "vt-ff", lambda k: SBATCH_OK + "#SBATCH --comment=a\x0b--uid=0\x0c--gid=0\necho hi\n",
         False),
        ("directive", "u2028", lambda k: SBATCH_OK + "#SBATCH --comment=a\u2028#SBATCH --uid=0\necho hi\n", False),
        ("directive", "u0085", lambda k: SBATCH_OK + "#SBATCH --comment=a\u0085#SBATCH --uid=0\necho hi\n", False),
        ("directive", "bidi", lambda k: SBATCH_OK + "#SBATCH --comment=a\u202e --uid=0\u2066\necho hi\n", False),
        ("directive", "nul", lambda k: SBATCH_OK + "#SBATCH --comment=a\x00--uid=0\necho hi\n", False),
        ("directive", "tab-separated", lambda k: SBATCH_OK + "#SBATCH\t--comment=a\t--uid=0\necho hi\n", False),
        ("directive", "after-blank-and-comment", lambda k: SBATCH_OK + "\n# note\n#SBATCH --uid=0\necho hi\n",
         False),
        # shell payloads in directive values: these must stay literal in every rendered script
        ("directive", "comment-cmdsubst", lambda k: SBATCH_OK + f"#SBATCH --comment=$(touch {k})\necho hi\n", False),
        ("directive", "jobname-backtick", lambda k: SBATCH_OK + f"#SBATCH -J `touch {k}`\necho hi\n", False),
        ("directive", "jobname-quoted-cmdsubst", lambda k: SBATCH_OK + f"#SBATCH -J \"$(touch {k})\"\necho hi\n",
         False),
        ("directive", "output-semicolon", lambda k: SBATCH_OK + f"#SBATCH --output='a;touch {k}'\necho hi\n", False),
        ("directive", "chdir-cmdsubst", lambda k: SBATCH_OK + f"#SBATCH --chdir=/tmp/$(touch {k})\necho hi\n",
         False),
        ("directive", "partition-cmdsubst", lambda k: SBATCH_OK + f"#SBATCH -p \"$(touch {k})\"\necho hi\n", False),
        ("directive", "account-semicolon", lambda k: SBATCH_OK + f"#SBATCH -A \"a; touch {k}\"\necho hi\n", False),
        ("directive", "constraint-quote", lambda k: SBATCH_OK + f"#SBATCH -C \"a'b; touch {k}\"\necho hi\n", False),
        ("directive", "mail-user-quote", lambda k: SBATCH_OK + f"#SBATCH --mail-user=\"a'\\\"; touch {k}\"\n"
         "echo hi\n", False),
        ("directive", "export-cmdsubst", lambda k: SBATCH_OK + f"#SBATCH --export=ALL,A=$(touch {k})\necho hi\n",
         False),
        ("directive", "dependency-semicolon", lambda k: SBATCH_OK + f"#SBATCH -d \"afterok:1;touch {k}\"\necho hi\n",
         False),
        ("directive", "begin-cmdsubst", lambda k: SBATCH_OK + f"#SBATCH --begin=\"$(touch {k})\"\necho hi\n", False),
        ("directive", "licenses-backtick", lambda k: SBATCH_OK + f"#SBATCH -L \"`touch {k}`\"\necho hi\n", False),
        ("directive", "reservation-hash", lambda k: SBATCH_OK + "#SBATCH --reservation=\"a #SBATCH --uid=0\"\n"
         "echo hi\n", False),
        ("directive", "wckey-newline-escape", lambda k: SBATCH_OK + f"#SBATCH --wckey=a\\ntouch\\ {k}\necho hi\n",
         False),
        ("directive", "nodes-prefix-option", lambda k: SBATCH_OK + "#SBATCH --node=3\necho hi\n", False),
        # broken directives
        ("directive", "unmatched-quote", lambda k: SBATCH_OK + "#SBATCH --comment=\"abc\necho hi\n", False),
        ("directive", "leading-colon", lambda k: SBATCH_OK + "#SBATCH :x\necho hi\n", False),
        ("directive", "missing-value", lambda k: SBATCH_OK + "#SBATCH --time\necho hi\n", False),
        ("directive", "bad-time", lambda k: SBATCH_OK + "#SBATCH --time=abc\necho hi\n", False),
        ("directive", "hetjob", lambda k: SBATCH_OK + "#SBATCH hetjob\n#SBATCH -N 1\necho hi\n", False),
        ("directive", "wrap", lambda k: SBATCH_OK + f"#SBATCH --wrap='touch {k}'\necho hi\n", False),
        ("directive", "double-dash", lambda k: SBATCH_OK + "#SBATCH -- --uid=0\necho hi\n", False),
        ("directive", "non-option", lambda k: SBATCH_OK + "#SBATCH uid=0\necho hi\n", False),
        ("directive", "huge-nodes", lambda k: SBATCH_OK + "#SBATCH -N 99999999999999999999\necho hi\n", False),
        ("directive", "huge-mem", lambda k: SBATCH_OK + "#SBATCH --mem=1e308\necho hi\n", False),
        ("directive", "huge-mem-units", lambda k: SBATCH_OK + "#SBATCH --mem=99999999999999999T\necho hi\n", False),
        ("directive", "huge-time", lambda k: SBATCH_OK + "#SBATCH -t 99999999999999:00:00\necho hi\n", False),
        ("directive", "huge-array", lambda k: SBATCH_OK + "#SBATCH --array=0-4294967296%99999999999\necho hi\n",
         False),
        ("directive", "huge-gres", lambda k: SBATCH_OK + "#SBATCH --gres=gpu:99999999999999999999\necho hi\n",
         False),
        ("directive", "gpus-negative", lambda k: SBATCH_OK + "#SBATCH --gpus-per-node=-1\necho hi\n", False),
        ("directive", "cpus-zero", lambda k: SBATCH_OK + "#SBATCH -c 0\necho hi\n", False),
        ("directive", "ntasks-overflow", lambda k: SBATCH_OK + "#SBATCH -n 2147483648\necho hi\n", False),
        ("directive", "nice-huge", lambda k: SBATCH_OK + "#SBATCH --nice=99999999999999999999\necho hi\n", False),
        ("directive", "priority-huge", lambda k: SBATCH_OK + "#SBATCH --priority=99999999999999999999\necho hi\n",
         False),
        ("directive", "bundled-short", lambda k: SBATCH_OK + "#SBATCH -HkON3\necho hi\n", False),
        ("directive", "help", lambda k: SBATCH_OK + "#SBATCH --help\necho hi\n", False),
        ("directive", "overlong-value", lambda k: SBATCH_OK + "#SBATCH --comment=" + "a" * 200_000 + "\necho hi\n",
         True),
        ("directive", "many-lines", lambda k: "#!/bin/bash\n" + "#SBATCH --comment=x\n" * 200_000 + "echo hi\n",
         True),
        ("directive", "many-quotes", lambda k: "#!/bin/bash\n#SBATCH " + "'a' " * 200_000 + "\necho hi\n", True),
        # bodies and shebangs
        ("shebang", "relative", lambda k: "#!bash\n#SBATCH -N 1\necho hi\n", False),
        ("shebang", "payload-argument", lambda k: f"#!/bin/bash $(touch {k})\n#SBATCH -N 1\necho hi\n", False),
        ("shebang", "env-python", lambda k: "#!/usr/bin/env python3\n#SBATCH -N 1\nprint('hi')\n", False),
        ("shebang", "no-shebang", lambda k: "#SBATCH -N 1\necho hi\n", False),
        ("shebang", "only", lambda k: "#!/bin/bash", False),
        ("shebang", "only-newline", lambda k: "#!/bin/bash\n", False),
        ("body", "exec-form", lambda k: "#!/bin/bash\n#SBATCH -N 2\nexport A='$(x)'\nexec python3 train.py "
         "'$(y)'\n", False),
        ("body", "exec-form-newline", lambda k: "#!/bin/bash\n#SBATCH -N 2\nexport A='a\n#SBATCH --uid=0'\n"
         "exec python3 train.py\n", False),
        ("body", "sbatch-after-command", lambda k: "#!/bin/bash\necho hi\n#SBATCH --uid=0\n", False),
        ("body", "long-body", lambda k: "#!/bin/bash\n#SBATCH -N 1\n" + "echo hi\n" * 300_000, True),
        ("body", "binary-body", lambda k: b"#!/bin/bash\n#SBATCH -N 1\n\xff\xfe\x00\x01\n", False),
        ("body", "latin1", lambda k: "#!/bin/bash\n#SBATCH -J caf\xe9\necho hi\n".encode("latin-1"), False),
        ("body", "jobname-from-file", lambda k: "#!/bin/bash\n#SBATCH -N 1\necho hi\n", False),
    ]
    for field_name, payload, make, heavy in scripts:
        yield field_name, payload, make(m(n)), heavy
        n += 1


def flag_cases(m: Callable[[int], str], start: int) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    n = start
    flags: list[tuple[str, Callable[[str], tuple[str, ...]]]] = [
        ("uid", lambda k: ("--uid=0",)),
        ("gid", lambda k: ("--gid", "0")),
        ("get-user-env", lambda k: ("--get-user-env",)),
        ("partition-newline", lambda k: ("-p", f"a\n#SBATCH --uid=0\ntouch {k} #")),
        ("jobname-cmdsubst", lambda k: ("-J", f"$(touch {k})")),
        ("comment-quote", lambda k: ("--comment", 'a" --uid=0 "b')),
        ("comment-cr", lambda k: ("--comment", "a\r--uid=0")),
        ("export-cmdsubst", lambda k: (f"--export=ALL,A=$(touch {k})",)),
        ("output-semicolon", lambda k: ("--", "-o", f"a; touch {k} #")),  # sbatch's -o: after -- (hpcbridge's is --output)
        ("chdir-backtick", lambda k: ("--chdir", f"/tmp/`touch {k}`")),
        ("account-u2028", lambda k: ("-A", f"a\u2028touch {k} #")),
        ("unknown", lambda k: ("--no-such-option",)),
        ("non-option", lambda k: ("touch", k)),
        ("overlong", lambda k: ("--comment", "a" * 200_000)),
        ("surrogate", lambda k: ("--comment", "a\udcffb")),
        ("wrap", lambda k: ("--wrap", f"touch {k}")),
        ("time-huge", lambda k: ("-t", "9" * 50)),
        ("nodes-range", lambda k: ("-N", "2-1")),
    ]
    for payload, make in flags:
        yield "sbatch-flags", payload, make(m(n))
        n += 1


def _binary_files() -> Iterator[tuple[str, bytes, bool]]:
    rng = random.Random(SEED)
    yield "empty", b"", False
    yield "whitespace", b"   \n\t\n", False
    yield "nul", b"\x00" * 64, False
    yield "random-bytes", bytes(rng.randrange(256) for _ in range(4096)), False
    yield "utf16", _yaml_trainjob().encode("utf-16"), False
    yield "latin1", _yaml_trainjob().replace("fz", "f\xe9").encode("latin-1"), False
    yield "gzip-magic", b"\x1f\x8b\x08\x00" + bytes(rng.randrange(256) for _ in range(512)), False
    yield "elf-magic", b"\x7fELF\x02\x01\x01" + b"\x00" * 100, False
    yield "shebang-binary", b"#!\xff\xfe\n", False
    yield "huge-file", b"# " + b"x" * 50_000_000 + b"\n", True
    yield "huge-line-yaml", b"a: " + b"b" * 30_000_000 + b"\n", True


# --- the catalogue -----------------------------------------------------------------------------------------


@dataclass
class _Builder:
    cases: list[Case] = field(default_factory=list)

    @property
    def next_index(self) -> int:
        return len(self.cases)

    def add(self, **kwargs: Any) -> None:
        self.cases.append(Case(index=self.next_index, **kwargs))


def generate(seed: int = SEED) -> list[Case]:
    """Every hostile input, in a fixed order; the same seed gives the same cases, byte for byte."""
    rng = random.Random(seed)
    out = _Builder()

    def payloads(full: bool) -> dict[str, Callable[[str], str]]:
        return ALL_PAYLOADS if full else PAYLOADS

    # TrainJob fields × payloads
    for field_name, (setter, full) in TRAINJOB_FIELDS.items():
        for payload_name, payload in payloads(full).items():
            index = out.next_index
            runtime = rng.choice(RUNTIMES)
            doc = base_trainjob(runtime)
            setter(doc, payload(marker_name(index)))
            documents = [doc] + ([PLAIN_RUNTIME] if runtime == "fz-plain" else [])
            out.add(kind="trainjob", field=field_name, payload=payload_name, data=dump(*documents),
                    heavy=payload_name == "overlong" and rng.random() < 0.2, stdin=index % 11 == 5)

    # inline runtime fields × payloads
    for field_name, (setter, runtime_doc) in RUNTIME_FIELDS.items():
        for payload_name, payload in PAYLOADS.items():
            index = out.next_index
            runtime = copy.deepcopy(runtime_doc)
            doc = base_trainjob(runtime["metadata"]["name"])
            setter(doc, runtime, payload(marker_name(index)))
            out.add(kind="runtime", field=field_name, payload=payload_name, data=dump(runtime, doc),
                    stdin=index % 11 == 5)

    # cluster config fields × cluster types × payloads
    for field_name, (setter, kinds) in CONFIG_FIELDS.items():
        for payload_name, payload in PAYLOADS.items():
            index = out.next_index
            kind = kinds[index % len(kinds)]
            cluster = cluster_doc(kind)
            doc = base_trainjob(rng.choice(RUNTIMES[:3]))
            doc["metadata"]["annotations"]["hpcbridge.io/cluster"] = CLUSTER
            setter(cluster, doc, payload(marker_name(index)))
            out.add(kind="config", field=f"{kind}:{field_name}", payload=payload_name, data=dump(doc),
                    config=dump(cluster))
    # a few hostile config files that are not even valid clusters
    for name, config in (("empty", b""), ("binary", b"\xff\xfe\x00garbage"), ("trainjob", dump(base_trainjob())),
                         ("billion-laughs", (b"a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [" + b"*a," * 9 + b"*a]\nc: &c ["
                                             + b"*b," * 9 + b"*b]\nd: &d [" + b"*c," * 9 + b"*c]\n")),
                         ("duplicate-local", dump(cluster_doc("slurm", "local"))),
                         ("deep", b"[" * 100_000 + b"]" * 100_000)):
        doc = base_trainjob()
        out.add(kind="config", field="file", payload=name, data=dump(doc), config=config,
                heavy=name in ("billion-laughs", "deep"))

    # wrong types and huge numbers
    for field_name, name, document, heavy in type_cases():
        if isinstance(document, list):  # a config
            doc = base_trainjob()
            doc["metadata"]["annotations"]["hpcbridge.io/cluster"] = CLUSTER
            out.add(kind="types", field=field_name, payload=name, data=dump(doc), config=dump(*document))
        else:
            out.add(kind="types", field=field_name, payload=name, data=dump(document), heavy=heavy)

    # YAML structures
    for field_name, name, data, heavy in yaml_cases():
        out.add(kind="yaml", field=field_name, payload=name,
                data=data.replace(b"touch M", f"touch {marker_name(out.next_index)}".encode()), heavy=heavy)

    # files
    for name, data, heavy in _binary_files():
        out.add(kind="file", field="file", payload=name, data=data, heavy=heavy, stdin=name == "random-bytes")

    # batch scripts
    start = out.next_index
    for field_name, name, text, heavy in sbatch_cases(marker_name, start):
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        marker = marker_name(out.next_index)
        out.add(kind="sbatch", field=field_name, payload=name, data=data, heavy=heavy, stdin=name == "exec-form",
                filename=f"job $(touch {marker}).sbatch" if name == "jobname-from-file" else "job.sbatch")

    # sbatch flags over a script and over a TrainJob
    start = out.next_index
    for i, (field_name, name, flags) in enumerate(flag_cases(marker_name, start)):
        data = (SBATCH_OK + "echo hi\n").encode() if i % 2 == 0 else dump(base_trainjob())
        out.add(kind="flags", field=field_name, payload=name, data=data, flags=flags, commands=FLAG_COMMANDS,
                heavy=name == "surrogate")
    return out.cases


def subset(cases: list[Case], every: int = 4) -> list[Case]:
    """A deterministic slice for the fast suite: every *every*-th case of the big field × payload kinds; the
    small kinds, where each case is its own structure, more densely (batch scripts and YAML structures every
    ``every // 3``-th, flags and files all)."""
    step = {"sbatch": max(1, every // 3), "yaml": max(1, every // 3), "flags": 1, "file": 1}
    chosen: list[Case] = []
    seen: dict[str, int] = {}
    for case in cases:
        position = seen.get(case.kind, 0)
        seen[case.kind] = position + 1
        if position % step.get(case.kind, every) == 0:
            chosen.append(case)
    return chosen
