"""Container images for the real-node test cluster, built here without a registry and cached by content.

Why: pods on the real kubelet nodes (tests/harness/kubelet.py) must run `hpcbridge launch` from this checkout,
with sshd, Open MPI, MPICH and mpi4py, and nothing can be pulled. The image is a Debian root made by
debootstrap, written as a docker-archive tarball that ``ctr images import`` takes.

Two layers, each cached under ``<cache root>/images/`` by a hash of what goes into it:

* base: ``debootstrap --variant=minbase bookworm`` with the packages below, the user ``mpiuser`` (uid 1000,
  as Kubeflow's MPI runtimes run), and hpc-bridge's Python dependencies (wheels fetched on this machine, so
  the chroot needs no network). Its key is this module's recipe constants and pyproject's dependencies.
  Minutes to build; rebuilt only when those change.
* app: the hpc-bridge wheel built from the checkout and ``examples/``, installed on top of the base through an
  overlay mount, the upper directory being the layer. Its key is the base key plus the checkout's
  ``bridge/``, ``examples/`` and ``pyproject.toml`` contents. Seconds to build.

No torch image yet: PyPI's torch is the CUDA build (~4 GB with its nvidia-* libraries); issue #15 says what
is planned.

Needs root, debootstrap, mount (overlay) and GNU tar.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
#: what every node image has: Python, sshd for `hpcbridge launch`, both MPI families
PACKAGES = ("python3", "python3-pip", "openssh-server", "openssh-client", "openmpi-bin", "mpich", "procps")
#: extra Python packages the examples need, beside pyproject's dependencies
EXTRA_PYTHON = ("mpi4py>=4", "numpy")
MPI_USER, MPI_UID = "mpiuser", 1000
#: where the examples live in the image, and its working directory
EXAMPLES_DIR = "/opt/hpcbridge/examples"
MPICH_ABI_DIR = "/opt/hpcbridge/mpich-abi"
RECIPE_VERSION = "4"  # bump when a step below changes in a way the constants above don't show
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageBuildError(RuntimeError):
    """A step of an image build failed; the message names it and the log to read."""


def cache_root() -> Path:
    return Path(os.environ.get("HPCBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "hpcbridge")


@dataclass(frozen=True)
class Image:
    """A built image: its reference, the docker-archive tarball and the content key it was built from."""

    ref: str
    archive: Path
    key: str


def content_key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def tree_hash(*roots: Path) -> bytes:
    """Paths and contents of every file under *roots* (no mtimes: a fresh clone hashes the same)."""
    digest = hashlib.sha256()
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                      and "__pycache__" not in p.parts)
        for path in files:
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


def _python_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [*project["dependencies"], *EXTRA_PYTHON]


def base_key() -> str:
    return content_key(RECIPE_VERSION.encode(), SUITE.encode(), " ".join(PACKAGES).encode(),
                       " ".join(_python_requirements()).encode(), f"{MPI_USER}:{MPI_UID}".encode())[:16]


def app_key() -> str:
    return content_key(base_key().encode(), tree_hash(REPO / "bridge", REPO / "examples", REPO / "pyproject.toml"))[:16]


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold *path* (a lock file under the cache) exclusively: one build of a cached thing at a time, across
    processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def image_lock(name: str) -> contextlib.AbstractContextManager[None]:
    return cache_lock(cache_root() / "images" / f"{name}.lock")


def run_logged(argv: list[str], log: Path, **kwargs) -> None:
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise ImageBuildError(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} failed with exit {proc.returncode}; "
                              f"log {log}:\n{tail}")


def chroot(root: Path, script: str, log: Path, env: dict[str, str] | None = None) -> None:
    """Run the shell *script* in the root *root* (no network there), its output appended to *log*."""
    run_logged(["chroot", str(root), "/bin/sh", "-ec", script], log,
               env={"PATH": PATH_ENV.split("=", 1)[1], "HOME": "/root", "LANG": "C.UTF-8",
                    "DEBIAN_FRONTEND": "noninteractive", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})})


def layer_tar(directory: Path, out: Path, log: Path, mtime: int | None = None) -> str:
    """*directory* as a layer tarball (numeric owners, as the files are); returns its sha256 (the diff id).
    With *mtime* (seconds since the epoch) entries are sorted by name and every file carries that time, so the
    same files make the same bytes, whenever and wherever they are tarred."""
    fixed = ["--sort=name", f"--mtime=@{mtime}", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"
             ] if mtime is not None else []
    # the overlay's own bookkeeping (trusted.overlay.*, on an upper directory) is no file's attribute
    run_logged(["tar", "--numeric-owner", "--xattrs", "--xattrs-exclude=trusted.overlay.*", *fixed, "-C",
                str(directory), "-cf", str(out), "."], log)
    digest = hashlib.sha256()
    with open(out, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def debootstrap(rootfs: Path, packages: tuple[str, ...], log: Path) -> None:
    """A minimal Debian root (:data:`SUITE`) with *packages*, at *rootfs*."""
    run_logged(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(rootfs), MIRROR], log)


def install_wheels(rootfs: Path, requirements: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """*requirements* and their dependencies installed into *rootfs*'s Python (3.11, like this machine's) from
    wheels fetched here: the chroot has no network setup."""
    wheels = rootfs / "tmp" / "wheels"
    run_logged([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
                "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64", "--implementation", "cp",
                "-d", str(wheels), *requirements], log)
    chroot(rootfs, f"""
        python3 -m pip install --break-system-packages --no-cache-dir --no-index --find-links /tmp/wheels \
            {' '.join(f"'{r}'" for r in requirements)}
        rm -rf /tmp/wheels
        """, log, env)


def _build_base(target: Path) -> None:
    log = target / "build.log"
    rootfs = target / "rootfs"
    started = time.monotonic()
    debootstrap(rootfs, PACKAGES, log)
    install_wheels(rootfs, _python_requirements(), log)
    chroot(rootfs, f"""
        useradd --uid {MPI_UID} --create-home --shell /bin/bash {MPI_USER}
        mkdir -p /run/sshd {EXAMPLES_DIR}
        # MPICH's library under the MPICH ABI's name, which mpi4py's MPICH build links to (Debian calls it
        # libmpich.so.12 only); apart, so that mpi4py keeps to Open MPI unless a job asks for MPICH with
        # LD_LIBRARY_PATH={MPICH_ABI_DIR} and MPI4PY_MPIABI=mpich
        mkdir -p {MPICH_ABI_DIR} && ln -s /usr/lib/x86_64-linux-gnu/libmpich.so.12 {MPICH_ABI_DIR}/libmpi.so.12
        apt-get clean
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log
        """, log)
    diff_id = layer_tar(rootfs, target / "layer.tar", log)
    (target / "layer.sha256").write_text(diff_id)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"=== base built in {time.monotonic() - started:.0f}s\n")


def cached_layer(target: Path, kind: str, build) -> Path:
    """*target* (a layer's directory, complete once layer.sha256 exists), made by *build* into a temporary
    directory under a lock and renamed; older layers of the same kind are removed."""
    if (target / "layer.sha256").exists():
        return target
    with image_lock(kind):
        if (target / "layer.sha256").exists():
            return target
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        tmp.rename(target)
        prune(f"{kind}-", keep=target.name)
    return target


def base_layer() -> Path:
    """The base layer's directory (rootfs/, layer.tar, layer.sha256), built if missing."""
    return cached_layer(cache_root() / "images" / f"base-{base_key()}", "base", _build_base)


@contextlib.contextmanager
def overlay(lowers: list[Path], upper: Path, work: Path, merged: Path):
    """*merged* = *lowers* (first is the top) with writes going to *upper*; unmounted on exit."""
    for path in (upper, work, merged):
        path.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={':'.join(str(p) for p in lowers)},upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], check=True)
    try:
        yield merged
    finally:
        subprocess.run(["umount", str(merged)], check=False)


def check_no_whiteouts(upper: Path) -> None:
    """The upper directory becomes a layer as it is: it must only add and change, never delete."""
    for path in upper.rglob("*"):
        if path.is_char_device():
            raise ImageBuildError(f"the layer step deleted {path.relative_to(upper)} (overlay whiteout)")


def _build_app(target: Path, base: Path) -> None:
    log = target / "build.log"
    dist = target / "dist"
    run_logged([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
          str(REPO)], log)
    wheel = next(dist.glob("*.whl"))
    upper, work, merged = target / "upper", target / "work", target / "merged"
    with overlay([base / "rootfs"], upper, work, merged):
        stage = merged / "tmp" / "hpcbridge-wheel"
        stage.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, stage / wheel.name)
        shutil.copytree(REPO / "examples", merged / EXAMPLES_DIR.lstrip("/"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        chroot(merged, f"""
            python3 -m pip install --break-system-packages --no-cache-dir --no-deps /tmp/hpcbridge-wheel/{wheel.name}
            rm -rf /tmp/hpcbridge-wheel
            hpcbridge --help >/dev/null
            """, log)
    shutil.rmtree(work, ignore_errors=True)
    # the staging directory's removal left a whiteout only if it existed below: it did not
    check_no_whiteouts(upper)
    diff_id = layer_tar(upper, target / "layer.tar", log)
    (target / "layer.sha256").write_text(diff_id)
    shutil.rmtree(upper)
    shutil.rmtree(dist)


def app_layer() -> Path:
    base = base_layer()
    return cached_layer(cache_root() / "images" / f"app-{app_key()}", "app", lambda tmp: _build_app(tmp, base))


def prune(prefix: str, keep: str) -> None:
    """Older builds of one layer kind go: every change to bridge/ makes a new app layer."""
    for path in (cache_root() / "images").glob(f"{prefix}*"):
        if path.name != keep and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        if path.name != keep and path.is_file():
            path.unlink()


def write_archive(ref: str, layers: list[Path], out: Path, config: dict | None = None) -> None:
    """A docker-archive tarball (manifest.json, config, layer tars) naming *ref*; layers are hard-linked in.
    *config* is the image's run configuration (Env, WorkingDir, Cmd…), the node image's by default."""
    staging = out.with_suffix(".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    diff_ids, names = [], []
    for index, layer in enumerate(layers):
        name = f"layer{index}.tar"
        os.link(layer / "layer.tar", staging / name)
        diff_ids.append("sha256:" + (layer / "layer.sha256").read_text().strip())
        names.append(name)
    run_config = config if config is not None else {
        "Env": [PATH_ENV, "LANG=C.UTF-8", "PYTHONUNBUFFERED=1"], "WorkingDir": EXAMPLES_DIR, "Cmd": ["/bin/bash"]}
    image_config = {"architecture": "amd64", "os": "linux", "config": run_config,
              "rootfs": {"type": "layers", "diff_ids": diff_ids},
              "history": [{"created_by": f"hpc-bridge tests/harness/node_image.py layer {i}"} for i in range(len(layers))]}
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    (staging / config_name).write_bytes(config_bytes)
    (staging / "manifest.json").write_text(json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": names}]))
    tmp = out.with_suffix(".tmp")
    # fixed times and owners: the same layers and config make the same archive
    subprocess.run(["tar", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C", str(staging), "-cf", str(tmp),
                    "manifest.json", config_name, *names], check=True)
    tmp.rename(out)
    shutil.rmtree(staging)


def node_image() -> Image:
    """The node image (base + app), built where missing; its tag is the app key, so a changed checkout is a
    new image and a pod never runs yesterday's hpc-bridge."""
    app = app_layer()
    key = app.name.split("-", 1)[1]
    ref = f"hpcbridge.test/node:{key}"
    out = cache_root() / "images" / f"node-{key}.tar"
    if not out.exists():
        with image_lock("archive"):
            if not out.exists():
                write_archive(ref, [base_layer(), app], out)
                prune("node-", keep=out.name)
    return Image(ref, out, key)


if __name__ == "__main__":  # build by hand: python -m tests.harness.node_image
    image = node_image()
    print(image.ref, image.archive, f"{image.archive.stat().st_size / 1e6:.0f} MB")
