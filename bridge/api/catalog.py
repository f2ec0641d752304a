"""Where the CLI finds clusters and runtimes: the config file, runtime files, and the built-in defaults."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, cast

from bridge.api.cluster import BridgeCluster, builtin_local_cluster
from bridge.api.loader import Resource, load_file, parse_object, read_text, safe_load_all
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.errors import InvalidSpec

RuntimeObject = ClusterTrainingRuntime | TrainingRuntime


def _debug(message: str, *args: object) -> None:
    import logging  # only here: a CLI run without HPCBRIDGE_DEBUG never needs it

    logging.getLogger("hpcbridge").debug(message, *args)


def config_path() -> Path:
    explicit = os.environ.get("HPCBRIDGE_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hpcbridge" / "clusters.yaml"


def load_clusters(path: Path | None = None) -> dict[str, BridgeCluster]:
    """Configured clusters by name; the built-in ``local`` is there unless the config redefines it."""
    clusters: dict[str, BridgeCluster] = {"local": builtin_local_cluster()}
    path = path or config_path()
    if os.environ.get("HPCBRIDGE_CONFIG") and not path.exists():
        raise InvalidSpec("HPCBRIDGE_CONFIG", str(path), "no such file")
    if path.exists():
        for obj in load_file(path):
            if not isinstance(obj, BridgeCluster):
                raise InvalidSpec("kind", obj.kind, f"{path} may hold only BridgeCluster objects")
            clusters[obj.name] = obj
    return clusters


@cache
def _builtin_documents() -> tuple[dict[str, Any], ...]:
    import yaml

    text = Path(__file__).with_name("builtin_runtimes.yaml").read_text(encoding="utf-8")
    return tuple(doc for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if doc)


@cache
def builtin_runtimes(name: str | None = None) -> tuple[RuntimeObject, ...]:
    """The built-in runtimes; with *name*, only those so named are validated (a CLI run needs one)."""
    return tuple(parse_object(doc, "builtin runtimes") for doc in _builtin_documents()  # type: ignore[misc]
                 if name is None or doc["metadata"]["name"] == name)


def builtin_runtime_documents() -> dict[str, dict[str, Any]]:
    """The built-in runtimes as documents, by name (copies: the caller may change them)."""
    import copy

    return {doc["metadata"]["name"]: copy.deepcopy(doc) for doc in _builtin_documents()}


def builtin_runtime_names() -> list[str]:
    return sorted(doc["metadata"]["name"] for doc in _builtin_documents())


#: what a runtime document is; anything else in a runtimes folder (a kustomization, a Namespace…) is skipped
RUNTIME_API_GROUP = "trainer.kubeflow.org/"
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")


class RuntimeList(list[RuntimeObject]):
    """Runtimes found, plus what could not be read on the way (named when a runtime is then not found)."""

    unreadable: tuple[str, ...] = ()
    #: (kind, name) of every runtime document seen, validated or not (for "known: …" hints)
    seen: tuple[tuple[str, str], ...] = ()


def _runtime_files(path: Path, required: bool) -> list[Path]:
    """A file, or every ``*.yaml``/``*.yml`` under a folder, subfolders included (Trainer's own runtimes folder
    keeps ``torchtune/…`` and ``data-cache/…`` in subfolders), hidden folders skipped."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()
                      and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if path.exists():
        return [path]
    if required:
        raise InvalidSpec("--runtimes", str(path), "no such file or directory")
    return []


def _is_runtime(document: object) -> bool:
    return (isinstance(document, dict) and isinstance(document.get("apiVersion"), str)
            and document["apiVersion"].startswith(RUNTIME_API_GROUP) and document.get("kind") in RUNTIME_KINDS)


def _document_name(document: dict[str, Any]) -> object:
    metadata = document.get("metadata")
    return metadata.get("name") if isinstance(metadata, dict) else None


def load_runtimes(explicit: Sequence[str | os.PathLike[str]] = (), name: str | None = None) -> RuntimeList:
    """Runtimes from ``--runtimes`` paths (which must exist), $HPCBRIDGE_RUNTIMES and the config dir.

    Documents that are not Trainer runtimes are skipped (said at debug level); a runtime is validated only
    when it is the one wanted (*name*; every one when None), so a broken runtime is an error only for the
    TrainJobs that use it. A file that is not readable YAML is skipped too, and listed in ``unreadable``.
    """
    candidates = [(Path(p), True) for p in explicit]
    candidates += [(Path(p), False) for p in os.environ.get("HPCBRIDGE_RUNTIMES", "").split(os.pathsep) if p]
    candidates.append((config_path().parent / "runtimes", False))
    found = RuntimeList()
    unreadable: list[str] = []
    seen: list[tuple[str, str]] = []
    for path, required in candidates:
        for file in _runtime_files(path, required):
            source = os.fspath(file)
            try:
                documents = safe_load_all(read_text(file), source)
            except InvalidSpec as exc:
                _debug("runtimes: skipping %s: %s", source, exc)
                unreadable.append(str(exc))
                continue
            for index, document in enumerate(documents):
                if document is None:
                    continue
                label = source if len(documents) == 1 else f"{source}[doc {index + 1}]"
                if not _is_runtime(document):
                    kind = document.get("kind") if isinstance(document, dict) else type(document).__name__
                    _debug("runtimes: skipping %s: a %s, not a Trainer runtime", label, kind)
                    continue
                document_name = _document_name(document)
                if isinstance(document_name, str):
                    seen.append((document["kind"], document_name))
                if name is not None and _document_name(document) != name:
                    continue
                found.append(cast(RuntimeObject, parse_object(document, label)))  # _is_runtime: a runtime kind
    found.unreadable, found.seen = tuple(unreadable), tuple(seen)
    return found


def all_runtimes(inline: Iterable[Resource], extra_paths: Sequence[str | os.PathLike[str]] = (),
                 name: str | None = None) -> list[RuntimeObject]:
    """Runtimes in precedence order, lowest first: built-in, search path, then those in the input itself.

    With *name*, built-in runtimes of other names are left unvalidated (they cannot match).
    """
    inline_runtimes = [obj for obj in inline if isinstance(obj, RuntimeObject)]
    loaded = load_runtimes(extra_paths, name)
    found = RuntimeList([*builtin_runtimes(name), *loaded, *inline_runtimes])
    found.unreadable, found.seen = loaded.unreadable, loaded.seen
    return found
