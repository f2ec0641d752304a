"""bridge.api.schema_cache: models installed from the cache validate exactly as models pydantic built, and a cache
file anyone else could have written is never unpickled."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: every model's JSON schema, then every hostile document of the fuzz catalogue parsed: its wire form or its
#: one-line error. Prints the cache's source first.
ORACLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from bridge.api import schema_cache, load_documents
from bridge.api.base import WireModel
from bridge.api.catalog import load_clusters
from bridge.errors import BridgeError
from tests.fuzz.generator import generate
import pathlib

out = {"source": schema_cache.source, "schemas": {}, "documents": []}
for model in schema_cache.wire_models(WireModel):
    out["schemas"][f"{model.__module__}.{model.__qualname__}"] = model.model_json_schema(by_alias=True)
scratch = pathlib.Path(sys.argv[2])
for case in generate():
    if case.heavy or case.kind not in ("trainjob", "runtime", "config", "types", "yaml"):
        continue
    try:
        docs = load_documents(case.data.decode("utf-8", "replace"), "input")
        result = [d.to_wire() for d in docs]
        if case.config is not None:
            (scratch / "c.yaml").write_bytes(case.config)
            result.append(sorted(c.to_wire()["metadata"]["name"] for c in load_clusters(scratch / "c.yaml").values()))
    except BridgeError as exc:
        result = str(exc)
    out["documents"].append([case.id, result])
print(json.dumps(out, sort_keys=True, default=str))
"""


def _oracle(cache_home: Path, **env: str) -> dict:
    environ = {**os.environ, "XDG_CACHE_HOME": str(cache_home), **env}
    if "HPCBRIDGE_SCHEMA_CACHE" not in env:
        environ.pop("HPCBRIDGE_SCHEMA_CACHE", None)
    scratch = cache_home / "scratch"
    scratch.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-c", ORACLE, str(ROOT), str(scratch)], env=environ, capture_output=True, text=True,
                          check=True, timeout=300)
    return json.loads(done.stdout)


def _cache_file(cache_home: Path) -> Path:
    files = list((cache_home / "hpcbridge" / "models").glob("*.pickle"))
    assert len(files) == 1, files
    return files[0]


def test_models_from_the_cache_validate_exactly_as_models_pydantic_built(tmp_path: Path) -> None:
    built = _oracle(tmp_path, HPCBRIDGE_SCHEMA_CACHE="0")
    first = _oracle(tmp_path)
    cached = _oracle(tmp_path)
    assert (built["source"], first["source"], cached["source"]) == ("off", "built", "cache")
    assert len(built["schemas"]) > 50 and len(built["documents"]) > 1000
    # some documents validate, most are refused: both sides of the schemas are exercised
    assert sum(isinstance(r, list) for _, r in built["documents"]) > 50
    assert sum(isinstance(r, str) for _, r in built["documents"]) > 500
    for other in (first, cached):
        assert other["schemas"] == built["schemas"]
        assert other["documents"] == built["documents"]
    path = _cache_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


class _Planted:
    """Unpickling this creates a marker file: the proof that a planted cache file was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _plant(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(_Planted(marker)))


def _source(cache_home: Path) -> str:
    environ = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    environ.pop("HPCBRIDGE_SCHEMA_CACHE", None)
    code = "from bridge.api import schema_cache; print(schema_cache.source)"
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True,
                          cwd=ROOT, timeout=60).stdout.strip()


@pytest.mark.parametrize("how", ["group-writable file", "world-writable folder", "symlink"])
def test_a_cache_file_others_could_have_written_is_not_unpickled(tmp_path: Path, how: str) -> None:
    assert _source(tmp_path) == "built"
    path = _cache_file(tmp_path)
    marker = tmp_path / "planted-code-ran"
    if how == "symlink":
        elsewhere = tmp_path / "elsewhere.pickle"
        _plant(elsewhere, marker)
        elsewhere.chmod(0o600)
        path.unlink()
        path.symlink_to(elsewhere)
    else:
        _plant(path, marker)
        if how == "group-writable file":
            path.chmod(0o620)
        else:
            path.parent.chmod(0o777)
    assert _source(tmp_path) == "built"
    assert not marker.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the file to another user")
def test_a_cache_file_of_another_user_is_not_unpickled(tmp_path: Path) -> None:
    assert _source(tmp_path) == "built"
    path = _cache_file(tmp_path)
    marker = tmp_path / "planted-code-ran"
    _plant(path, marker)
    os.chown(path, 65534, 65534)
    assert _source(tmp_path) == "built"
    assert not marker.exists()


def test_a_corrupt_cache_file_is_rebuilt_and_replaced(tmp_path: Path) -> None:
    assert _source(tmp_path) == "built"
    path = _cache_file(tmp_path)
    path.write_bytes(path.read_bytes()[: 100])
    assert _source(tmp_path) == "built"
    assert _source(tmp_path) == "cache"


def test_a_read_only_cache_folder_only_costs_the_cache(tmp_path: Path) -> None:
    home = tmp_path / "ro"
    home.mkdir()
    home.chmod(0o500)
    try:
        if os.getuid() == 0:  # root writes anywhere: a file where the folder would be does the same job
            home.chmod(0o700)
            (home / "hpcbridge").write_text("not a folder")
        assert _source(home) == "built"
        assert _source(home) == "built"
    finally:
        home.chmod(0o700)


def test_the_digest_follows_the_source_and_the_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.api import schema_cache

    before = schema_cache.digest()
    monkeypatch.setattr(schema_cache.pydantic, "VERSION", "0.0.0")
    assert schema_cache.digest() != before


def test_without_a_home_there_is_no_cache_and_no_stray_folder(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "HPCBRIDGE_SCHEMA_CACHE")}
    environ["XDG_CACHE_HOME"] = "relative/cache"  # the XDG spec: ignore a relative path
    code = ("import os, pwd; os.environ.pop('HOME', None); "
            "pwd.getpwuid = lambda uid: (_ for _ in ()).throw(KeyError(uid)); "
            "from bridge.api import schema_cache; print(schema_cache.source)")
    done = subprocess.run([sys.executable, "-c", code], env={**environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "off"
    assert list(tmp_path.iterdir()) == []


def test_a_cache_this_pydantic_will_not_take_is_built_anew(tmp_path: Path) -> None:
    assert _source(tmp_path) == "built"
    path = _cache_file(tmp_path)
    data = pickle.loads(path.read_bytes())
    # the last model's schema broken: the models installed before it must not keep what came from the file
    last = list(data)[-1]
    data[last] = ({"type": "no-such-schema"}, data[last][1])
    path.write_bytes(pickle.dumps(data))
    environ = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    environ.pop("HPCBRIDGE_SCHEMA_CACHE", None)
    code = ("from bridge.api import schema_cache, TrainJob\nfrom bridge.api.base import WireModel\n"
            "models = schema_cache.wire_models(WireModel)\n"
            "print(schema_cache.source, all(m.__pydantic_complete__ for m in models),"
            " TrainJob.model_json_schema()['title'])")
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True,
                         cwd=ROOT, timeout=60).stdout.split()
    assert out == ["built", "True", "TrainJob"]
    assert _source(tmp_path) == "cache"  # and the file was written again, whole
