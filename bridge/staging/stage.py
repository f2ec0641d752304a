"""``hpcbridge stage``: the initializers of one job, run once on one node before ``hpcbridge launch``.

Each source (dataset, then model) is resolved to its current version, taken from the shared cache or
downloaded into it, and linked as ``<stagingDir>/jobs/<uid>/<role>`` (what HPCBRIDGE_DATASET_DIR and
HPCBRIDGE_MODEL_DIR name). ``jobs/<uid>/initializer.json`` says how far it got, for ``status``: the role being
fetched, ``ready``, or ``failed`` with the initializer, its URI and the reason. A failure exits
:data:`STAGE_FAILED`, so the batch script ends there and the trainer never starts.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge.api.storage import StageSource, parse_storage_uri
from bridge.staging.cache import StageCache, cache_key
from bridge.staging.phase import PHASE_FILE
from bridge.staging.sources import StageError, resolve

#: the stage step's exit code when an initializer failed
STAGE_FAILED = 3
DEFAULT_SECRETS_DIR = "~/.config/hpcbridge/secrets"
#: variable names whose values are never printed, wherever they come from
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|ACCESS_KEY|CREDENTIAL)", re.IGNORECASE)


@dataclass
class Outcome:
    role: str
    uri: str
    path: str
    hit: bool
    bytes: int
    seconds: float


@dataclass
class Stager:
    uid: str
    staging_dir: Path
    secrets_dir: str = DEFAULT_SECRETS_DIR
    say: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))
    _secrets: set[str] = field(default_factory=set)

    @property
    def job_dir(self) -> Path:
        return self.staging_dir / "jobs" / self.uid

    def phase(self, **doc) -> None:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.job_dir / f".{PHASE_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"uid": self.uid, "time": time.time(), **doc}, sort_keys=True) + "\n",
                       encoding="utf-8")
        tmp.replace(self.job_dir / PHASE_FILE)

    def scrub(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def settings(self, source: StageSource) -> dict[str, str]:
        """The initializer's variables: its env, then its secret (as Kubernetes' envFrom adds it)."""
        settings = dict(source.env)
        for name, value in settings.items():
            if _SECRET_NAME.search(name) and value:
                self._secrets.add(value)
        if source.secret:
            settings.update(self.read_secret(source.secret))
        return settings

    def read_secret(self, name: str) -> dict[str, str]:
        path = Path(os.path.expanduser(self.secrets_dir)) / name
        try:
            info = path.stat()
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise StageError(f"secret {name!r}: cannot read {path}: {exc.strerror}") from None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise StageError(f"secret {name!r}: {path} is readable by others (mode {stat.filemode(info.st_mode)}); "
                             f"chmod 600 it")
        values: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.removeprefix("export ").partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
                raise StageError(f"secret {name!r}: line {number} of {path} is not KEY=value")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            values[key.strip()] = value
            if value:
                self._secrets.add(value)
        return values

    def stage(self, sources: Sequence[StageSource]) -> list[Outcome]:
        outcomes = []
        cache = StageCache(self.staging_dir)
        for source in sources:
            self.phase(phase=source.role, uri=source.uri)
            started = time.monotonic()
            settings = self.settings(source)
            location = parse_storage_uri(source.uri, source.role)
            resolved = resolve(location, source.role, settings)
            link = self.job_dir / source.role
            if resolved.in_place is not None:
                target, hit, size = resolved.in_place, True, 0
            else:
                key = cache_key(source.uri, resolved.version, resolved.selection)
                entry, hit = cache.fill(key, source.uri, resolved.version, resolved.download, on_wait=lambda s=source:
                                        self.say(f"hpcbridge: {s.role}: another job is downloading {s.uri}; waiting"))
                target, size = entry.data, entry.bytes
            _link(link, target)
            outcome = Outcome(source.role, source.uri, str(link), hit, size, time.monotonic() - started)
            outcomes.append(outcome)
            self.say(f"hpcbridge: {source.role} {source.uri}: " + _describe(outcome, resolved.in_place is not None))
        return outcomes


def _describe(outcome: Outcome, in_place: bool) -> str:
    if in_place:
        return f"used in place at {outcome.path}"
    size = f"{outcome.bytes / 2**20:.1f} MiB"
    if outcome.hit:
        return f"from the cache ({size}, {outcome.seconds * 1000:.0f} ms) at {outcome.path}"
    rate = outcome.bytes / 2**20 / outcome.seconds if outcome.seconds > 0 else 0.0
    return f"downloaded {size} in {outcome.seconds:.1f} s ({rate:.0f} MiB/s) to {outcome.path}"


def _link(link: Path, target: Path) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    tmp.replace(link)  # a rerun of the job re-points it in one step


def run(uid: str, staging_dir: str, sources: Sequence[StageSource], secrets_dir: str | None = None,
        say: Callable[[str], None] | None = None) -> int:
    """The stage step's body: 0 when every source is staged, STAGE_FAILED (the reason said and recorded)."""
    stager = Stager(uid, Path(staging_dir), secrets_dir or DEFAULT_SECRETS_DIR,
                    **({"say": say} if say is not None else {}))
    current = sources[0] if sources else StageSource("dataset", "")
    try:
        for current in sources:
            stager.stage([current])
        stager.phase(phase="ready")
        return 0
    except (StageError, ValueError, OSError) as exc:
        reason = stager.scrub(f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror
                              else str(exc))
        stager.phase(phase="failed", role=current.role, uri=current.uri, reason=reason)
        stager.say(f"hpcbridge: {current.role} initializer failed for {current.uri}: {reason}")
        return STAGE_FAILED


def initialize(role: str, into: str | None = None, env: Mapping[str, str] | None = None,
               say: Callable[[str], None] | None = None) -> int:
    """Kubeflow's initializer contract, for a pod: ``STORAGE_URI`` and the initializer's variables in the
    environment, the data into ``/workspace/<role>`` (the ``initializer`` volume). hpc-bridge's node image runs
    this where Kubeflow's initializer images cannot be pulled. No cache: the volume is the job's own. The reason
    of a failure also goes to the container's termination message, which the pod's status carries."""
    import shutil

    env = dict(os.environ if env is None else env)
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    target = Path(into or f"/workspace/{role}")
    uri = env.get("STORAGE_URI", "")
    stager = Stager("", target.parent, say=say)
    for name, value in env.items():
        if _SECRET_NAME.search(name) and value:
            stager._secrets.add(value)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        if not uri:
            raise StageError("STORAGE_URI is not set")
        started = time.monotonic()
        resolved = resolve(parse_storage_uri(uri, role), role, env)
        if resolved.in_place is not None:
            raise StageError("a path is used in place by the trainer; there is nothing to initialize")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        resolved.download(partial)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)  # a rerun of the job: the volume keeps the last run's copy
        partial.rename(target)
        from bridge.staging.cache import tree_size

        size, files = tree_size(target)
        say(f"hpcbridge: {role} {uri}: downloaded {size / 2**20:.1f} MiB ({files} files) in "
            f"{time.monotonic() - started:.1f} s to {target}")
        return 0
    except (StageError, ValueError, OSError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        reason = stager.scrub(f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror
                              else str(exc))
        line = f"the {role} initializer failed for {uri}: {reason}"
        say(f"hpcbridge: {line}")
        try:
            Path("/dev/termination-log").write_text(line)
        except OSError:
            pass  # not in a pod
        return STAGE_FAILED
