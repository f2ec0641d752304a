"""The wire models' pydantic core schemas, built once per version of their source and kept on disk.

Generating the core schemas of the ~55 wire models is about 45 ms of every process, a fifth of a cold
``hpcbridge render``. They depend only on the source of ``bridge.api``, pydantic, pydantic-core and Python, so
the first process builds them the usual way and pickles them to
``$XDG_CACHE_HOME/hpcbridge/models/<digest>.pickle``; later processes install them in a millisecond.

Unpickling runs code, so a file is read only if it and its folder belong to this user and nobody else can
write them (as ssh treats its keys), and never through a symlink. Any trouble — no cache folder, a file that
fails those checks, a corrupt file, another set of models — falls back to pydantic's own build: the cache can
only save time, never change what validates. ``HPCBRIDGE_SCHEMA_CACHE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
from pathlib import Path

import pydantic
import pydantic_core
from pydantic import BaseModel
from pydantic_core import CoreConfig, CoreSchema, SchemaSerializer, SchemaValidator

#: bump when what is pickled changes shape
FORMAT = 1
#: cache files of other versions kept beside the current one (several venvs may share the folder)
KEEP = 8

#: how this process got its schemas: "cache", "built" (and written) or "off"
source = "off"


def cache_dir() -> Path | None:
    """None without an absolute place for it (no HOME in a container, a relative XDG_CACHE_HOME, which the XDG
    spec says to ignore): never a ``~`` folder in the working directory."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpcbridge" / "models" if os.path.isabs(base) else None


def digest() -> str:
    """What the schemas depend on: this format, Python, pydantic, pydantic-core and every bridge.api source."""
    h = hashlib.sha256(f"{FORMAT}\0{sys.version}\0{pydantic.VERSION}\0{pydantic_core.__version__}".encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:32]


def wire_models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """``root`` and its subclasses in bridge.api, parents before children (definition order)."""
    found: dict[type[BaseModel], None] = {root: None}
    stack = [root]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("bridge.api."):
                found[sub] = None
                stack.append(sub)
    return list(found)


def _key(model: type[BaseModel]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def install(root: type[BaseModel]) -> None:
    """Complete every wire model, from the cache when one matches, else by building and caching them."""
    global source
    models = wire_models(root)
    if os.environ.get("HPCBRIDGE_SCHEMA_CACHE", "1") == "0":
        _build(models)
        source = "off"
        return
    folder = cache_dir()
    try:
        path = folder / f"{digest()}.pickle" if folder is not None else None
    except OSError:  # a source file we cannot read
        path = None
    if path is None:
        _build(models)
        source = "off"
        return
    cached = _read(path)
    if cached is not None and set(cached) == {_key(m) for m in models}:
        try:
            for model in models:
                _complete(model, *cached[_key(model)])
            source = "cache"
            return
        except Exception:  # noqa: BLE001 - a schema this pydantic will not take: build them all anew
            _build(models, force=True)
            source = "built"
            _write(path, models)
            return
    _build(models)
    source = "built"
    _write(path, models)


def _build(models: list[type[BaseModel]], force: bool = False) -> None:
    for model in models:
        model.model_rebuild(force=force)


def _complete(model: type[BaseModel], schema: CoreSchema, config: CoreConfig) -> None:
    """What pydantic's own build leaves on a model class, from a schema it generated earlier."""
    validator = SchemaValidator(schema, config)
    serializer = SchemaSerializer(schema, config)
    model.__pydantic_core_schema__ = schema
    model.__pydantic_validator__ = validator
    model.__pydantic_serializer__ = serializer
    model.__pydantic_complete__ = True


def _core_config(model: type[BaseModel]) -> CoreConfig:
    from pydantic._internal._config import ConfigWrapper

    return ConfigWrapper(model.model_config, check=False).core_config(title=model.__name__)


def _read(path: Path) -> dict[str, tuple[CoreSchema, CoreConfig]] | None:
    try:
        folder = os.stat(path.parent, follow_symlinks=False)
        if not _private(folder) or not stat.S_ISDIR(folder.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not _private(os.fstat(fd)):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = pickle.load(handle)
    except Exception:  # noqa: BLE001 - truncated, corrupt or from another world: rebuild
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def _private(info: os.stat_result) -> bool:
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _write(path: Path, models: list[type[BaseModel]]) -> None:
    """Atomically, 0600 in a 0700 folder; a read-only or foreign home just means no cache."""
    try:
        data = {_key(m): (m.__pydantic_core_schema__, _core_config(m)) for m in models}
        blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(os.stat(path.parent, follow_symlinks=False)):
            return
        # host and pid: a home on NFS is shared by every node of an allocation starting at once
        tmp = path.with_name(f".{path.name}.{os.uname().nodename}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(blob)
        os.replace(tmp, path)
        _prune(path.parent)
    except Exception:  # noqa: BLE001 - unpicklable, no space, read-only: the build stands, uncached
        return


def _prune(folder: Path) -> None:
    entries = sorted(folder.glob("*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)
