"""``pip install hpc-bridge`` is what a login node needs, and no more.

The package (a copy of this checkout's sources, so that no earlier in-tree build can leak into it) goes into a
fresh venv with pip from PyPI, non-editable: the Kubernetes client and kopf stay out, the main example renders
and dry-runs, and a Kubernetes cluster or the operator answer with the one line naming their extra. The wheel
built from the same sources declares every extra.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from bridge.extras import EXTRA_MODULES

pytestmark = [pytest.mark.integration, pytest.mark.install]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/mpi-allreduce.yaml"
#: pip's own limit for the whole install; a cold cache fetches about 15 MB
PIP_TIMEOUT = 600

K8S_CLUSTER = """\
apiVersion: hpcbridge.io/v1alpha1
kind: BridgeCluster
metadata: {name: k8s}
spec:
  type: kubernetes
  kubernetes: {kubeconfig: /nonexistent/kubeconfig}
"""


def _sources(into: Path) -> Path:
    """What a source distribution of the checkout holds: its metadata files and the package."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, into / name)
    shutil.copytree(ROOT / "bridge", into / "bridge", ignore=shutil.ignore_patterns("__pycache__"))
    return into


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sources(tmp_path_factory.mktemp("hpc-bridge-src"))


@pytest.fixture(scope="module")
def lean_venv(tmp_path_factory: pytest.TempPathFactory, sources: Path) -> Path:
    venv = tmp_path_factory.mktemp("lean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_env())
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(sources)],
                   check=True, env=_env(), timeout=PIP_TIMEOUT)
    return venv


def _hpcbridge(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "hpcbridge"), *args], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=120)


def test_base_install_leaves_every_extra_out(lean_venv: Path, tmp_path: Path) -> None:
    listing = subprocess.run([str(lean_venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                             check=True, capture_output=True, text=True, env=_env()).stdout
    installed = {package["name"].lower().replace("_", "-") for package in json.loads(listing)}
    optional = {module.replace("_", "-") for modules in EXTRA_MODULES.values() for module in modules}
    assert {"hpc-bridge", "pydantic", "pyyaml", "paramiko"} <= installed
    assert not installed & (optional | {"kopf", "kubernetes", "flux-python", "aiohttp"})
    # the installed copy runs, not this checkout
    where = subprocess.run([str(lean_venv / "bin" / "python"), "-c", "import bridge; print(bridge.__file__)"],
                           cwd=tmp_path, check=True, capture_output=True, text=True, env=_env()).stdout
    assert where.startswith(str(lean_venv))


def test_main_example_renders_and_dry_runs_without_the_kubernetes_client(lean_venv: Path) -> None:
    rendered = _hpcbridge(lean_venv, "render", EXAMPLE, "--to", "slurm")
    assert rendered.returncode == 0, rendered.stderr
    assert "#SBATCH --nodes=2" in rendered.stdout
    dry_run = _hpcbridge(lean_venv, "submit", EXAMPLE, "--dry-run")
    assert dry_run.returncode == 0, dry_run.stderr
    assert "cluster: local" in dry_run.stdout


def test_kubernetes_cluster_and_operator_name_their_extra_in_one_line(lean_venv: Path, tmp_path: Path) -> None:
    config = tmp_path / "clusters.yaml"
    config.write_text(K8S_CLUSTER)
    status = _hpcbridge(lean_venv, "status", "default/some-job", "--cluster", "k8s", HPCBRIDGE_CONFIG=str(config))
    assert (status.returncode, status.stderr) == (
        2, "hpcbridge: error: the Kubernetes backend needs the kubernetes extra: "
           "pip install 'hpc-bridge[kubernetes]'\n")
    operator = _hpcbridge(lean_venv, "operator")
    assert (operator.returncode, operator.stderr) == (
        2, "hpcbridge: error: the operator needs the operator extra: pip install 'hpc-bridge[operator]'\n")


def test_wheel_metadata_declares_the_extras(lean_venv: Path, sources: Path, tmp_path: Path) -> None:
    subprocess.run([str(lean_venv / "bin" / "python"), "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(tmp_path), str(sources)], check=True, env=_env(), timeout=PIP_TIMEOUT)
    (wheel,) = tmp_path.glob("hpc_bridge-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    assert set(EXTRA_MODULES) | {"all"} <= set(metadata.get_all("Provides-Extra") or [])
    base = [r for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert sorted(r.split(">")[0].split("<")[0].lower() for r in base) == ["paramiko", "pydantic", "pyyaml"]
