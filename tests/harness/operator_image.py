"""The operator's container image, built from this checkout without a registry and cached by content.

This is the recipe users run too (``scripts/build-operator-image.sh``); it replaces a Dockerfile that nothing
built. It reuses tests/harness/node_image.py's steps: a Debian root made by debootstrap, the Python
dependencies installed from wheels fetched on this machine, and a docker-archive tarball that ``ctr images
import`` and ``docker load`` both take.

What is in it: Debian bookworm's Python 3.11 (no pip), hpc-bridge with its ``operator`` extra (the Kubernetes client
and kopf) and CA certificates; the user ``hpcbridge`` (uid/gid 65532, which the Deployment runs as). What
is not: a Slurm client and munge, so the ``local`` Slurm transport does not work from it. The client must be
the site's own Slurm release (commands talk to slurmctld within two releases) and needs the site's munge key,
so it belongs in a site's image ``FROM`` this one; clusters reached from the operator use ``transport: ssh``
(paramiko, in Python: no ssh binary needed; host keys checked against known_hosts) or ``transport: rest``
(slurmrestd), and Flux over ssh.

Two layers, each cached under ``<cache root>/images/`` by a hash of what goes into it:

* base (``operator-base-<key>``): debootstrap with :data:`PACKAGES`, the user and the operator's Python
  dependencies; its key is this module's constants and pyproject's dependencies. Minutes to build.
* app (``operator-app-<key>``): the hpc-bridge wheel built from ``bridge/`` and ``pyproject.toml``,
  installed over the base; its key is the base key plus those files. Seconds.

Reproducible: every file in a layer carries :data:`SOURCE_DATE_EPOCH` as its time, entries are sorted by
name, owners are numeric, Python byte code is checked by hash (not by time) and the files a build leaves
behind that vary (logs, caches) are removed, so the same packages and wheels give the same layer digests.
The Debian mirror and PyPI move on, so a base built another day may hold newer packages: its key changes only
with the recipe.

The image is tagged with the project's version (``bridge.__version__``), as manifests/operator/deployment.yaml
names it; :attr:`node_image.Image.key` says which content that tag holds.

Needs root, debootstrap, mount (overlay) and GNU tar.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tests.harness import node_image
from tests.harness.node_image import REPO, Image, cache_root, content_key, tree_hash

#: the image's name; its tag is the project's version
REPOSITORY = "ghcr.io/hpc-bridge/operator"
#: Debian packages beside minbase: Python, TLS roots for a REST or S3 endpoint, and pip to install the wheels
#: (removed again, with what it pulled in, once they are)
PACKAGES = ("python3", "ca-certificates", "python3-pip")
USER, UID = "hpcbridge", 65532
#: every file's time in the layers (2026-01-01T00:00:00Z); also the byte-code invalidation mode switch
SOURCE_DATE_EPOCH = 1767225600
RECIPE_VERSION = "3"  # bump when a step below changes in a way the constants above don't show
RUN_CONFIG = {"Env": [node_image.PATH_ENV, "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1",
                      f"HOME=/home/{USER}"],
              "User": f"{UID}:{UID}", "WorkingDir": f"/home/{USER}", "Entrypoint": ["hpcbridge"], "Cmd": ["operator"]}
#: files every Debian build writes with the day's date or a random value in them
VARYING = "/var/log/* /var/cache/ldconfig/aux-cache /var/cache/debconf/*-old /var/lib/dpkg/*-old /etc/machine-id " \
          "/var/lib/apt/lists/* /var/cache/apt/*.bin /etc/ssl/certs/java"
#: what a server image does without: manuals, translations and documents (each package's copyright stays)
UNUSED = "/usr/share/man/* /usr/share/info/* /usr/share/locale/* /usr/share/lintian/*"
#: byte code is written for everything but the Kubernetes client's asyncio half, which nothing here imports
#: (half of that package's size)
NOT_COMPILED = "kubernetes/aio/"
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
BUILD_ENV = {"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}  # pip's byte code then carries source hashes, not times


def version() -> str:
    """The project's version, read from bridge/__init__.py (the operator image's tag)."""
    text = (REPO / "bridge" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise node_image.ImageBuildError("bridge/__init__.py has no __version__")
    return match.group(1)


def image_ref() -> str:
    return f"{REPOSITORY}:{version()}"


def _requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["operator"]]


def base_key() -> str:
    return content_key(RECIPE_VERSION.encode(), node_image.SUITE.encode(), " ".join(PACKAGES).encode(),
                       " ".join(_requirements()).encode(), f"{USER}:{UID}:{SOURCE_DATE_EPOCH}".encode())[:16]


def app_key() -> str:
    return content_key(base_key().encode(), tree_hash(REPO / "bridge", REPO / "pyproject.toml"))[:16]


def _seal(root: Path, target: Path, log: Path) -> None:
    """*root* as the layer of *target*: the varying files gone, byte code rebuilt by hash, tarred reproducibly."""
    node_image.chroot(root, f"""
        rm -rf {VARYING} {UNUSED}
        find /usr/share/doc -type f ! -name copyright -delete
        find / -xdev -name __pycache__ -type d -prune -exec rm -rf {{}} +
        # a few files of the standard library's tests are not Python 3 on purpose: compileall says so, and goes on
        python3 -m compileall -qq --invalidation-mode checked-hash -x '{NOT_COMPILED}' /usr/lib/python3.11 \
            /usr/lib/python3/dist-packages /usr/local/lib/python3.11 || true
        """, log, BUILD_ENV)
    diff_id = node_image.layer_tar(root, target / "layer.tar", log, mtime=SOURCE_DATE_EPOCH)
    (target / "layer.sha256").write_text(diff_id)


def _build_base(target: Path) -> None:
    log = target / "build.log"
    rootfs = target / "rootfs"
    started = time.monotonic()
    node_image.debootstrap(rootfs, PACKAGES, log)
    node_image.install_wheels(rootfs, _requirements(), log, BUILD_ENV)
    # the user written out, not by useradd: /etc/shadow would carry the day of the build
    node_image.chroot(rootfs, f"""
        echo '{USER}:x:{UID}:{UID}:hpc-bridge operator:/home/{USER}:/usr/sbin/nologin' >> /etc/passwd
        echo '{USER}:x:{UID}:' >> /etc/group
        echo '{USER}:*:0:0:99999:7:::' >> /etc/shadow
        mkdir -p /home/{USER} && chown {UID}:{UID} /home/{USER} && chmod 0750 /home/{USER}
        apt-get purge -y --auto-remove python3-pip python3-setuptools python3-wheel python3-pkg-resources
        apt-get clean
        """, log)
    _seal(rootfs, target, log)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"=== operator base built in {time.monotonic() - started:.0f}s\n")


def _build_app(target: Path, base: Path) -> None:
    log = target / "build.log"
    dist = target / "dist"
    node_image.run_logged([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(dist), str(REPO)], log, env={**os.environ, **BUILD_ENV})
    wheel = next(dist.glob("*.whl"))
    upper, work, merged = target / "upper", target / "work", target / "merged"
    with node_image.overlay([base / "rootfs"], upper, work, merged):
        _unpack_wheel(wheel, merged)
        node_image.chroot(merged, f"""
            python3 -m compileall -qq --invalidation-mode checked-hash {SITE_PACKAGES}/bridge
            hpcbridge --help >/dev/null
            python3 -c 'import kopf, kubernetes, bridge.operator'
            """, log, BUILD_ENV)
    subprocess.run(["rm", "-rf", str(work), str(upper / "root")], check=False)
    node_image.check_no_whiteouts(upper)
    diff_id = node_image.layer_tar(upper, target / "layer.tar", log, mtime=SOURCE_DATE_EPOCH)
    (target / "layer.sha256").write_text(diff_id)
    shutil.rmtree(upper)
    shutil.rmtree(dist)


def _unpack_wheel(wheel: Path, root: Path) -> None:
    """Install *wheel* (pure Python, no dependencies) into *root* as pip would, without pip (the image has none):
    a wheel is a zip of the site-packages files; its console scripts are written out."""
    import configparser
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root / SITE_PACKAGES.lstrip("/"))
        points_file = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        points = configparser.ConfigParser()
        points.read_string(archive.read(points_file).decode())
    for name, target in points["console_scripts"].items():
        module, function = target.split(":")
        script = root / "usr" / "local" / "bin" / name
        script.write_text(f"#!/usr/bin/python3\nimport sys\nfrom {module} import {function}\n"
                          f"sys.exit({function}())\n")
        script.chmod(0o755)


def base_layer() -> Path:
    return node_image.cached_layer(cache_root() / "images" / f"operator-base-{base_key()}", "operator-base",
                                   _build_base)


def app_layer() -> Path:
    base = base_layer()
    return node_image.cached_layer(cache_root() / "images" / f"operator-app-{app_key()}", "operator-app",
                                   lambda tmp: _build_app(tmp, base))


def ensure_operator_image() -> Image:
    """The operator image (base + app), built where missing: ``.ref`` is what the Deployment names,
    ``.archive`` the docker-archive tarball, ``.key`` the content it holds (a changed checkout is a new key
    under the same tag)."""
    app = app_layer()
    key = app.name.rsplit("-", 1)[1]
    out = cache_root() / "images" / f"operator-image-{key}.tar"
    if not out.exists():
        with node_image.image_lock("operator-archive"):
            if not out.exists():
                node_image.write_archive(image_ref(), [base_layer(), app], out, RUN_CONFIG)
                node_image.prune("operator-image-", keep=out.name)
    return Image(image_ref(), out, key)


def main(argv: list[str]) -> int:
    """``python -m tests.harness.operator_image [--out FILE]``: build (or reuse) the image and say where it is."""
    started = time.monotonic()
    image = ensure_operator_image()
    if len(argv) == 2 and argv[0] == "--out":
        shutil.copyfile(image.archive, argv[1])
    elif argv:
        print("usage: python -m tests.harness.operator_image [--out FILE]", file=sys.stderr)
        return 2
    print(f"{image.ref} {image.archive} {image.archive.stat().st_size / 1e6:.0f} MB "
          f"(content {image.key}, {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
