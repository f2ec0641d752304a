"""An sbatch request ⇄ a TrainJob: ``to_trainjob`` converts a script (or flags), ``apply_flags`` lays flags
over a TrainJob, ``sbatch_runtime`` is the runtime converted scripts reference.

Converting maps what a TrainJob has fields for (nodes, tasks per node, CPUs, memory, GPUs, time limit, name,
hold) and the scheduler knobs hpc-bridge has annotations for; every other option travels verbatim as an
``hpcbridge.io/sbatch.<option>`` annotation, which the Slurm renderer writes after its own directives, so sbatch's
last-wins rule makes the verbatim value the one that counts. The script body runs unchanged through its own
interpreter (see ``body.script_command``). Writing a batch script is the Slurm renderer's job
(``bridge.adapters.slurm.render``), from the resolved plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from pydantic import ValidationError

from bridge.annotations import (
    EXCLUSIVE_ANNOTATION,
    PREFIX,
    SBATCH_PASSTHROUGH_PREFIX,
    SLURM_GPUS_ANNOTATION,
    SLURM_JOB_NAME_ANNOTATION,
    SLURM_LAYOUT_ANNOTATION,
)
from bridge.api.cluster import BridgeCluster, builtin_local_cluster
from bridge.api.loader import invalid_from_validation
from bridge.api.runtime import ClusterTrainingRuntime
from bridge.api.trainjob import API_VERSION, MANAGED_BY_BRIDGE, RFC1035_LABEL, TrainJob
from bridge.convert.sbatch.body import parse_exec_body, script_command
from bridge.errors import InvalidSpec
from bridge.plan import (
    backend_options,
    parse_slurm_layout,
    slurm_layout_counts,
    slurm_layout_text,
)
from bridge.sbatch.directives import Directive, SbatchRequest
from bridge.sbatch.script import bridge_directives
from bridge.sbatch.values import (
    BadValue,
    gpu_counts,
    gres_items,
    node_range,
    positive_int,
    size_mb,
    time_seconds,
)

_T = TypeVar("_T")

#: the ClusterTrainingRuntime converted scripts reference (see ``sbatch_runtime``)
SBATCH_RUNTIME = "sbatch-script"
GPU_RESOURCE = "nvidia.com/gpu"
#: options with a TrainJob field or an hpc-bridge annotation (everything else is passed through verbatim)
_KNOB_OPTIONS = {"partition": "partition", "account": "account", "qos": "qos", "constraint": "constraint",
                 "array": "array", "dependency": "dependency", "output": "output", "error": "error",
                 "chdir": "workdir"}


def dns_label(name: str) -> str:
    """A TrainJob name from a Slurm job name: RFC 1035 label (lowercase, letters/digits/'-'), at most 63."""
    if len(name) <= 63 and RFC1035_LABEL.fullmatch(name):
        return name
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not label:
        return "sbatch-job"
    if not label[0].isalpha():
        label = f"job-{label}"
    return label[:63].rstrip("-")


def default_job_name(source: str) -> str:
    """sbatch names a job after its script file (``sbatch`` when read from stdin)."""
    if not source or source.startswith("<") or source == "-":
        return "sbatch"
    return source.rstrip("/").rsplit("/", 1)[-1]


@cache
def _check_cluster() -> BridgeCluster:
    return builtin_local_cluster()


def _plan_problem(key: str, value: str) -> str | None:
    """What the planner would say about this annotation (None: accepted); keeps the two from drifting."""
    try:
        backend_options({key: value}, _check_cluster(), "default")
    except InvalidSpec as exc:
        return exc.problem
    return None


def _quantity_mib(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


class _Conversion:
    """The state of one request → TrainJob conversion: annotations, report, options already accounted for."""

    def __init__(self, request: SbatchRequest, uncarried: list[InvalidSpec] | None = None) -> None:
        self.request = request
        self.annotations: dict[str, str] = {}
        self.report: list[str] = list(request.notes)
        self.handled: set[str] = set()
        #: when a list: options whose value no annotation can carry are collected here instead of refused
        self.uncarried = uncarried

    def fail(self, option: str, value: object, problem: str) -> InvalidSpec:
        return InvalidSpec(self.request.where(option), value, problem, source=self.request.source)

    def value(self, option: str, parse: Callable[[str], _T]) -> _T | None:
        """The option's value through *parse*, or None when absent; marks the option handled."""
        self.handled.add(option)
        value = self.request.get(option)
        if value is None:
            return None
        try:
            return parse(value)
        except BadValue as exc:
            raise self.fail(option, value, str(exc)) from None

    def annotate(self, option: str, key: str, value: str) -> None:
        problem = _plan_problem(key, value)
        if problem:
            error = self.fail(option, value, f"cannot be carried to Slurm: {problem}")
            if self.uncarried is None:
                raise error
            self.uncarried.append(error)
            return
        self.annotations[key] = value

    def passthrough(self, option: str, value: str | None, why: str = "no TrainJob field",
                    target: str | None = None) -> None:
        """Carry --option verbatim (flags as "true") in ``hpcbridge.io/sbatch.<target or option>``."""
        target = target or option
        key = f"{SBATCH_PASSTHROUGH_PREFIX}{target}"
        self.annotate(option, key, "true" if value is None else value)
        if key not in self.annotations:
            return  # not carried (see ``uncarried``): nothing to report
        given = self.request.options.get(option)
        if target != option and given is not None:
            shown = given.text()
        else:
            shown = f"--{option}" if value is None else f"--{option}={value}"
        self.report.append(f"{shown}: {why}; passed through verbatim as {key}")

    def exclusive(self, options: Sequence[str], problem: str) -> None:
        present = [name for name in options if name in self.request]
        if len(present) > 1:
            raise self.fail(present[-1], [self.request.options[n].text() for n in present], problem)


def to_trainjob(request: SbatchRequest, script_body: str | None = None, name: str | None = None,
                runtime: str = SBATCH_RUNTIME, uncarried: list[InvalidSpec] | None = None,
                ) -> tuple[TrainJob, list[str]]:
    """A TrainJob that runs *script_body* (default: the request's body) with the request's options.

    Returns the TrainJob and a report with one line per renamed, derived or passed-through option. Raises
    InvalidSpec naming the directive for anything sbatch or hpc-bridge would refuse. Given an *uncarried*
    list, an option whose value sbatch takes but no TrainJob annotation can carry (quotes, backslashes) is
    left out and listed there instead: the script can still run as it is, on Slurm.
    """
    body = _convertible_body(request, script_body)
    conv = _Conversion(request, uncarried)
    conv.exclusive(("mem", "mem-per-cpu", "mem-per-gpu"), "--mem, --mem-per-cpu and --mem-per-gpu are mutually "
                   "exclusive")
    conv.exclusive(("cpus-per-task", "cpus-per-gpu"), "--cpus-per-gpu is mutually exclusive with --cpus-per-task")
    conv.exclusive(("verbose", "quiet"), "don't specify both --verbose (-v) and --quiet (-Q)")

    name = _name(conv, name)
    trainer: dict[str, Any] = {}
    image = bridge_directives(body, request.source).get("image")
    if image:
        trainer["image"] = image
    nodes_fixed, tasks = _layout(conv, trainer, own_layout=runtime == SBATCH_RUNTIME)
    requests = _resource_requests(conv, nodes_fixed, tasks)
    if requests:
        trainer["resourcesPerNode"] = {"requests": requests}
    spec = _time_and_hold(conv)
    _knobs(conv)
    for option, directive in request.options.items():
        if option not in conv.handled:
            conv.passthrough(option, directive.value)
    trainer.update(_trainer_command(body, name))
    spec.update({"runtimeRef": {"name": runtime}, "managedBy": MANAGED_BY_BRIDGE, "trainer": trainer})
    metadata: dict[str, Any] = {"name": name}
    if conv.annotations:
        metadata["annotations"] = dict(sorted(conv.annotations.items()))
    document = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
    try:
        return TrainJob.model_validate(document), conv.report
    except ValidationError as exc:
        raise invalid_from_validation(exc, source=request.source) from None


def _convertible_body(request: SbatchRequest, script_body: str | None) -> str:
    """The body to run, once the request is one a TrainJob can say (one component, a body)."""
    body = script_body if script_body is not None else request.body
    if request.components:
        raise InvalidSpec(f"#SBATCH line {request.hetjob_line}", "hetjob",
                          f"a heterogeneous job ({1 + len(request.components)} components) has no TrainJob form; "
                          "it runs only on a Slurm cluster, as the script it is (hpcbridge submit FILE --cluster "
                          "<slurm cluster>)", source=request.source)
    if body is None:
        raise InvalidSpec("script", None, "no script body to run", source=request.source)
    return body


def _resource_requests(conv: _Conversion, nodes_fixed: int | None, tasks: int | None) -> dict[str, str]:
    """resourcesPerNode.requests from --cpus-per-task (times the tasks per node), --mem and the GPU options."""
    requests: dict[str, str] = {}
    cpus = conv.value("cpus-per-task", positive_int)
    if cpus is not None:
        requests["cpu"] = str(cpus * (tasks or 1))
    mem = conv.value("mem", size_mb)
    if mem:
        requests["memory"] = _quantity_mib(mem)
    elif mem == 0:
        conv.passthrough("mem", conv.request.get("mem"), "--mem=0 asks for all of a node's memory, not a quantity")
    gpus = _gpus_per_node(conv, nodes_fixed)
    if gpus:
        requests[GPU_RESOURCE] = str(gpus)
    return requests


def _time_and_hold(conv: _Conversion) -> dict[str, Any]:
    """The spec's activeDeadlineSeconds (--time) and suspend (--hold)."""
    request, spec = conv.request, {}
    if "time" in request:
        seconds = conv.value("time", time_seconds)
        if seconds is None:
            conv.passthrough("time", request.get("time"), "no time limit, which is not a deadline")
        else:
            spec["activeDeadlineSeconds"] = seconds
    conv.handled.add("hold")
    if "hold" in request:
        spec["suspend"] = True
        conv.report.append("--hold: the TrainJob is created suspended (spec.suspend: true)")
    return spec


def _knobs(conv: _Conversion) -> None:
    """The scheduler knobs hpc-bridge has annotations for (``_KNOB_OPTIONS``, whole-node --exclusive)."""
    request = conv.request
    for option, knob in _KNOB_OPTIONS.items():
        conv.handled.add(option)
        value = request.get(option)
        if value is None:
            continue
        key = f"{PREFIX}{knob}"
        problem = _plan_problem(key, value)
        if problem is None:
            conv.annotations[key] = value
        else:
            conv.passthrough(option, value, f"not accepted as {key} ({problem})")
    conv.handled.add("exclusive")
    if "exclusive" in request:
        value = request.get("exclusive")
        if value is None or value.lower() == "exclusive":
            conv.annotations[EXCLUSIVE_ANNOTATION] = "true"
        else:
            conv.passthrough("exclusive", value, "only whole-node --exclusive has an annotation")


def _trainer_command(body: str, name: str) -> dict[str, Any]:
    """The trainer's command (and env) that runs *body*: the one command a script only execs, else the script."""
    exec_form = parse_exec_body(body)
    if exec_form is None:
        return {"command": script_command(body, name)}
    # a script that only execs one command (``exec python3 train.py``) is that command
    command, env = exec_form
    return {"command": command, **({"env": [{"name": n, "value": v} for n, v in env]} if env else {})}


def _layout(conv: _Conversion, trainer: dict[str, Any], own_layout: bool) -> tuple[int | None, int | None]:
    """numNodes and numProcPerNode from --nodes, --ntasks and --ntasks-per-node, and the script's own layout
    for Slurm (``hpcbridge.io/slurm-layout``): which of --nodes and --ntasks-per-node it gave, so that on Slurm
    the job asks for exactly those and Slurm picks the rest, as it did for the script. numNodes is written only
    where the script fixes the count (``-N``, a range's minimum, or ``-n 16 --ntasks-per-node=4``: 4 nodes).
    Only a script that runs as a batch script (*own_layout*: the sbatch-script runtime) keeps its layout; under
    an ML runtime hpc-bridge lays out the job (one launcher per node).
    Returns the fixed node count (None: a range, or Slurm's to pick) and the tasks per node (None: not given)."""
    request = conv.request
    nodes = conv.value("nodes", node_range)
    per_node = conv.value("ntasks-per-node", positive_int)
    ntasks = conv.value("ntasks", positive_int)
    count, procs = slurm_layout_counts(nodes[0] if nodes else None, ntasks, per_node)
    nodes_fixed = nodes[0] if nodes is not None and nodes[0] == nodes[1] else None
    if nodes is not None or (ntasks is not None and per_node is not None):
        trainer["numNodes"] = count
    if nodes is not None and nodes_fixed is None:
        conv.passthrough("nodes", request.get("nodes"), f"a node range; numNodes is its minimum {count}")
    elif nodes is None and "numNodes" in trainer:
        slurm = "; on Slurm no --nodes is asked, Slurm places them as for the script" if own_layout else ""
        conv.report.append(f"--ntasks={ntasks} --ntasks-per-node={per_node}: numNodes {count}, the fewest nodes "
                           f"that hold them{slurm}")
    tasks = procs if per_node is not None or ntasks is not None else None
    if tasks is not None:
        trainer["numProcPerNode"] = tasks
    if ntasks is not None:
        # a total, kept verbatim: with it Slurm reads --ntasks-per-node as a maximum
        if per_node is not None:
            how = f"numProcPerNode {tasks} is at most per node, on {count} node(s)"
        elif nodes is not None:
            how = f"numProcPerNode {tasks}, the {ntasks} tasks spread over {count} node(s)"
        elif own_layout:
            how = (f"numProcPerNode {tasks} on one node where the TrainJob runs off Slurm; on Slurm no --nodes is "
                   "asked, Slurm places the tasks as for the script")
        else:
            how = f"numProcPerNode {tasks} on one node"
        conv.passthrough("ntasks", request.get("ntasks"), f"a total task count; {how}")
    if own_layout:
        given = [option for option, value in (("nodes", nodes), ("ntasks-per-node", per_node)) if value is not None]
        conv.annotations[SLURM_LAYOUT_ANNOTATION] = slurm_layout_text(given)
    return nodes_fixed, tasks


def _name(conv: _Conversion, name: str | None) -> str:
    conv.handled.add("job-name")
    job_name = conv.request.get("job-name")
    wanted = job_name if job_name is not None else default_job_name(conv.request.source)
    label = name if name is not None else dns_label(wanted)
    if name is None and label != wanted:
        conv.report.append(f"job name {wanted!r} is not an RFC 1035 label; the TrainJob is named {label!r}")
    if wanted != label and (job_name is not None or name is None):
        # Slurm keeps the name sbatch would give (squeue --name, singleton dependencies, %x in file names)
        conv.annotate("job-name", SLURM_JOB_NAME_ANNOTATION, wanted)
        conv.report.append(f"job name {wanted!r}: kept for Slurm as {SLURM_JOB_NAME_ANNOTATION}")
    return label


def _gpus_per_node(conv: _Conversion, nodes_fixed: int | None) -> int | None:
    """GPUs per node from --gpus-per-node, --gres=gpu… or --gpus. The spelling is kept for Slurm
    (``hpcbridge.io/slurm-gpus``), whose job environment differs by spelling; what a count cannot say
    (other generic resources, a job-wide count with no per-node share) goes verbatim."""
    request = conv.request
    per_node: int | None = None
    spelling: str | None = None
    items = conv.value("gpus-per-node", gpu_counts)
    if items is not None:
        per_node = sum(count for _, count in items)
        if len(items) > 1 or items[0][0] is not None:
            spelling = f"gpus-per-node={request.get('gpus-per-node')}"
    gres = conv.value("gres", gres_items)
    if gres is not None:
        gpus = [item for item in gres if item.name == "gpu"]
        others = [item for item in gres if item.name != "gpu"]
        if gpus and items is not None:
            raise conv.fail("gres", [request.options[n].text() for n in ("gpus-per-node", "gres")],
                            "give GPUs per node once: --gres=gpu:… or --gpus-per-node")
        if gpus:
            if not all(item.count.isdigit() for item in gpus):
                raise conv.fail("gres", request.get("gres"), "GPU counts are whole numbers")
            per_node = sum(int(item.count) for item in gpus)
            spelling = f"gres={request.get('gres')}"
        if others or not gres:
            # other generic resources mean nothing off Slurm: the whole option goes verbatim (refused elsewhere)
            spelling = None
            conv.passthrough("gres", request.get("gres"), "generic resources other than GPUs have no TrainJob field")
    total_items = conv.value("gpus", gpu_counts)
    if total_items is not None:
        total = sum(count for _, count in total_items)
        if per_node is None and nodes_fixed is not None and total % nodes_fixed == 0:
            per_node = total // nodes_fixed
            spelling = f"gpus={request.get('gpus')}"
        else:
            conv.passthrough("gpus", request.get("gpus"),
                             "a job-wide GPU count with no fixed per-node share (no per-node GPU request)")
    if spelling is not None:
        conv.annotate("gres" if spelling.startswith("gres") else spelling.split("=")[0],
                      SLURM_GPUS_ANNOTATION, spelling)
        conv.report.append(f"--{spelling}: {GPU_RESOURCE}: {per_node} per node; Slurm keeps the spelling "
                           f"({SLURM_GPUS_ANNOTATION})")
    return per_node


def sbatch_runtime() -> ClusterTrainingRuntime:
    """The runtime converted scripts reference (built in): no ML policy, framework label ``sbatch``, so the
    planner runs the body once on the first node, as sbatch does."""
    from bridge.api.catalog import builtin_runtimes

    return next(r for r in builtin_runtimes() if r.name == SBATCH_RUNTIME and isinstance(r, ClusterTrainingRuntime))

#: the flags that make up a job's node and task layout, and the report lines about them
_LAYOUT_FLAGS = ("nodes", "ntasks", "ntasks-per-node")
_LAYOUT_NOTES = tuple(f"--{option}" for option in _LAYOUT_FLAGS)


def _layout_request(trainjob: TrainJob, layout: str, flags: SbatchRequest) -> SbatchRequest:
    """A converted TrainJob's --nodes, --ntasks and --ntasks-per-node as the script gave them (its layout
    annotation, fields and pass-through annotations), with *flags* over them."""
    where = f"metadata.annotations[{SLURM_LAYOUT_ANNOTATION}]"
    given = parse_slurm_layout(layout, where)
    annotations = trainjob.metadata.annotations or {}
    trainer = trainjob.spec.trainer
    options: dict[str, Directive] = {}
    for option in _LAYOUT_FLAGS:
        key = f"{SBATCH_PASSTHROUGH_PREFIX}{option}"
        if key in annotations:
            options[option] = Directive(option, annotations[key], f"metadata.annotations[{key}]")
    if "nodes" in given and "nodes" not in options:
        options["nodes"] = Directive("nodes", str(trainer.num_nodes if trainer and trainer.num_nodes else 1),
                                     "spec.trainer.numNodes")
    if "ntasks-per-node" in given:
        count = trainer.num_proc_per_node if trainer and trainer.num_proc_per_node else 1
        options["ntasks-per-node"] = Directive("ntasks-per-node", str(count), "spec.trainer.numProcPerNode")
    for option in _LAYOUT_FLAGS:
        if option in flags:
            options[option] = flags.options[option]
    return SbatchRequest(options, flags.source)


def apply_flags(trainjob: TrainJob, flags: SbatchRequest) -> tuple[TrainJob, list[str]]:
    """sbatch command-line flags laid over a TrainJob, as ``hpcbridge submit job.yaml -N 4 -t 1:00:00`` wants:
    each flag replaces the field it maps to; the command and the runtime stay the TrainJob's own."""
    fragment, report = to_trainjob(flags, script_body="#!/bin/sh\n", name=trainjob.name)
    doc = trainjob.to_wire()
    frag = fragment.to_wire()
    trainer = doc["spec"].setdefault("trainer", {})
    frag_trainer = frag["spec"].get("trainer", {})
    annotations = doc["metadata"].setdefault("annotations", {})
    frag_annotations = dict(frag["metadata"].get("annotations") or {})
    # the layout annotation says what a converted script gave; flags that give none leave it as it is
    frag_annotations.pop(SLURM_LAYOUT_ANNOTATION, None)
    own_layout = annotations.get(SLURM_LAYOUT_ANNOTATION)
    if own_layout is not None and any(option in flags for option in _LAYOUT_FLAGS):
        # a converted script's layout with the flags over it, derived again as for ``sbatch FLAGS script``
        relaid, relaid_report = to_trainjob(_layout_request(trainjob, own_layout, flags), script_body="#!/bin/sh\n",
                                            name=trainjob.name)
        relaid_doc = relaid.to_wire()
        for key in ("numNodes", "numProcPerNode"):
            trainer.pop(key, None)
            if key in relaid_doc["spec"].get("trainer", {}):
                trainer[key] = relaid_doc["spec"]["trainer"][key]
        relaid_annotations = relaid_doc["metadata"].get("annotations") or {}
        for key in (SLURM_LAYOUT_ANNOTATION, *(f"{SBATCH_PASSTHROUGH_PREFIX}{o}" for o in _LAYOUT_FLAGS)):
            frag_annotations.pop(key, None)
            annotations.pop(key, None)
            if key in relaid_annotations:
                annotations[key] = relaid_annotations[key]
        report = [line for line in report if not line.startswith(_LAYOUT_NOTES)]
        report += [line for line in relaid_report if line.startswith(_LAYOUT_NOTES)]
    else:
        for key in ("numNodes", "numProcPerNode"):
            if key in frag_trainer:
                trainer[key] = frag_trainer[key]
    if "resourcesPerNode" in frag_trainer:
        resources = trainer.setdefault("resourcesPerNode", {})
        for kind, values in frag_trainer["resourcesPerNode"].items():
            resources.setdefault(kind, {}).update(values)
    for key in ("activeDeadlineSeconds", "suspend"):
        if key in frag["spec"]:
            doc["spec"][key] = frag["spec"][key]
    annotations.update({k: v for k, v in frag_annotations.items() if k.startswith(PREFIX)})
    if "job-name" in flags:
        doc["metadata"]["name"] = frag["metadata"]["name"]
    return TrainJob.model_validate(doc), report
