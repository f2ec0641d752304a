"""``scripts/setup.sh`` gives each checkout a venv of its own over one shared venv of dependencies.

Its install is editable, so a venv two checkouts shared ran whichever checkout set it up last. Two copies of this
checkout each run the script under one home directory (pip's cache stays the real one): each ``.venv`` imports
``bridge`` from its own copy, through its own thin venv, and both see the third-party packages of one
dependencies' venv, made once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.install]

ROOT = Path(__file__).resolve().parents[2]
#: pip's own limit for one checkout's install; a cold cache fetches about 15 MB
SETUP_TIMEOUT = 600


def _checkout(into: Path) -> Path:
    """What the script reads of a checkout: itself, the package's metadata and the package."""
    (into / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup.sh", into / "scripts" / "setup.sh")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, into / name)
    shutil.copytree(ROOT / "bridge", into / "bridge", ignore=shutil.ignore_patterns("__pycache__"))
    return into


def _pip_cache() -> str:
    return subprocess.run(["python3", "-m", "pip", "cache", "dir"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _imported_from(checkout: Path) -> Path:
    out = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-c", "import bridge; print(bridge.__file__)"],
                         cwd="/", capture_output=True, text=True, check=True).stdout.strip()
    return Path(out).resolve()


def _setup(checkout: Path, env: dict[str, str]) -> str:
    setup = subprocess.run([str(checkout / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                           timeout=SETUP_TIMEOUT)
    assert setup.returncode == 0, setup.stderr
    assert "setup: ready (hpcbridge " in setup.stderr
    return setup.stderr


def test_each_checkout_runs_its_own_code(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "HPCBRIDGE_VENV")}
    env.update(HOME=str(home), PIP_CACHE_DIR=_pip_cache())
    first, second = _checkout(tmp_path / "first"), _checkout(tmp_path / "second")
    for checkout in (first, second):
        _setup(checkout, env)
    venvs = [(checkout / ".venv").resolve() for checkout in (first, second)]
    for checkout, venv in zip((first, second), venvs, strict=True):
        assert _imported_from(checkout) == checkout.resolve() / "bridge" / "__init__.py"
        assert venv.parent == home.resolve() / ".cache" / "hpcbridge" / "venvs"
    assert venvs[0] != venvs[1]
    deps = sorted((home / ".cache" / "hpcbridge" / "venvs").glob("deps-*"))
    assert len(deps) == 1, deps  # made by the first setup, reused by the second
    for checkout in (first, second):
        yaml_from = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-c",
                                    "import yaml; print(yaml.__file__)"], cwd="/", capture_output=True, text=True,
                                   check=True).stdout.strip()
        assert Path(yaml_from).resolve().is_relative_to(deps[0].resolve())
    # set up again: the second keeps its venv, and names the first's, whose checkout is gone
    shutil.rmtree(first)
    again = _setup(second, env)
    assert "setup: creating" not in again
    assert (second / ".venv").resolve() == venvs[1]
    assert f"setup: note: {venvs[0]} is the venv of {first.resolve()}, not found here" in again
