"""``hpcbridge stage``: the initializers of one job, run once on one node before ``hpcbridge launch``.

Each source (dataset, then model) is resolved to its current version, taken from the shared cache or
downloaded into it, and linked as ``<stagingDir>/jobs/<uid>/<role>`` (what HPCBRIDGE_DATASET_DIR and
HPCBRIDGE_MODEL_DIR name). ``jobs/<uid>/initializer.json`` says how far it got, for ``status``: the role being
fetched (with the bytes it has written so far), ``ready``, or ``failed`` with the initializer, its URI and the
reason. A failure exits :data:`STAGE_FAILED`, so the batch script ends there and the trainer never starts.

A tenant's job (``--tenant``, from the operator) stages under ``<stagingDir>/tenants/<tenant>/``: its own
``cache/`` and ``jobs/``, in a folder that must be its user's and is kept 0700, everything in it written
0600/0700 whatever the umask; its secrets are ``<secretsDir>/<namespace>/<name>``, its own namespace's only.
The initializers' env comes on stdin (``--env-stdin``), never on the command line.
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
from functools import partial
from pathlib import Path
from typing import Any

from bridge.api.names import check_dns1123_label
from bridge.api.storage import ROLES, StageSource, parse_storage_uri, secret_name_problem
from bridge.errors import InvalidSpec
from bridge.staging.cache import StageCache, cache_key, tree_size
from bridge.staging.phase import PHASE_FILE, job_root
from bridge.staging.sources import StageError, resolve

#: how often a download's progress (its bytes so far) goes into the phase file
PROGRESS_INTERVAL = 1.0
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
    #: the operator's tenant this job runs for (None: the CLI's job, today's shared layout)
    tenant: str | None = None
    #: the TrainJob's namespace: a tenant's secrets are read from its folder only
    namespace: str | None = None
    _secrets: set[str] = field(default_factory=set)

    @property
    def root(self) -> Path:
        return Path(job_root(str(self.staging_dir), self.tenant))

    @property
    def job_dir(self) -> Path:
        return self.root / "jobs" / self.uid

    def prepare(self) -> None:
        """A tenant's folder, made or checked before anything is written: its user's own, 0700. Another
        tenant could have made it first (``tenants/`` is everyone's, sticky): then it is refused, not used."""
        if self.tenant is None:
            return
        check_dns1123_label(self.tenant)
        tenants = self.root.parent
        if not tenants.is_dir():
            umask = os.umask(0o022)  # the folders above every tenant's: each tenant's user goes through them
            try:
                self.staging_dir.mkdir(parents=True, exist_ok=True)
                tenants.mkdir()
                tenants.chmod(0o1777)  # each tenant's user makes its own folder; none can move another's
            except FileExistsError:
                pass
            finally:
                os.umask(umask)
        try:
            self.root.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StageError(f"cannot create {self.root}: {exc.strerror} (the cluster admin can create it, owned "
                             f"by the tenant's user, mode 0700)") from None
        info = os.lstat(self.root)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise StageError(f"{self.root} is not a folder of this job's user (uid {os.getuid()}): refusing to "
                             "stage there (the cluster admin should remove it or give it to the tenant's user)")
        if info.st_mode & 0o077:
            self.root.chmod(0o700)
        for part in (self.root / "jobs", self.root / "cache"):
            part.mkdir(mode=0o700, exist_ok=True)

    def phase(self, **doc: object) -> None:
        self.job_dir.mkdir(parents=True, exist_ok=True, mode=0o700 if self.tenant else 0o777)
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
        problem = secret_name_problem(name)
        if problem:
            raise StageError(f"secret {name!r}: {problem}")
        folder = Path(os.path.expanduser(self.secrets_dir))
        if self.tenant is not None:
            # a tenant's job reads its own namespace's secrets, never another's nor the folder's top
            if not self.namespace:
                raise StageError(f"secret {name!r}: a tenant's job needs its namespace to find its secrets")
            folder = folder / check_dns1123_label(self.namespace)
        path = folder / name
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
        cache = StageCache(self.root, private=self.tenant is not None)
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
                key = cache_key(source.uri, resolved.version, resolved.selection, resolved.origin,
                                self.scope(source, settings))
                waiting = f"hpcbridge: {source.role}: another job is downloading {source.uri}; waiting"
                report = partial(self.phase, phase=source.role, uri=source.uri)
                entry, hit = cache.fill(key, source.uri, resolved.version, reporting(resolved.download, report),
                                        on_wait=partial(self.say, waiting), origin=resolved.origin)
                target, size = entry.data, entry.bytes
            _link(link, target)
            outcome = Outcome(source.role, source.uri, str(link), hit, size, time.monotonic() - started)
            outcomes.append(outcome)
            self.say(f"hpcbridge: {source.role} {source.uri}: " + _describe(outcome, resolved.in_place is not None))
        return outcomes

    def scope(self, source: StageSource, settings: Mapping[str, str]) -> dict[str, str | None]:
        """Whose credentials read a source, for its cache key: the tenant, its namespace, the secret's name and
        the S3 key id (never a secret value)."""
        return {"tenant": self.tenant, "namespace": self.namespace if self.tenant else None,
                "secret": source.secret, "keyId": settings.get("ACCESS_KEY_ID") or None}


def reporting(download: Callable[[Path], None], report: Callable[..., None],
              interval: float = PROGRESS_INTERVAL) -> Callable[[Path], None]:
    """*download* that, while it runs, calls ``report(bytes=…)`` every *interval* seconds with what it has
    written so far (the bytes under its folder, whatever the source), for the phase file and so for a live
    status line."""
    def run(into: Path) -> None:
        import threading

        done = threading.Event()

        def sample() -> None:
            while not done.wait(interval):
                try:
                    written = tree_size(into)[0]
                except OSError:  # a file renamed or removed while counted: the next sample counts it
                    continue
                report(bytes=written)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            download(into)
        finally:
            done.set()
            sampler.join()

    return run


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
        say: Callable[[str], None] | None = None, tenant: str | None = None, namespace: str | None = None) -> int:
    """The stage step's body: 0 when every source is staged, STAGE_FAILED (the reason said and recorded)."""
    given: dict[str, Any] = {"say": say} if say is not None else {}  # else Stager's own default
    stager = Stager(uid, Path(staging_dir), secrets_dir or DEFAULT_SECRETS_DIR, **given, tenant=tenant,
                    namespace=namespace)
    current = sources[0] if sources else StageSource("dataset", "")
    # a tenant's files are its own whatever umask the job inherited (the libraries that download follow it)
    umask = os.umask(0o077) if tenant is not None else None
    prepared = False
    try:
        stager.prepare()
        prepared = True
        for current in sources:
            stager.stage([current])
        stager.phase(phase="ready")
        return 0
    except (StageError, ValueError, OSError) as exc:
        reason = stager.scrub(f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror
                              else str(exc))
        if prepared:  # else the folder itself is what failed (perhaps not ours): only the job's log says why
            stager.phase(phase="failed", role=current.role, uri=current.uri, reason=reason)
        stager.say(f"hpcbridge: {current.role} initializer failed for {current.uri}: {reason}")
        return STAGE_FAILED
    finally:
        if umask is not None:
            os.umask(umask)


def read_env_document(text: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """The initializers' env as the stage step gets it on stdin: ``{"dataset": [[NAME, VALUE], …], "model": …}``
    (see bridge.plan.stage_input). ValueError when it is not that."""
    doc = json.loads(text) if text.strip() else {}
    if not isinstance(doc, dict) or not set(doc) <= set(ROLES):
        raise ValueError("a JSON object with 'dataset' and/or 'model'")
    found = {}
    for role, pairs in doc.items():
        if not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
            raise ValueError(f"{role}: a list of [NAME, VALUE] pairs")
        found[role] = tuple((name, value) for name, value in pairs)
    return found


def command_sources(job_id: str, tenant: str | None, namespace: str | None,
                    requested: Mapping[str, tuple[str | None, Sequence[str], str | None]],
                    env_stdin: Callable[[], str] | None = None) -> list[StageSource]:
    """What ``hpcbridge stage``'s arguments ask for, checked: the job's uid (it names a directory), the tenant
    and its namespace, and per role (*requested*: URI, NAME=VALUE env, secret name) with the initializers' env
    that *env_stdin* reads (``--env-stdin``). InvalidSpec naming the flag otherwise."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}", job_id):
        raise InvalidSpec("--job-id", job_id, "a TrainJob uid: letters, digits and '-' (it names a directory)")
    for flag, value in (("--tenant", tenant), ("--namespace", namespace)):
        try:
            if value is not None:
                check_dns1123_label(value)
        except ValueError as exc:
            raise InvalidSpec(flag, value, str(exc)) from None
    if tenant is not None and namespace is None:
        raise InvalidSpec("--namespace", None, "a tenant's job names its namespace (its secrets are read there)")
    # the initializers' env: on stdin from a rendered job, so no value is on this command line
    try:
        given = read_env_document(env_stdin()) if env_stdin is not None else {}
    except ValueError as exc:
        raise InvalidSpec("--env-stdin", "<stdin>", str(exc)) from None
    sources = []
    for role, (uri, env_items, secret) in requested.items():
        pairs = [item.split("=", 1) for item in env_items]
        if any(len(pair) != 2 for pair in pairs):
            raise InvalidSpec(f"--{role}-env", env_items, "each is NAME=VALUE")
        env = tuple((name, value) for name, value in pairs)
        if secret is not None and secret_name_problem(secret):
            raise InvalidSpec(f"--{role}-secret", secret, secret_name_problem(secret) or "")
        if uri:
            sources.append(StageSource(role, uri, (*env, *given.get(role, ())), secret))
    return sources


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
