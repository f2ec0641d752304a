"""Slurm releases beside this machine's own (Debian 12's 22.05) for the real-Slurm tests, built once and cached
by content: ``HPCBRIDGE_SLURM=24.11`` or ``26.05`` makes the Slurm fixtures run that release.

Why: sites run 23.11 to 26.05, whose commands, states and slurmrestd APIs differ from 22.05's. Debian packages
24.11 (trixie) and 26.05 (sid); nothing else is fetched.

How: ``debootstrap --variant=minbase SUITE ROOT`` with Debian's Slurm packages. The daemons and commands cannot
run inside that root: the jobs they start run this machine's programs (the venv's Python, mpirun, files under
/tmp and the checkout). So they run here, with the root's own loader and libraries: every ELF file of the Slurm
packages is patched (patchelf, installed in the root and run there) so its interpreter is the root's
ld-linux and its DT_RPATH the root's library directories. DT_RPATH, not RUNPATH: it also serves the
libraries those files load (libjwt, libmunge, libc...), and it goes before LD_LIBRARY_PATH; nothing is set in
any environment, so a job's own programs keep this machine's libraries. What a release needs beside that:

* ``bin/``: links to the patched commands and daemons (Debian's /usr/sbin/slurmd is an alternatives link to
  this machine's /etc/alternatives, so the links go to the ``*-wlm`` files). It goes first on PATH.
* ``PluginDir=`` in slurm.conf: the plugins' compiled-in directory is this machine's 22.05 one.
* ``slurmd -d <bin>/slurmstepd``: slurmd starts /usr/sbin/slurmstepd otherwise, which is 22.05's.
* munged is this machine's, shared: the root's libmunge speaks to its socket (same protocol).

Each release is ``<cache root>/slurm-<release>-<key>/`` (root/, bin/, release, build.log, and ``complete``
written last), made under a lock in a temporary directory and renamed; its key hashes the recipe below. The
patched paths name the final directory, so a build is only usable where it was made.

Needs root, debootstrap and network access to deb.debian.org.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.harness.node_image import ImageBuildError, cache_lock, cache_root, content_key, run_logged

MIRROR = "http://deb.debian.org/debian"
#: the release the fixtures run when HPCBRIDGE_SLURM is unset: this machine's own packages
HOST_RELEASE = "22.05"
#: release -> Debian suite that packages it
SUITES = {"24.11": "trixie", "26.05": "sid"}
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmrestd", "slurm-wlm-jwt-plugin", "patchelf")
LIB_DIRS = ("usr/lib/x86_64-linux-gnu/slurm-wlm", "usr/lib/x86_64-linux-gnu")
LOADER = "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
PLUGIN_DIR = "usr/lib/x86_64-linux-gnu/slurm-wlm"
RECIPE_VERSION = "1"  # bump when a step below changes in a way the constants above don't show
ENV_VAR = "HPCBRIDGE_SLURM"


@dataclass(frozen=True)
class SlurmInstall:
    """One built release: its commands and daemons in :attr:`bin_dir`, its plugins in :attr:`plugin_dir`."""

    release: str  # "24.11"
    version: str  # Debian's version of the packages, e.g. "24.11.5-4+deb13u1"
    home: Path

    @property
    def root(self) -> Path:
        return self.home / "root"

    @property
    def bin_dir(self) -> Path:
        return self.home / "bin"

    @property
    def plugin_dir(self) -> Path:
        return self.root / PLUGIN_DIR

    def command(self, name: str) -> str:
        return str(self.bin_dir / name)


def requested() -> str | None:
    """The release ``HPCBRIDGE_SLURM`` asks for; None for this machine's own (unset, empty or 22.05)."""
    asked = os.environ.get(ENV_VAR, "").strip()
    if asked in ("", HOST_RELEASE):
        return None
    if asked not in SUITES:
        raise ValueError(f"{ENV_VAR}={asked!r}: use one of {', '.join([HOST_RELEASE, *SUITES])}")
    return asked


def current() -> SlurmInstall | None:
    """The release ``HPCBRIDGE_SLURM`` asks for, built where missing; None for this machine's own."""
    release = requested()
    return install(release) if release else None


def key(release: str) -> str:
    return content_key(RECIPE_VERSION.encode(), release.encode(), SUITES[release].encode(), MIRROR.encode(),
                       " ".join(PACKAGES).encode(), " ".join(LIB_DIRS).encode(), LOADER.encode())[:16]


def _lock(release: str) -> contextlib.AbstractContextManager[None]:
    return cache_lock(cache_root() / f"slurm-{release}.lock")


def _chroot_out(root: Path, script: str) -> str:
    return subprocess.run(["chroot", str(root), "/bin/sh", "-ec", script], capture_output=True, text=True,
                          check=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}).stdout


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


# every ELF file of the Slurm packages: executables get the root's loader, all get the root's libraries
PATCH_SCRIPT = """
for f in "$@"; do
  if patchelf --print-interpreter "$f" >/dev/null 2>&1; then patchelf --set-interpreter "$LOADER" "$f"; fi
  patchelf --force-rpath --set-rpath "$RPATH" "$f"
done
"""


def _build(tmp: Path, final: Path, release: str) -> None:
    log = tmp / "build.log"
    rootfs = tmp / "root"
    started = time.monotonic()
    run_logged(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITES[release], str(rootfs),
          MIRROR], log)
    version = _chroot_out(rootfs, "dpkg-query -W -f '${Version}' slurmctld").strip()
    if not version.startswith(release + "."):
        raise ImageBuildError(f"Debian {SUITES[release]} now packages Slurm {version}, not {release}: "
                              f"update SUITES in {__file__}")
    packages = _chroot_out(rootfs, "dpkg-query -W -f '${Package}\\n'").split()
    owned = _chroot_out(rootfs, "dpkg -L " + " ".join(p for p in packages if "slurm" in p)).split("\n")
    elves = sorted(name for name in owned if name.startswith("/usr/") and (rootfs / name[1:]).is_file()
                   and not (rootfs / name[1:]).is_symlink() and _is_elf(rootfs / name[1:]))
    final_root = final / "root"
    rpath = ":".join(str(final_root / d) for d in LIB_DIRS)
    subprocess.run(["chroot", str(rootfs), "/bin/sh", "-ec", PATCH_SCRIPT, "patch", *elves], check=True,
                   env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LOADER": str(final_root / LOADER),
                        "RPATH": rpath}, stdout=open(log, "a"), stderr=subprocess.STDOUT)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name in elves:
        if name.startswith(("/usr/bin/", "/usr/sbin/")):
            command = Path(name).name.removesuffix("-wlm")
            (bin_dir / command).symlink_to(final_root / name[1:])
    _chroot_out(rootfs, "apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin")
    (tmp / "release").write_text(version + "\n")
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"=== Slurm {version} built in {time.monotonic() - started:.0f}s\n")


def _check(home: Path, release: str) -> None:
    """The patched commands run here and are the release asked for (a bad patch fails now, not in a test)."""
    conf = home / "check.conf"  # the commands read a configuration before anything else
    conf.write_text(f"ClusterName=check\nSlurmctldHost=localhost\nPluginDir={home / 'root' / PLUGIN_DIR}\n")
    out = subprocess.run([str(home / "bin" / "sinfo"), "--version"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)})
    conf.unlink()
    if out.returncode != 0 or not re.match(rf"slurm(-wlm)? {re.escape(release)}\.", out.stdout):
        raise ImageBuildError(f"{home}/bin/sinfo --version gave exit {out.returncode}: {out.stdout}{out.stderr}")


def install(release: str) -> SlurmInstall:
    """The built *release* (one of :data:`SUITES`), built where missing (about a minute, see build.log)."""
    if release not in SUITES:
        raise ValueError(f"no recipe for Slurm {release}: one of {', '.join(SUITES)}")
    home = cache_root() / f"slurm-{release}-{key(release)}"
    if not (home / "complete").exists():
        with _lock(release):
            if not (home / "complete").exists():
                tmp = home.with_name(home.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.rmtree(home, ignore_errors=True)
                tmp.mkdir(parents=True)
                _build(tmp, home, release)
                tmp.rename(home)
                try:
                    _check(home, release)
                except ImageBuildError:
                    shutil.rmtree(home, ignore_errors=True)
                    raise
                (home / "complete").write_text("")
                for old in cache_root().glob(f"slurm-{release}-*"):
                    if old != home and old.is_dir():
                        shutil.rmtree(old, ignore_errors=True)
    return SlurmInstall(release, (home / "release").read_text().strip(), home)


if __name__ == "__main__":  # build by hand: python -m tests.harness.slurm_versions 24.11 26.05
    import sys

    for name in sys.argv[1:] or list(SUITES):
        begun = time.monotonic()
        built = install(name)
        print(f"Slurm {built.version} in {built.home} ({time.monotonic() - begun:.0f}s)")
