"""Where the CLI finds clusters and runtimes: the config file, runtime files, and the built-in defaults."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from pathlib import Path

from bridge.api.cluster import BridgeCluster, builtin_local_cluster
from bridge.api.loader import Resource, load_file, parse_object
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.errors import InvalidSpec

RuntimeObject = ClusterTrainingRuntime | TrainingRuntime


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
def _builtin_documents() -> tuple[dict, ...]:
    import yaml

    text = resources.files("bridge.api").joinpath("builtin_runtimes.yaml").read_text(encoding="utf-8")
    return tuple(doc for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if doc)


@cache
def builtin_runtimes(name: str | None = None) -> tuple[RuntimeObject, ...]:
    """The built-in runtimes; with *name*, only those so named are validated (a CLI run needs one)."""
    return tuple(parse_object(doc, "builtin runtimes") for doc in _builtin_documents()  # type: ignore[misc]
                 if name is None or doc["metadata"]["name"] == name)


def builtin_runtime_names() -> list[str]:
    return sorted(doc["metadata"]["name"] for doc in _builtin_documents())


def _runtime_files(path: Path, required: bool) -> list[Path]:
    if path.is_dir():
        return sorted(path.glob("*.y*ml"))
    if path.exists():
        return [path]
    if required:
        raise InvalidSpec("--runtimes", str(path), "no such file or directory")
    return []


def load_runtimes(explicit: Sequence[str | os.PathLike[str]] = ()) -> list[RuntimeObject]:
    """Runtimes from ``--runtimes`` paths (which must exist), $HPCBRIDGE_RUNTIMES and the config dir."""
    candidates = [(Path(p), True) for p in explicit]
    candidates += [(Path(p), False) for p in os.environ.get("HPCBRIDGE_RUNTIMES", "").split(os.pathsep) if p]
    candidates.append((config_path().parent / "runtimes", False))
    found: list[RuntimeObject] = []
    for path, required in candidates:
        for file in _runtime_files(path, required):
            found.extend(obj for obj in load_file(file) if isinstance(obj, RuntimeObject))
    return found


def all_runtimes(inline: Iterable[Resource], extra_paths: Sequence[str | os.PathLike[str]] = (),
                 name: str | None = None) -> list[RuntimeObject]:
    """Runtimes in precedence order, lowest first: built-in, search path, then those in the input itself.

    With *name*, built-in runtimes of other names are left unvalidated (they cannot match).
    """
    inline_runtimes = [obj for obj in inline if isinstance(obj, RuntimeObject)]
    return [*builtin_runtimes(name), *load_runtimes(extra_paths), *inline_runtimes]
