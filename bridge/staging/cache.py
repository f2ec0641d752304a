"""The shared staging cache: one copy of each dataset or model version on the cluster's shared storage.

Layout under ``<stagingDir>/cache/`` (a tenant's: ``<stagingDir>/tenants/<tenant>/cache/``, see
bridge.staging.stage): ``<key>/`` holds a finished entry (``entry.json`` and ``data/``), where *key* hashes the
URI, the version the source reported (a Hugging Face commit, the S3 objects' ETags), what was selected from it,
where it came from (the endpoint that answered, the bucket or repository) and whose credentials read it (tenant,
namespace, secret name, key id): a listing one endpoint reports never stands for another endpoint's bytes. A download goes to ``.partial-<key>-<host>-<pid>/`` and becomes ``<key>/`` by one
rename, so a reader sees a whole entry or none. ``.locks/<key>.lock`` (flock) makes two jobs that start
together download once: the second waits, then finds the entry. flock works across nodes on NFSv4 and on
Lustre mounted with ``-o flock``; on a filesystem without it every job downloads its own copy, still atomically.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheEntry:
    key: str
    uri: str
    version: str
    bytes: int
    files: int
    created: float
    last_used: float
    path: Path

    @property
    def data(self) -> Path:
        return self.path / "data"


#: what a key covers, versioned: entries keyed before the origin and scope were in it are never found again
KEY_FORMAT = 2


def cache_key(uri: str, version: str, selection: object = None, origin: Mapping[str, object] | None = None,
              scope: Mapping[str, object] | None = None) -> str:
    """The entry's name: *origin* is where the bytes come from (endpoint, bucket or repository), *scope* whose
    credentials read them; both are in it, since the version alone is whatever that endpoint chose to report."""
    text = json.dumps({"format": KEY_FORMAT, "uri": uri, "version": version, "selection": selection,
                       "origin": dict(origin or {}), "scope": dict(scope or {})},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def make_private(root: Path) -> None:
    """Nothing under *root* readable by group or others, whatever the umask and the library that wrote it."""
    for directory, dirs, names in os.walk(root):
        for name in (*dirs, *names):
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)
    info = os.lstat(root)
    if info.st_mode & 0o077:
        os.chmod(root, stat.S_IMODE(info.st_mode) & 0o700)


def size_text(count: float) -> str:
    """A byte count as people read it: 512 B, 1.5 KiB, … GiB at most."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def tree_size(root: Path) -> tuple[int, int]:
    """Bytes and files under *root* (symlinks not followed)."""
    total = files = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            total += os.lstat(os.path.join(directory, name)).st_size
            files += 1
    return total, files


class StageCache:
    def __init__(self, staging_dir: str | os.PathLike[str], private: bool = False) -> None:
        self.dir = Path(staging_dir) / "cache"
        #: a tenant's cache: its folders 0700, its files 0600 (the stage step checked the folder above is its own)
        self.private = private

    def _mkdir(self, path: Path) -> None:
        if not self.private:
            path.mkdir(parents=True, exist_ok=True)
            return
        for part in (self.dir, *([path] if path != self.dir else [])):
            try:
                part.mkdir(mode=0o700)
            except FileExistsError:
                pass
            if part.stat().st_mode & 0o077:
                part.chmod(0o700)

    def _entry(self, key: str) -> CacheEntry | None:
        path = self.dir / key
        try:
            doc = json.loads((path / "entry.json").read_text(encoding="utf-8"))
            used = (path / "used").stat().st_mtime
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        return CacheEntry(key, doc["uri"], doc["version"], doc["bytes"], doc["files"], doc["created"], used, path)

    def lookup(self, key: str) -> CacheEntry | None:
        """The finished entry, its last use now recorded; None if there is none."""
        entry = self._entry(key)
        if entry is not None:
            try:
                os.utime(entry.path / "used")
            except FileNotFoundError:
                return None  # pruned between the read and now
        return entry

    @contextmanager
    def _lock(self, key: str, blocking: bool = True, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
        locks = self.dir / ".locks"
        self._mkdir(locks)
        with open(os.open(locks / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600), "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if not blocking:
                    yield False
                    return
                if on_wait:
                    on_wait()
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def fill(self, key: str, uri: str, version: str, download: Callable[[Path], None],
             on_wait: Callable[[], None] | None = None, origin: Mapping[str, object] | None = None,
             ) -> tuple[CacheEntry, bool]:
        """The entry for *key*, downloading it with *download(into)* if no job has yet; and whether it was
        already there (a hit, or another job's download that this one waited for)."""
        entry = self.lookup(key)
        if entry is not None:
            return entry, True
        with self._lock(key, on_wait=on_wait):
            entry = self.lookup(key)
            if entry is not None:
                return entry, True
            for stale in self.dir.glob(f".partial-{key}-*"):
                shutil.rmtree(stale, ignore_errors=True)  # a download that died: the lock says nobody owns it
            partial = self.dir / f".partial-{key}-{socket.gethostname()}-{os.getpid()}"
            (partial / "data").mkdir(parents=True, mode=0o700 if self.private else 0o777)
            try:
                download(partial / "data")
                if self.private:
                    make_private(partial)
                size, files = tree_size(partial / "data")
                doc = {"uri": uri, "version": version, "bytes": size, "files": files, "created": time.time(),
                       **({"origin": dict(origin)} if origin else {})}
                (partial / "entry.json").write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
                (partial / "used").touch()
                os.rename(partial, self.dir / key)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
        entry = self._entry(key)
        assert entry is not None
        return entry, False

    def entries(self) -> list[CacheEntry]:
        if not self.dir.is_dir():
            return []
        found = (self._entry(path.name) for path in sorted(self.dir.iterdir()) if not path.name.startswith("."))
        return sorted((e for e in found if e is not None), key=lambda e: e.last_used, reverse=True)

    def prune(self, older_than: float | None, now: float | None = None, dry_run: bool = False) -> list[CacheEntry]:
        """Remove entries not used for *older_than* seconds (None: every entry). An entry being downloaded
        or waited for (its lock held) is kept. Removal is a rename first: a job looking it up sees the entry or
        nothing, never half of one."""
        now = time.time() if now is None else now
        removed = []
        for entry in self.entries():
            if older_than is not None and now - entry.last_used < older_than:
                continue
            with self._lock(entry.key, blocking=False) as locked:
                if not locked:
                    continue
                if dry_run:
                    removed.append(entry)
                    continue
                trash = self.dir / f".trash-{entry.key}-{os.getpid()}"
                try:
                    os.rename(entry.path, trash)
                except FileNotFoundError:
                    continue
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(entry)
        return removed
