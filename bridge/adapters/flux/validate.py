"""A jobspec v1 validator written from RFC 14 (canonical jobspec) and RFC 25 (version 1).

flux-core validates at submit time; checking here first means a bad jobspec is an InvalidSpec naming the
path before anything is sent, and lets the tests hold every rendered jobspec to the RFC without Flux.
"""

from __future__ import annotations

from typing import Any

from bridge.errors import InvalidSpec

_GRAPHS = {  # RFC 25: the only legal resource graphs
    ("slot", ("core",)), ("slot", ("core", "gpu")),
    ("node", ("slot", ("core",))), ("node", ("slot", ("core", "gpu"))),
}
_VERTEX_KEYS = {"type", "count", "with", "label", "exclusive", "unit", "id"}
_SYSTEM_TYPES: dict[str, type | tuple[type, ...]] = {
    "duration": (int, float), "environment": dict, "cwd": str, "queue": str, "bank": str, "project": str,
    "dependencies": list, "constraints": dict, "job": dict, "shell": dict, "files": dict,
    "preemptible-after": (int, float),
}


def _fail(path: str, value: Any, problem: str) -> InvalidSpec:
    return InvalidSpec(f"jobspec.{path}" if path else "jobspec", value, problem)


def _positive_int(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, value, "must be an integer of at least 1 (RFC 25 counts are fixed)")


def _vertex(path: str, vertex: Any) -> object:
    """The vertex's shape: its type, with its children's shapes when it has any (compared with _GRAPHS)."""
    if not isinstance(vertex, dict):
        raise _fail(path, vertex, "a resource vertex is a mapping")
    unknown = set(vertex) - _VERTEX_KEYS
    if unknown:
        raise _fail(path, sorted(unknown), "unknown resource vertex keys")
    kind = vertex.get("type")
    if kind not in ("node", "slot", "core", "gpu"):
        raise _fail(f"{path}.type", kind, "RFC 25 allows only node, slot, core and gpu")
    _positive_int(f"{path}.count", vertex.get("count"))
    if "exclusive" in vertex and not isinstance(vertex["exclusive"], bool):
        raise _fail(f"{path}.exclusive", vertex["exclusive"], "must be true or false")
    children = vertex.get("with", [])
    if kind == "slot":
        if not isinstance(vertex.get("label"), str) or not vertex["label"]:
            raise _fail(f"{path}.label", vertex.get("label"), "a slot needs a label")
        if not children:
            raise _fail(f"{path}.with", children, "a slot needs at least one child (a core)")
    if not isinstance(children, list):
        raise _fail(f"{path}.with", children, "must be a list")
    shapes = tuple(_vertex(f"{path}.with[{i}]", child) for i, child in enumerate(children))
    if kind in ("core", "gpu"):
        if shapes:
            raise _fail(f"{path}.with", children, f"a {kind} has no children")
        return kind
    return (kind, shapes[0]) if kind == "node" and len(shapes) == 1 else (kind, shapes)


def _slot_labels(vertex: dict[str, Any]) -> list[str]:
    labels: list[str] = [vertex["label"]] if vertex.get("type") == "slot" else []
    for child in vertex.get("with", []):
        labels += _slot_labels(child)
    return labels


def validate_jobspec(jobspec: Any) -> None:
    """Raise InvalidSpec (with the path inside the jobspec) unless *jobspec* is a valid RFC 25 jobspec."""
    if not isinstance(jobspec, dict):
        raise _fail("", type(jobspec).__name__, "a jobspec is a mapping")
    keys = set(jobspec)
    expected = {"version", "resources", "tasks", "attributes"}
    if keys != expected:
        raise _fail("", sorted(keys ^ expected), "must have exactly version, resources, tasks and attributes")
    if jobspec["version"] != 1 or isinstance(jobspec["version"], bool):
        raise _fail("version", jobspec["version"], "must be 1")

    resources = jobspec["resources"]
    if not isinstance(resources, list) or len(resources) != 1:
        raise _fail("resources", resources, "must be a list of exactly one node or slot vertex")
    shape = _vertex("resources[0]", resources[0])
    if shape not in _GRAPHS:
        raise _fail("resources", shape, "not an RFC 25 graph (slot>core, node>slot>core, slot>(core,gpu), "
                                        "node>slot>(core,gpu))")
    labels = _slot_labels(resources[0])

    tasks = jobspec["tasks"]
    if not isinstance(tasks, list) or len(tasks) != 1:
        raise _fail("tasks", tasks, "must be a list of exactly one task")
    task = tasks[0]
    if not isinstance(task, dict):
        raise _fail("tasks[0]", task, "a task is a mapping")
    command = task.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(arg, str) for arg in command):
        raise _fail("tasks[0].command", command, "must be a non-empty list of strings")
    if task.get("slot") not in labels:
        raise _fail("tasks[0].slot", task.get("slot"), f"must name a slot label ({', '.join(labels)})")
    count = task.get("count")
    if not isinstance(count, dict) or len(count) != 1 or next(iter(count)) not in ("per_slot", "total"):
        raise _fail("tasks[0].count", count, "must have exactly one of per_slot or total")
    key, value = next(iter(count.items()))
    _positive_int(f"tasks[0].count.{key}", value)
    if key == "per_slot" and value != 1:
        raise _fail("tasks[0].count.per_slot", value, "RFC 25: per_slot must be 1 (the job shell refuses others)")

    attributes = jobspec["attributes"]
    if not isinstance(attributes, dict) or set(attributes) - {"user", "system"}:
        raise _fail("attributes", sorted(attributes) if isinstance(attributes, dict) else attributes,
                    "may hold only user and system")
    system = attributes.get("system")
    if not isinstance(system, dict) or "duration" not in system:
        raise _fail("attributes.system.duration", None, "RFC 25 requires a duration (0 means unlimited)")
    for name, expected_type in _SYSTEM_TYPES.items():
        if name in system and (not isinstance(system[name], expected_type) or isinstance(system[name], bool)):
            raise _fail(f"attributes.system.{name}", system[name], f"must be {_type_name(expected_type)}")
    if system["duration"] < 0:
        raise _fail("attributes.system.duration", system["duration"], "must not be negative")
    for name, value in system.get("environment", {}).items():
        if not isinstance(name, str) or not (value is None or isinstance(value, str)):
            raise _fail(f"attributes.system.environment.{name}", value, "values are strings (or null to unset)")
    if "cwd" in system and not system["cwd"].startswith("/"):
        raise _fail("attributes.system.cwd", system["cwd"], "must be an absolute path")
    for path, entry in system.get("files", {}).items():
        if not isinstance(entry, dict) or entry.get("encoding") not in ("utf-8", "base64", "blobvec") \
                or "data" not in entry:
            raise _fail(f"attributes.system.files.{path}", entry, "RFC 37 entries need data and an encoding")


def _type_name(expected: type | tuple[type, ...]) -> str:
    names = [t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,))]
    return {"dict": "a mapping", "list": "a list", "str": "a string"}.get(names[0], " or ".join(names))
