"""Every shell block of README.md and docs/ that needs no cluster daemon runs as written, on the local cluster,
from the repository root, and prints what the text shows; a block that needs Slurm runs as written against the
suite's Slurm cluster, configured as ``hpc``; a block that needs Kubernetes runs as written with kubectl and helm
against a control plane of its install path's (kubectl or Helm, beside Kubeflow Trainer's CRDs or not: the
operator's install, its Secrets, what its ServiceAccount may do, an upgrade, the uninstall), unless it needs more
(BEYOND_THE_CONTROL_PLANE). tests/doc_blocks.py says how blocks are read; the blocks that need what
the suite does not start (Flux, root, several clusters, a file of the reader's own) are parsed and checked by
tests/unit/test_docs.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import doc_blocks
from tests.doc_blocks import ROOT, Block

if TYPE_CHECKING:
    from tests.harness.kube import KubeCluster

pytestmark = [pytest.mark.integration, pytest.mark.local]

RUNNABLE = [block for block in doc_blocks.shell_blocks() if not block.daemons]


@pytest.fixture
def reader_env(tmp_path: Path) -> dict[str, str]:
    """A reader's shell: this checkout's hpcbridge first on PATH, no clusters configured, state of its own."""
    config = tmp_path / "clusters.yaml"
    config.write_text("")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HPCBRIDGE_", "SLURM_"))}
    env.update(PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", HPCBRIDGE_CONFIG=str(config),
               XDG_STATE_HOME=str(tmp_path / "state"), PYTHONPATH=str(ROOT))
    return env


def _run(command: doc_blocks.Command, cwd: Path, env: dict[str, str], where: str,
         job_ids: list[str] | None = None) -> Path:
    """Run one command in *cwd* (a ``cd`` moves it); with *job_ids*, ``1234`` is the last id in it, and a
    submit's first printed line is added to it."""
    text = command.text.replace("\\\n", " ")
    if text.startswith("cd "):
        return (cwd / text[3:].split("#")[0].strip()).resolve()
    script = command.text
    if job_ids is not None:
        script = doc_blocks.PLACEHOLDER_ID.sub(job_ids[-1] if job_ids else "1234", script)
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    printed = (result.stdout + result.stderr).splitlines()
    assert result.returncode == command.exit_code, (
        f"{where}: `{command.text}` exited {result.returncode}:\n{result.stdout}{result.stderr}")
    if job_ids is not None and text.startswith("hpcbridge submit") and result.stdout.strip():
        job_ids.append(result.stdout.split()[0])
    for shown in command.output:
        assert doc_blocks.shown_line_found(shown, printed), (
            f"{where}: `{command.text}` did not print {shown!r}; it printed:\n" + "\n".join(printed))
    return cwd


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.where)
def test_block_runs_as_written(block: Block, reader_env: dict[str, str]) -> None:
    if not block.runnable():
        pytest.skip(f"{block.where} needs {', '.join(block.modules)} (not installed)")
    cwd = ROOT
    for command in block.commands():
        cwd = _run(command, cwd, reader_env, block.where)


SLURM_BLOCKS = [block for block in doc_blocks.shell_blocks() if block.runs_on("slurm")]


@pytest.mark.slurm
@pytest.mark.parametrize("block", SLURM_BLOCKS, ids=lambda block: block.where)
def test_slurm_block_runs_as_written(block: Block, reader_env: dict[str, str], slurm_cluster, tmp_path: Path) -> None:
    """As a reader with a Slurm cluster configured as ``hpc`` (the suite's, its commands on this machine):
    each command runs as written, ``1234`` being the id the block's submit printed; a ``sh`` block's commands
    run one by one, ``;``-joined ones together."""
    from bridge.api.loader import to_yaml
    from tests import builders

    hpc = builders.cluster("slurm", "hpc", slurm={"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                           defaults={"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]})
    Path(reader_env["HPCBRIDGE_CONFIG"]).write_text(to_yaml([hpc]))
    cwd, job_ids = ROOT, []
    for line in _lines(block):
        cwd = _run(line, cwd, reader_env, block.where, job_ids)
    assert job_ids, f"{block.where}: no submit printed a job id"


def _lines(block: Block) -> list[doc_blocks.Command]:
    """A block's commands, a ``sh`` block's each line of its own (``\\`` continuations joined)."""
    if block.language == "console":
        return block.commands()
    return [doc_blocks.Command(line) for line in block.script().replace("\\\n", " ").splitlines() if line.strip()]


PYPI_BLOCKS = [block for block in doc_blocks.shell_blocks() if block.runs_on("pypi")]


@pytest.fixture(scope="module")
def reader_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pipx and uv, from PyPI, as a reader who installs tools with them has them."""
    tools = tmp_path_factory.mktemp("reader-tools") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True)
    subprocess.run([str(tools / "bin" / "pip"), "install", "-q", "pipx", "uv"], check=True, timeout=600)
    return tools / "bin"


@pytest.fixture(scope="module")
def reader_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what a fresh clone holds for an install (the package's sources, metadata and examples): an
    install from the checkout itself would leave its build directories there, and take earlier ones in."""
    into = tmp_path_factory.mktemp("hpc-bridge")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, into / name)
    for name in ("bridge", "examples"):
        shutil.copytree(ROOT / name, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    return into


_HOMES: dict[str, Path] = {}


@pytest.mark.install
@pytest.mark.parametrize("block", PYPI_BLOCKS, ids=lambda block: block.where)
def test_install_block_runs_as_written(block: Block, reader_tools: Path, reader_checkout: Path,
                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    """As a reader on a login node, from the root of a clone, with python3, pipx and uv on PATH and nothing of
    hpc-bridge's: each command as written, from PyPI. The home is one per document, in its order (a block using
    the venv an earlier one made finds it there); a tool install (pipx, uv) has a home of its own, being the
    alternative it is. ``hpcbridge`` is what the block installed (``~/.local/bin`` on PATH, as a login shell
    has it): neither this checkout's venv nor PYTHONPATH is in the reader's environment."""
    tool = any(word in block.script() for word in ("pipx install", "uv tool install"))
    key = block.where if tool else str(block.path)
    home = _HOMES.setdefault(key, tmp_path_factory.mktemp("reader-home"))
    # the machine's own settings stay (how it reaches PyPI: proxies, CA bundles), and its package caches
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("HPCBRIDGE_", "SLURM_")) and key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(HOME=str(home), PATH=f"{home}/.local/bin:{reader_tools}:/usr/local/bin:/usr/bin:/bin",
               HPCBRIDGE_CONFIG=str(home / "clusters.yaml"),
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
               UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv")))
    (home / "clusters.yaml").write_text("")
    cwd = reader_checkout
    for command in block.commands():
        cwd = _run(command, cwd, env, block.where)


SETUP_BLOCKS = [block for block in doc_blocks.shell_blocks() if block.runs_on("setup")]


@pytest.fixture
def fresh_clone(tmp_path: Path) -> Path:
    """What ``git clone`` of this checkout gives: its tracked files and those git does not ignore, nothing it
    built (no .venv, no build directories, no caches)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    into = tmp_path / "hpc-bridge"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.mark.install
@pytest.mark.skipif(os.geteuid() != 0, reason="the setup installs Debian packages: root, as the README says")
@pytest.mark.parametrize("block", SETUP_BLOCKS, ids=lambda block: block.where)
def test_setup_block_runs_as_written(block: Block, fresh_clone: Path, tmp_path: Path) -> None:
    """As a newcomer on a fresh machine, from the root of a fresh clone, in a home with nothing of hpc-bridge's
    (no venvs, no configured clusters: the setup makes its venvs from PyPI): each command as written. Debian's
    packages are this machine's, as the setup finds them (the setup installs the missing ones)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("HPCBRIDGE_", "SLURM_")) and key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(HOME=str(home), PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")))
    cwd = fresh_clone
    for command in block.commands():
        cwd = _run(command, cwd, env, block.where)


#: what a Kubernetes block may need beyond a control plane, kubectl, helm and this checkout: such a block is parsed
#: and CLI-checked only (tests/unit/test_docs.py), for the reason given
BEYOND_THE_CONTROL_PLANE = {
    "kueue-manifests.yaml": "Kueue's release manifests",
    "job.yaml": "a TrainJob of the reader's own",
    "hpcbridge operator &": "an operator of its own beside the test's, and a TrainJob of the reader's",
}


def _commands(block: Block) -> str:
    return "\n".join(line.split("#")[0] for line in block.script().splitlines())  # not what comments say


def _beyond(block: Block) -> str | None:
    return next((why for word, why in BEYOND_THE_CONTROL_PLANE.items() if word in _commands(block)), None)


def _uninstalls(block: Block) -> bool:
    return any(uninstall in _commands(block) for uninstall in ("kubectl delete", "helm uninstall"))


def _kubernetes_blocks() -> list[Block]:
    """The blocks run on a control plane, grouped by install path (kubectl, Helm, each with and without Trainer),
    each path in an order a reader could follow: the uninstall last."""
    blocks = [block for block in doc_blocks.shell_blocks() if block.runs_on("kubernetes") and not _beyond(block)]
    return sorted(blocks, key=lambda block: (len(block.install_path), block.install_path, _uninstalls(block)))


def _serving_every_crd(kubectl: Path, env: dict[str, str], timeout: float = 60.0) -> None:
    """Until each CRD's objects can be listed: an install uninstalled seconds after it was made can delete a CRD
    whose storage is still being set up, and the API server's cleanup of it then backs off for minutes
    ("could not list instances: storage is (re)initializing"); an admin uninstalls an install that is up."""
    names = subprocess.run([str(kubectl), "get", "crd", "-o", "name"], env=env, capture_output=True, text=True,
                           timeout=60).stdout.split()
    deadline = time.monotonic() + timeout
    for name in names:
        while subprocess.run([str(kubectl), "get", name.split("/", 1)[1], "-A"], env=env, capture_output=True,
                             timeout=60).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)


KUBERNETES_BLOCKS = _kubernetes_blocks()


class ControlPlanes:
    """A control plane (one kwok node) per install path, started when the path's first block runs and stopped
    when the next path starts: the blocks install the operator and uninstall it, CRDs included, which the
    session's shared cluster must keep, and the install paths are alternatives, not steps of one install. A
    ``trainer`` path's control plane has Kubeflow Trainer v2.3's own CRDs, applied as Trainer's install does."""

    def __init__(self) -> None:
        from tests.harness import install_tools

        self.tools = install_tools.binaries()
        self.path: tuple[str, ...] | None = None
        self.cluster: KubeCluster | None = None
        self.base = Path(tempfile.mkdtemp(prefix="hpcbridge-docs-kube-"))

    def for_path(self, path: tuple[str, ...]) -> Path:
        """The kubeconfig of *path*'s control plane."""
        from tests.harness.kube import KubeCluster, component, module_dir

        if self.cluster is None or path != self.path:
            self.stop()
            self.path = path
            self.cluster = KubeCluster(self.base / ("-".join(path) or "kubectl"), nodes=1)
            self.cluster.start()
            if "trainer" in path:
                crds = module_dir(component("trainer")) / "manifests" / "base" / "crds"
                for crd in sorted(crds.glob("trainer.kubeflow.org_*.yaml")):
                    subprocess.run([str(self.tools["kubectl"]), "apply", "--server-side",
                                    "--field-manager=kubeflow-trainer", "-f", str(crd)],
                                   env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}, check=True,
                                   capture_output=True, timeout=120)
        return self.cluster.kubeconfig

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


@pytest.fixture(scope="module")
def control_planes() -> Iterator[ControlPlanes]:
    planes = ControlPlanes()
    try:
        yield planes
    finally:
        planes.stop()
        shutil.rmtree(planes.base, ignore_errors=True)


@pytest.mark.kubernetes
@pytest.mark.parametrize("block", KUBERNETES_BLOCKS, ids=lambda block: block.where)
def test_kubernetes_block_runs_as_written(block: Block, reader_env: dict[str, str], control_planes: ControlPlanes,
                                          tmp_path: Path) -> None:
    """As a cluster admin with kubectl, helm and the kubeconfig of a control plane (its install path's, a kwok
    node that runs the operator's pods as Ready): each command as written, from the repository root, or from a
    folder holding the files a block names as ``./file`` (the reader's key and tokens); ``kubectl auth can-i``
    prints what its comment says (and exits 1 for no). A block the same as one already run on its path is not
    run again."""
    kubeconfig = control_planes.for_path(block.install_path)
    kubectl, helm = control_planes.tools["kubectl"], control_planes.tools["helm"]
    script = block.script()
    if (block.install_path, script) in _RAN_SCRIPTS:
        return
    _RAN_SCRIPTS.add((block.install_path, script))
    env = {**reader_env, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path),
           "PATH": f"{kubectl.parent}:{helm.parent}:{reader_env['PATH']}"}
    own = re.findall(r"=\./([\w.-]+)", script)
    cwd = tmp_path if own else ROOT
    for name in own:
        (tmp_path / name).write_text(f"{name} of the reader's own\n")
    if _uninstalls(block):
        _serving_every_crd(kubectl, env)
    assigned = ""  # a line setting a shell variable holds for the lines after it, as in the reader's shell
    for line in _lines(block):
        if re.fullmatch(r"[A-Za-z_]\w*=\S+", line.text.strip()):
            assigned += line.text.strip() + "; "
            continue
        text, shown = line.text, line.output
        answer = re.search(r"kubectl auth can-i .*#\s*(yes|no)\s*$", text)
        if answer:
            text, shown = text.split("#")[0] + f"# exits {0 if answer[1] == 'yes' else 1}", [answer[1]]
        with _slow_command_snapshot(kubectl, env, block.where, text):
            cwd = _run(doc_blocks.Command(assigned + text, shown), cwd, env, block.where)


_RAN_SCRIPTS: set[tuple[tuple[str, ...], str]] = set()


@contextlib.contextmanager
def _slow_command_snapshot(kubectl: Path, env: dict[str, str], where: str, text: str,
                           after: float = 60.0) -> Iterator[None]:
    """A command still running after *after* seconds (an uninstall waiting on a namespace or CRD to finalise) has
    what it waits on recorded then, and said as a warning once it ends: what holds it is gone by then."""
    seen: list[str] = []

    def snapshot() -> None:
        for what in (["get", "namespaces", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status}{\"\\n\"}{end}"],
                     ["get", "crd", "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} "
                      "{.status.conditions}{\"\\n\"}{end}"],
                     ["get", "pods,trainjobs", "-A", "-o", "wide"]):
            done = subprocess.run([str(kubectl), *what], env=env, capture_output=True, text=True, timeout=30)
            seen.append(done.stdout + done.stderr)

    timer = threading.Timer(after, snapshot)
    started = time.monotonic()
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        if seen:
            warnings.warn(f"{where}: `{text}` took {time.monotonic() - started:.0f} s; after {after:.0f} s:\n"
                          + "\n".join(seen), stacklevel=1)


def test_the_blocks_are_counted() -> None:
    """The counts in the report (printed with -s): run here, run on Slurm or Kubernetes, and checked without
    their daemon."""
    blocks = doc_blocks.shell_blocks()
    ran = len(RUNNABLE) + len(SLURM_BLOCKS) + len(KUBERNETES_BLOCKS) + len(PYPI_BLOCKS) + len(SETUP_BLOCKS)
    print(f"\nshell blocks: {len(blocks)}; run on the local cluster: {len(RUNNABLE)}; run on Slurm: "
          f"{len(SLURM_BLOCKS)}; run on Kubernetes: {len(KUBERNETES_BLOCKS)}; installed from PyPI: "
          f"{len(PYPI_BLOCKS)}; set up on a fresh clone: {len(SETUP_BLOCKS)}; run in all: {ran}; "
          f"parse-checked only: {len(blocks) - ran}")
    for block in blocks:
        if block.runs_on("kubernetes") and _beyond(block):
            print(f"  parse-checked only: {block.where} needs {_beyond(block)}")
    assert SLURM_BLOCKS and KUBERNETES_BLOCKS and PYPI_BLOCKS and SETUP_BLOCKS
