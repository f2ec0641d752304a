"""YAML ⇄ wire objects: multi-document load with one-line errors naming the field path, lossless dump."""

from __future__ import annotations

import math
import os
import types as types_module
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from bridge.api.cluster import BridgeCluster
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import TrainJob
from bridge.errors import InvalidSpec, did_you_mean

# libyaml's loader when PyYAML was built with it: same safe semantics, several times faster
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Limits on what one input may cost (README "Security"). Kubernetes stores objects of at most ~1.5 MiB and
# takes requests of at most 3 MiB; Slurm's default max_script_size is 4 MiB. Nothing hpc-bridge reads needs
# more, and nothing below these bounds takes more than a second or a few hundred MB.
#: bytes of one input file (YAML, batch script or cluster config) or of stdin
MAX_INPUT_BYTES = 4 * 2**20
#: nesting of mappings and sequences in one document (a pod template is about 20 deep)
MAX_DEPTH = 64
#: values (scalars and collections) of one input, and of one document once YAML aliases are expanded: what
#: validation and rendering walk; a runtime is about 100, a large pod template a few thousand
MAX_NODES = 100_000
#: alias references (``*name``) in one document; Kubernetes objects rarely use any
MAX_ALIASES = 100
_INT64 = 2**63

Resource = TrainJob | TrainingRuntime | ClusterTrainingRuntime | BridgeCluster

KINDS: dict[tuple[str, str], type[BaseModel]] = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): TrainJob,
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): TrainingRuntime,
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): ClusterTrainingRuntime,
    ("hpcbridge.io/v1alpha1", "BridgeCluster"): BridgeCluster,
}

# pydantic's wording → ours, for the error types users actually hit
_PROBLEMS = {
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
    "literal_error": None,
}
# loc entries pydantic adds for union members and validators; they are not part of the field path
_NOT_FIELDS = {"str", "int", "float", "bool", "list", "dict", "none"}


def format_loc(loc: Iterable[Any]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and (part in _NOT_FIELDS or part.startswith(("function-", "literal["))):
            continue
        else:
            path += f".{_key_text(part)}" if path else _key_text(part)
    return _short(path)


#: fields older Kubeflow Trainer releases (and their docs) had, with what replaced them: a bare "unknown
#: field" would send the user searching (each message names the release that made the change)
STALE_FIELDS: dict[str, str] = {
    "spec.mlPolicy.torch.numProcPerNode": "removed in Trainer v2.2: give spec.trainer.numProcPerNode on the "
                                          "TrainJob (an integer; left out, torch runs one process per GPU, else "
                                          "per CPU)",
    "spec.mlPolicy.torch.elasticPolicy": "removed in Trainer v2.2 (elastic training was never implemented)",
    "spec.podSpecOverrides": "renamed podTemplateOverrides in Trainer v2.1, then replaced by spec.runtimePatches "
                             "in v2.2",
    "spec.podTemplateOverrides": "replaced by spec.runtimePatches in Trainer v2.2 (JobSet, Job and pod metadata "
                                 "and a restricted pod spec, per manager)",
    "spec.labels": "removed in Trainer v2.2: JobSet labels go in spec.runtimePatches[].trainingRuntimeSpec."
                   "template.metadata.labels",
    "spec.annotations": "removed in Trainer v2.2: JobSet annotations go in spec.runtimePatches[]."
                        "trainingRuntimeSpec.template.metadata.annotations",
}


def invalid_from_validation(exc: ValidationError, source: str | None = None, prefix: str = "",
                            model: type[BaseModel] | None = None) -> InvalidSpec:
    """The first validation error as an InvalidSpec; the count of the others is appended. With the *model*
    validated, an unknown field is told the closest field the model has there."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    path = format_loc(first["loc"])
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    problem = _PROBLEMS.get(first["type"]) or first["msg"]
    if first["type"] == "extra_forbidden" and path in STALE_FIELDS:
        problem = f"unknown field: {STALE_FIELDS[path]}"
    elif first["type"] == "extra_forbidden" and model is not None and first["loc"]:
        loc = tuple(first["loc"])
        hint = did_you_mean(str(loc[-1]), _fields_at(model, loc[:-1]))
        problem += f"; {hint}" if hint else ""
    elif path == "spec.trainer.numProcPerNode" and isinstance(first.get("input"), str):
        problem = ("an integer since Trainer v2.2 (\"auto\", \"cpu\" and \"gpu\" were v2.0–v2.1 values): leave it out "
                   "for one process per GPU, else per CPU")
    if problem.startswith("Value error, "):
        problem = problem[len("Value error, "):]
    if len(errors) > 1:
        problem += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    value = None if first["type"] == "missing" else first.get("input")
    return InvalidSpec(path, value, problem, source=source)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> set[str]:
    """The wire names of the fields *model* has at *loc* (a validation error's path, its union and validator
    entries included): those of every model the path can lead to, through optionals, unions, lists and maps."""
    types: list[Any] = [model]
    for part in loc:
        if isinstance(part, str) and (part in _NOT_FIELDS or part.startswith(("function-", "literal["))):
            continue
        following: list[Any] = []
        for kind in _unwrapped(types):
            if isinstance(part, int) and typing.get_origin(kind) in (list, tuple, Sequence):
                following += typing.get_args(kind)[:1]
            elif typing.get_origin(kind) in (dict, Mapping):
                following += typing.get_args(kind)[1:2]
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                following += [info.annotation for name, info in kind.model_fields.items()
                              if part in (name, info.alias)]
        types = following
    return {info.alias or name for kind in _unwrapped(types)
            if isinstance(kind, type) and issubclass(kind, BaseModel) for name, info in kind.model_fields.items()}


def _unwrapped(types: Iterable[Any]) -> list[Any]:
    """*types* with optionals and unions opened into their members."""
    opened: list[Any] = []
    for kind in types:
        if typing.get_origin(kind) in (typing.Union, types_module.UnionType):
            opened += _unwrapped(arg for arg in typing.get_args(kind) if arg is not type(None))
        else:
            opened.append(kind)
    return opened


def _short(path: str, limit: int = 120) -> str:
    return path if len(path) <= limit else f"{path[:limit - 1]}…"


def _key_text(key: Any) -> str:
    """A mapping key as it appears in a field path: printable and short, whatever the input holds."""
    text = str(key)
    if not text.isprintable():
        text = repr(text)
    return text if len(text) <= 64 else f"{text[:61]}..."


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{_key_text(key)}" if path else _key_text(key)


def check_data(data: Any, source: str | None = None) -> None:
    """What every decoded document must be before validation, whatever it came from (YAML, JSON, the API
    server): a tree (no cycles) of at most MAX_DEPTH levels and MAX_NODES nodes, whose mapping keys are
    strings, whose numbers are finite 64-bit values, and whose strings are valid Unicode without NUL (no
    backend can carry one: exec arguments and the environment are C strings)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    active: set[int] = set()
    exits: list[tuple[int, int]] = []  # (stack length when the container was entered, its id)
    nodes = 0
    while stack:
        while exits and len(stack) <= exits[-1][0]:
            active.discard(exits.pop()[1])
        value, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise InvalidSpec(path, "…", f"document has more than {MAX_NODES} values", source=source)
        if isinstance(value, str):
            _check_string(value, path, source)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -_INT64 <= value < _INT64:
                # not the number itself: repr() of a very long integer raises ValueError
                raise InvalidSpec(path, f"an integer of {value.bit_length()} bits",
                                  "numbers are 64-bit integers in Kubernetes objects", source=source)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidSpec(path, value, "not a finite number", source=source)
        elif isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise InvalidSpec(_short(path), "…", f"nested more than {MAX_DEPTH} levels deep", source=source)
            if id(value) in active:
                raise InvalidSpec(path, "…", "the document refers to itself (a YAML alias cycle)", source=source)
            active.add(id(value))
            exits.append((len(stack), id(value)))
            if isinstance(value, dict):
                for key, child in value.items():
                    if not isinstance(key, str):
                        shown = type(key).__name__  # not str(key): a huge integer cannot be printed
                        raise InvalidSpec(path, f"a key of type {shown}", "mapping keys are strings in Kubernetes objects: "
                                          "quote it", source=source)
                    _check_string(key, _join(path, key), source)
                    stack.append((child, _join(path, key), depth + 1))
            else:
                stack.extend((child, _join(path, index), depth + 1) for index, child in enumerate(value))
        else:
            shown = type(value).__name__
            # a set's own order changes from run to run; the message must not
            text = "{" + ", ".join(sorted(map(repr, value))) + "}" if isinstance(value, (set, frozenset)) else str(value)
            raise InvalidSpec(path, text[:40], f"a {shown} is not a Kubernetes value (YAML tags such as "
                              "!!binary, !!set or unquoted timestamps are not read): quote it", source=source)


def _check_string(text: str, path: str, source: str | None) -> None:
    if "\x00" in text:
        raise InvalidSpec(path, text, "contains a NUL character, which no backend can carry", source=source)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSpec(path, text, "not valid Unicode (a lone surrogate)", source=source) from None


def parse_object(data: Any, source: str | None = None) -> Resource:
    """Validate one decoded document into its typed model."""
    check_data(data, source)
    if not isinstance(data, dict):
        raise InvalidSpec("", data, "a document must be a mapping with apiVersion and kind", source=source)
    api_version, kind = data.get("apiVersion"), data.get("kind")
    model = KINDS.get((api_version, kind)) if isinstance(api_version, str) and isinstance(kind, str) else None
    if model is None:
        known = ", ".join(f"{k} ({v})" for v, k in KINDS)
        field = "kind" if any(kind == k for _, k in KINDS) or not isinstance(api_version, str) else "apiVersion"
        got = f"{api_version}/{kind}" if field == "apiVersion" else kind
        raise InvalidSpec(field, got, f"unsupported object; hpc-bridge reads {known}", source=source)
    try:
        return model.model_validate(data)  # type: ignore[return-value]
    except ValidationError as exc:
        raise invalid_from_validation(exc, source, model=model) from None
    except RecursionError:
        raise InvalidSpec("", "…", "document is nested too deeply", source=source) from None


def _check_nodes(root: yaml.Node, source: str) -> None:
    """The composed YAML graph before anything is built from it: no alias cycle, at most MAX_ALIASES alias
    references, MAX_DEPTH levels and MAX_NODES nodes once aliases are expanded, and no duplicate keys (the
    API server refuses them; PyYAML would silently keep the last)."""
    stack: list[tuple[yaml.Node, str, int]] = [(root, "", 0)]
    active: set[int] = set()
    exits: list[tuple[int, int]] = []
    seen: set[int] = set()
    nodes = aliases = 0
    while stack:
        while exits and len(stack) <= exits[-1][0]:
            active.discard(exits.pop()[1])
        node, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise InvalidSpec(path, "…", f"document has more than {MAX_NODES} values once YAML aliases are expanded",
                              source=source)
        if id(node) in seen:
            aliases += 1
            if aliases > MAX_ALIASES:
                raise InvalidSpec(_short(path), "…", f"more than {MAX_ALIASES} YAML alias references", source=source)
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            continue
        if id(node) in active:
            raise InvalidSpec(path, "…", "a YAML alias refers to a node that contains it (a cycle)", source=source)
        if depth >= MAX_DEPTH:
            raise InvalidSpec(_short(path), "…", f"nested more than {MAX_DEPTH} levels deep", source=source)
        active.add(id(node))
        exits.append((len(stack), id(node)))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, _join(path, index), depth + 1) for index, child in enumerate(node.value))
            continue
        keys: set[tuple[str, str]] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InvalidSpec(path, "…", "mapping keys are strings in Kubernetes objects, not collections",
                                  source=source)
            child = _join(path, key_node.value)
            if key_node.tag != "tag:yaml.org,2002:merge":
                if (key_node.tag, key_node.value) in keys:
                    line = key_node.start_mark.line + 1
                    raise InvalidSpec(child, key_node.value, f"duplicate key (line {line}); the API server refuses "
                                      "it, YAML would keep only the last", source=source)
                keys.add((key_node.tag, key_node.value))
            stack.append((value_node, child, depth + 1))


def _count_events(text: str, source: str) -> None:
    """A streaming pass over the parser's events, before any node is built: composing builds every node of a
    document at once (about 450 bytes each), so the node count and the nesting are bounded here first."""
    loader = _SafeLoader(text)
    nodes = depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                nodes += 1
            elif isinstance(event, yaml.CollectionStartEvent):
                nodes += 1
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    raise InvalidSpec("", f"line {line}", f"nested more than {MAX_DEPTH} levels deep", source=source)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            if nodes > MAX_NODES:
                raise InvalidSpec("", f"{nodes} values", f"input has more than {MAX_NODES} YAML values", source=source)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, source) from None
    finally:
        loader.dispose()


def _yaml_error(exc: Exception, text: str, source: str) -> InvalidSpec:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or (str(exc) if isinstance(exc, yaml.YAMLError) else type(exc).__name__)
    return InvalidSpec("", text[:40], f"not valid YAML: {problem}{where}", source=source)


def safe_load_all(text: str, source: str = "<input>") -> list[Any]:
    """Every YAML document of *text*, decoded within the limits above (each refused as one InvalidSpec)."""
    if len(text) > MAX_INPUT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_INPUT_BYTES:
        raise InvalidSpec("", f"{len(text.encode('utf-8', 'surrogatepass'))} bytes",
                          f"input is larger than {MAX_INPUT_BYTES} bytes", source=source)
    documents: list[Any] = []
    _count_events(text, source)
    loader = _SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            assert node is not None  # check_node() said a document follows
            _check_nodes(node, source)
            documents.append(loader.construct_document(node))
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, source) from None
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:
        # PyYAML raises these for pathological input (odd timestamps, huge numbers)
        raise _yaml_error(exc, text, source) from None
    finally:
        loader.dispose()
    return documents


def load_documents(text: str, source: str = "<input>") -> list[Resource]:
    """Every non-empty YAML document of *text* as a typed object, in order."""
    documents = safe_load_all(text, source)
    objects: list[Resource] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        label = source if len(documents) == 1 else f"{source}[doc {index + 1}]"
        objects.append(parse_object(document, label))
    return objects


def decode_input(data: bytes, source: str) -> str:
    """Bytes read from a file or stdin as text, byte for byte: no newline translation (a CR stays a CR, so
    the checks that follow see what bash and sbatch will see), at most MAX_INPUT_BYTES, strict UTF-8."""
    if len(data) > MAX_INPUT_BYTES:
        raise InvalidSpec("file", source, f"larger than {MAX_INPUT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSpec("file", source, f"not a UTF-8 text file (byte {exc.start})") from None


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 input file's text, read in binary (byte-exact); a missing, binary, huge or directory path is an
    InvalidSpec."""
    name = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise InvalidSpec("file", name, "no such file") from None
    except IsADirectoryError:
        raise InvalidSpec("file", name, "is a directory, not a file") from None
    except OSError as exc:
        raise InvalidSpec("file", name, f"cannot be read: {exc.strerror or type(exc).__name__}") from None
    return decode_input(data, name)


def load_file(path: str | os.PathLike[str]) -> list[Resource]:
    return load_documents(read_text(path), source=os.fspath(path))


class _Dumper(yaml.SafeDumper):
    """Plain YAML for humans and kubectl: no anchors/aliases, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value and value.isprintable() is False and all(c.isprintable() or c == "\n" for c in value) \
            and not value.endswith((" ", "\n\n")) and "\n " not in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(documents: Iterable[Any]) -> str:
    """Several documents as one YAML stream; loads back to equal data with yaml.safe_load_all."""
    return yaml.dump_all(list(documents), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True, width=1_000_000)


def to_yaml(objects: Iterable[BaseModel | dict[str, Any]]) -> str:
    return dump_yaml(obj.to_wire() if hasattr(obj, "to_wire") else obj for obj in objects)
