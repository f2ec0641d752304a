"""YAML ⇄ wire objects: multi-document load with one-line errors naming the field path, lossless dump."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from bridge.api.cluster import BridgeCluster
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import TrainJob
from bridge.errors import InvalidSpec

# libyaml's loader when PyYAML was built with it: same safe semantics, several times faster
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

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
            path += f".{part}" if path else str(part)
    return path


def invalid_from_validation(exc: ValidationError, source: str | None = None, prefix: str = "") -> InvalidSpec:
    """The first validation error as an InvalidSpec; the count of the others is appended."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    path = format_loc(first["loc"])
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    problem = _PROBLEMS.get(first["type"]) or first["msg"]
    if problem.startswith("Value error, "):
        problem = problem[len("Value error, "):]
    if len(errors) > 1:
        problem += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    value = None if first["type"] == "missing" else first.get("input")
    return InvalidSpec(path, value, problem, source=source)


def parse_object(data: Any, source: str | None = None) -> Resource:
    """Validate one decoded document into its typed model."""
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
        raise invalid_from_validation(exc, source) from None
    except RecursionError:
        raise InvalidSpec("", "…", "document is nested too deeply", source=source) from None


def load_documents(text: str, source: str = "<input>") -> list[Resource]:
    """Every non-empty YAML document of *text* as a typed object, in order."""
    try:
        documents = list(yaml.load_all(text, Loader=_SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InvalidSpec("", text[:40], f"not valid YAML: {problem}{where}", source=source) from None
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:
        # PyYAML raises these for pathological input (deep nesting, odd timestamps)
        raise InvalidSpec("", text[:40], f"not valid YAML: {type(exc).__name__}", source=source) from None
    objects: list[Resource] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        label = source if len(documents) == 1 else f"{source}[doc {index + 1}]"
        objects.append(parse_object(document, label))
    return objects


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 input file's text; a missing, binary or directory path is an InvalidSpec."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise InvalidSpec("file", os.fspath(path), "no such file") from None
    except UnicodeDecodeError:
        raise InvalidSpec("file", os.fspath(path), "not a UTF-8 text file") from None
    except IsADirectoryError:
        raise InvalidSpec("file", os.fspath(path), "is a directory, not a file") from None


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
    return dump_yaml(obj.to_wire() if hasattr(obj, "to_wire") else obj for obj in objects)  # type: ignore[union-attr]
