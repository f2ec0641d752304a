"""Running hostile inputs through the CLI and judging what comes out.

Two ways to run one command, both under the same bound (``RLIMIT_AS`` ~1 GiB more than the interpreter already
maps, ``RLIMIT_CPU`` 20 s, set in the child before anything of the input is read):

* ``fork``: the harness process (with hpc-bridge already imported) forks; the child redirects its standard
  streams to files, sets the limits and environment and calls ``bridge.cli.main(argv)`` exactly as the console
  script does. An exception escaping ``main`` is printed as a traceback, as the interpreter would. This is ~10×
  cheaper than a new interpreter, and the child records the ``#SBATCH`` options the renderer meant
  (``bridge.adapters.slurm.render.directives``) so the script can be checked against them.
* ``subprocess``: ``.venv/bin/python -m bridge …`` with the limits set in ``preexec_fn`` — the real entry point;
  used for the exhaustion candidates and a regular sample of the rest.

A run that the bound kills (SIGXCPU/SIGKILL, or a MemoryError when RLIMIT_AS refuses memory) is a failure of
its own kind; nothing here ever asserts wall-clock time (a generous wall guard only keeps a hung run from
hanging the harness, and counts it as over the bound).

Oracles (``judge``): exit code 0 or 2 only; no traceback; every stderr line is one ``hpcbridge: note:`` or
``hpcbridge: error:`` line and a refusal (exit 2) ends with exactly one error line; for an accepted run every
shell script it rendered (Slurm script, slurmrestd ``script``, Flux ``attributes.system.files.script.data``) runs
under ``bash -x`` in a sandbox whose PATH holds only stubs (and a real ``touch``) without creating the case's
marker file; a Slurm script's ``#SBATCH`` block, read by hpc-bridge's own parser and by a plain line scan, holds
exactly the options the renderer meant, no control character and no privileged option (``--uid``, ``--gid``,
``--get-user-env``); Kubernetes objects are kept for ``check_kubernetes`` (dry-run create on a real API server).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import io
import json
import os
import re
import resource
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.fuzz.generator import FILE, Case

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable

#: the bound of one run: address space on top of what the interpreter maps at the start, and CPU seconds
AS_LIMIT = 1 << 30
CPU_LIMIT = 20
#: only so a run that blocks without using CPU cannot hang the harness; such a run counts as over the bound
WALL_GUARD = 120.0
#: options that make a job run as another user or with another user's login environment
PRIVILEGED = frozenset({"uid", "gid", "get-user-env"})
#: characters that end a line for some reader (str.splitlines) or that sbatch's tokenizer takes as a blank
_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
STUBS = ("hpcbridge", "srun", "mpirun", "mpiexec", "mpiexec.hydra", "flux", "python3", "python", "torchrun",
         "apptainer", "singularity", "podman", "enroot", "sh", "bash", "env", "id", "getent", "cut", "sleep", "cat")

# finding kinds; the first four are the failures the issue counts
INJECTION = "injection"            # a payload ran, or a value became (or broke) a #SBATCH directive
TRACEBACK = "traceback"            # an exception escaped, or the process crashed on a signal
OVER_BOUND = "over-bound"          # the time/memory bound stopped the run
API_REFUSAL = "api-refusal"        # hpc-bridge accepted an object the API server refuses
EXIT_CODE = "exit-code"            # an exit code other than 0 or 2 (or 1 for a backend not reached)
#: a submit's dry run asks the cluster as submit would (its jobs by uid, its scheduler): where the configured
#: cluster cannot be reached (here no flux command, an ssh host that does not exist) it ends as submit does, with
#: the typed, retryable error and exit 1
BACKEND_NOT_REACHED = re.compile(r"^hpcbridge: error: [\w.-]+ unavailable: ")
STDERR = "stderr"                  # not one line per message, or a refusal without exactly one error line
OUTPUT = "output"                  # an accepted run whose artifact cannot be read back
API_ERROR = "api-error"            # the API server failed (5xx, webhook unreachable): not a verdict on the object
FAILURE_KINDS = (INJECTION, TRACEBACK, OVER_BOUND, API_REFUSAL)


@dataclass(frozen=True)
class Finding:
    kind: str
    case: Case
    command: str
    detail: str

    def line(self, runs: int = 1, payloads: Sequence[str] = ()) -> str:
        """One line for /tmp/fuzz-findings.txt: command, input kind, field, what happened, one example."""
        detail = " ".join(self.detail.split())[:300]
        seen = f"; {runs} runs" if runs > 1 else ""
        if len(payloads) > 1:
            seen += f"; payloads {','.join(sorted(set(payloads))[:8])}"
        return (f"[fuzz#24] {self.command} | input {self.case.kind} ({self.case.payload}{seen}) | field "
                f"{self.case.field} | {self.kind}: {detail} | example: {self.case.describe(100)}")

    @property
    def signature(self) -> tuple[str, str, str]:
        """What makes two findings the same problem: the failure, where the value came in, and its class
        (payload ran / privileged option / directive broken; the exception type; the API server's reason)."""
        detail = self.detail
        if self.kind == INJECTION:
            what = "payload ran" if "payload ran" in detail else "privileged" if "privileged" in detail \
                else "directive"
        elif self.kind == TRACEBACK:  # the same exception and message is one problem, whichever field
            match = re.search(r"\w+(?:Error|Exception|Warning|Exit|Interrupt)\b.*", detail)
            what = " ".join(re.sub(r"[0-9]+|'[^']*'", "#", match.group() if match else detail).split()[:6])
            return (self.kind, "", what)
        else:
            what = " ".join(re.sub(r"[0-9]+|'[^']*'|\"[^\"]*\"|\([^)]*\)", "#", detail).split()[:5])
        where = self.case.kind if self.case.kind in ("sbatch", "flags") else f"{self.case.kind}:{self.case.field}"
        return (self.kind, where, what)


@dataclass
class Run:
    case: Case
    argv: tuple[str, ...]
    mode: str
    returncode: int | None
    #: the signal that ended the process, if one did
    signal: int | None
    stdout: bytes
    stderr: bytes
    #: #SBATCH options the renderer meant, one list per render_script call (fork runs only)
    directives: list[list[list[Any]]] | None = None
    guard_tripped: bool = False

    @property
    def command(self) -> str:
        return " ".join("<file>" if a == self.case.filename or a == "-" else a for a in self.argv)

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "backslashreplace")


@dataclass
class CaseResult:
    case: Case
    runs: list[Run] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: rendered Kubernetes objects, with the command that rendered them
    kube_objects: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


# --- running -----------------------------------------------------------------------------------------------


def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def set_limits(address_space: int = AS_LIMIT) -> None:
    """The bound of one run (called in the child before it reads anything of the input)."""
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _fork_child(argv: Sequence[str], env: dict[str, str], cwd: str, stdin_path: str, out_fd: int, err_fd: int,
                directives_path: str) -> None:
    """In the forked child: become `hpcbridge argv` and exit with its code. Never returns."""
    code = 1
    try:
        os.chdir(cwd)
        os.dup2(os.open(stdin_path, os.O_RDONLY), 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.environ.clear()
        os.environ.update(env)
        set_limits(_vm_size() + AS_LIMIT)
        # the standard streams a fresh interpreter gets in a C.UTF-8 locale
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="surrogateescape")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="surrogateescape")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        sys.argv = ["hpcbridge", *argv]
        _record_directives(directives_path)
        from bridge import cli

        try:
            result = cli.main(list(argv))
            code = 0 if result is None else int(result)
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # what the interpreter does with an exception that escapes main
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            with contextlib.suppress(BaseException):
                os.write(2, ("Exception ignored on flushing sys.stdout:\n" + traceback.format_exc()).encode())
            code = 120
    except BaseException:
        with contextlib.suppress(BaseException):
            os.write(2, ("harness child failed:\n" + traceback.format_exc()).encode())
        code = 111
    finally:
        os._exit(code)


def _record_directives(path: str) -> None:
    import bridge.adapters.slurm.render as slurm_render

    original = slurm_render.directives

    def recording(plan):
        options = original(plan)
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps([[name, value] for name, value in options], ensure_ascii=True) + "\n")
        return options

    slurm_render.directives = recording


def _wait(pid: int, guard: float) -> tuple[int, bool]:
    """waitpid with a wall guard (pidfd, no threads); returns (status, guard tripped)."""
    tripped = False
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            if not poller.poll(guard * 1000):
                tripped = True
                os.kill(pid, signal.SIGKILL)
        finally:
            os.close(pidfd)
    else:  # pragma: no cover - kernels without pidfd
        deadline = time.monotonic() + guard
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                tripped = True
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.002)
    _, status = os.waitpid(pid, 0)
    return status, tripped


def run_fork(case: Case, argv: Sequence[str], env: dict[str, str], cwd: Path, stdin_path: str) -> Run:
    directives_path = str(cwd / ".directives.jsonl")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directives_path)
    with tempfile.TemporaryFile(dir=cwd) as out, tempfile.TemporaryFile(dir=cwd) as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _fork_child(argv, env, str(cwd), stdin_path, out.fileno(), err.fileno(), directives_path)
        status, tripped = _wait(pid, WALL_GUARD)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    directives = None
    with contextlib.suppress(FileNotFoundError):
        with open(directives_path, encoding="utf-8") as recorded:
            directives = [json.loads(line) for line in recorded if line.strip()]
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    return Run(case, tuple(argv), "fork", code, sig, stdout, stderr, directives or [], tripped)


def run_subprocess(case: Case, argv: Sequence[str], env: dict[str, str], cwd: Path, stdin_path: str) -> Run:
    with open(stdin_path, "rb") as stdin:
        proc = subprocess.Popen([PYTHON, "-m", "bridge", *argv], cwd=cwd, env=env, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=set_limits)
        tripped = False
        try:
            stdout, stderr = proc.communicate(timeout=WALL_GUARD)
        except subprocess.TimeoutExpired:
            tripped = True
            proc.kill()
            stdout, stderr = proc.communicate()
    code = proc.returncode
    return Run(case, tuple(argv), "subprocess", code if code >= 0 else None, -code if code < 0 else None,
               stdout, stderr, None, tripped)


def prepare_workspace(case: Case, base: Path) -> tuple[Path, dict[str, str], str]:
    """The case's directory (input file, config, private HOME and XDG dirs), its environment, its stdin path."""
    work = base / f"case-{case.index:04d}"
    work.mkdir(parents=True, exist_ok=True)
    (work / case.filename).write_bytes(case.data)
    for sub in ("home", "state", "config"):
        (work / sub).mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work / "home"), "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "XDG_STATE_HOME": str(work / "state"), "XDG_CONFIG_HOME": str(work / "config"),
           "USER": "fuzz", "PYTHONPATH": str(ROOT)}
    if case.config is not None:
        (work / "clusters.yaml").write_bytes(case.config)
        env["HPCBRIDGE_CONFIG"] = str(work / "clusters.yaml")
    stdin_path = str(work / case.filename) if case.stdin else os.devnull
    return work, env, stdin_path


def argv_for(case: Case, template: Sequence[str]) -> list[str]:
    target = "-" if case.stdin else case.filename
    argv = [target if part == FILE else part for part in template]
    if case.flags:
        argv.extend(case.flags)
    return argv


# --- judging -----------------------------------------------------------------------------------------------


def judge_process(run: Run) -> list[Finding]:
    """The oracles every run must pass, accepted or refused."""
    case, command, text = run.case, run.command, run.stderr_text
    findings: list[Finding] = []
    tail = text.strip().splitlines()[-1] if text.strip() else ""
    if run.guard_tripped or run.signal in (signal.SIGXCPU, signal.SIGKILL) or "MemoryError" in tail:
        why = "wall guard" if run.guard_tripped else f"signal {run.signal}" if run.signal else tail
        return [Finding(OVER_BOUND, case, command, f"stopped by the bound ({why})")]
    if run.signal is not None:
        return [Finding(TRACEBACK, case, command, f"crashed on signal {run.signal}")]
    if "Traceback (most recent call last)" in text or run.returncode in (111, 120):
        return [Finding(TRACEBACK, case, command, f"exit {run.returncode}: {tail[:200]}")]
    unreached = run.returncode == 1 and run.argv[0] == "submit" and BACKEND_NOT_REACHED.match(tail) is not None
    if run.returncode not in (0, 2) and not unreached:
        findings.append(Finding(EXIT_CODE, case, command, f"exit {run.returncode}: {tail[:200]}"))
    lines = text.splitlines()
    stray = [line for line in lines if not line.startswith(("hpcbridge: note: ", "hpcbridge: error: "))]
    errors = [line for line in lines if line.startswith("hpcbridge: error: ")]
    if stray:
        findings.append(Finding(STDERR, case, command, f"exit {run.returncode}: {len(lines)} stderr lines, "
                                f"{len(stray)} not hpcbridge messages (a message spans lines): {stray[0][:120]!r}"))
    elif run.returncode in (1, 2) and (len(errors) != 1 or not lines[-1].startswith("hpcbridge: error: ")):
        findings.append(Finding(STDERR, case, command, f"refusal with {len(errors)} error lines"))
    elif run.returncode == 0 and errors:
        findings.append(Finding(STDERR, case, command, "exit 0 with an error line"))
    return findings


@dataclass(frozen=True)
class Artifacts:
    #: (backend, script text) for every shell script the run rendered
    scripts: list[tuple[str, str]]
    #: Kubernetes objects
    objects: list[dict[str, Any]]
    #: (sbatch argv, script) for a batch script sent as it is (Slurm's verbatim path)
    verbatim: list[tuple[list[str], str]] = field(default_factory=list)


def extract(run: Run) -> Artifacts:
    """The artifacts of an accepted run, from its stdout (json for render/submit, text for convert)."""
    argv = run.argv
    out = run.stdout.decode("utf-8", "surrogateescape")
    scripts: list[tuple[str, str]] = []
    objects: list[dict[str, Any]] = []
    verbatim: list[tuple[list[str], str]] = []
    if argv[0] in ("render", "submit"):
        document = json.loads(out)
        if document.get("command"):
            verbatim.append((document["command"], document["files"][0]["content"]))
            return Artifacts(scripts, objects, verbatim)
        for item in document["files"]:
            _classify(document["backend"], item["mediaType"], item["content"], scripts, objects)
    elif argv[0] == "convert":
        to = argv[argv.index("--to") + 1]
        if to == "sbatch" and out.startswith("# --- command ---\n"):
            command_line, _, rest = out[len("# --- command ---\n"):].partition("\n")
            verbatim.append((shlex.split(command_line), rest.split("\n", 1)[1]))
        elif to == "sbatch":
            _classify("slurm", "text/x-shellscript", out, scripts, objects)
        elif to == "jobspec":
            _classify("flux", "application/json", out, scripts, objects)
        elif to == "jobset":
            _classify("kubernetes", "application/yaml", out, scripts, objects)
        else:
            yaml.safe_load_all(out)
    return Artifacts(scripts, objects, verbatim)


def check_verbatim(run: Run, command: list[str], script: str) -> list[Finding]:
    """A batch script sent as it is: the very bytes given, and an sbatch argv (no shell) of the user's flags
    as given plus hpc-bridge's identity and the file — no value of the script's reaches a command line."""
    case = run.case
    problems = []
    if script.encode("utf-8", "surrogateescape") != case.data:
        problems.append("the script sent is not the script given")
    # the -- that puts sbatch's -o after hpcbridge's own options is hpcbridge's, not sbatch's
    flags = [flag for flag in case.flags if flag != "--"] if run.argv[0] in ("submit", "convert") else []
    head = ["sbatch", "--parsable", *flags]
    rest = command[len(head):]
    if command[:len(head)] != head or not rest or not rest[0].startswith("--comment=") \
            or re.search(r"(?:^| )hpcbridge\.io/uid=[0-9a-f-]{36}$", rest[0].removeprefix("--comment=")) is None \
            or any(not (arg.startswith("--job-name=") or os.path.isabs(arg)) for arg in rest[1:]) or len(rest) > 2:
        problems.append(f"the sbatch command is not the user's flags plus the identity: {command!r}"[:300])
    return [Finding(INJECTION, case, run.command, problem) for problem in problems]


def _classify(backend: str, media_type: str, content: str, scripts: list, objects: list) -> None:
    if media_type == "text/x-shellscript":
        scripts.append((backend, content))
    elif backend == "flux" and media_type == "application/json":
        spec = json.loads(content)
        files = spec["attributes"]["system"].get("files") or {}
        for item in files.values():
            scripts.append(("flux", item["data"]))
    elif backend == "slurm" and media_type == "application/json":
        body = json.loads(content)
        if "script" in body:
            scripts.append(("slurm", body["script"]))
    elif backend == "kubernetes":
        objects.extend(doc for doc in yaml.load_all(content, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
                       if doc)


class Sandbox:
    """Runs scripts under ``bash -x`` with stubs on PATH; remembers verdicts by (script, marker)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.stubs = base / "stubs"
        self.stubs.mkdir(parents=True, exist_ok=True)
        for name in STUBS:
            stub = self.stubs / name
            stub.write_text("#!/bin/sh\nexit 0\n")
            stub.chmod(0o755)
        touch = shutil.which("touch") or "/usr/bin/touch"
        with contextlib.suppress(FileExistsError):
            (self.stubs / "touch").symlink_to(touch)
        self.cache: dict[tuple[str, str], str | None] = {}
        self.executed = 0

    def run(self, script: str, marker: str) -> str | None:
        """None when no marker appeared; else what was created (and the trace's last lines)."""
        key = (hashlib.sha256(script.encode("utf-8", "surrogatepass")).hexdigest(), marker)
        if key in self.cache:
            return self.cache[key]
        box = Path(tempfile.mkdtemp(prefix="sandbox-", dir=self.base))
        try:
            path = box / "job.sh"
            path.write_bytes(script.encode("utf-8", "surrogateescape"))
            env = {"PATH": str(self.stubs), "HOME": str(box), "USER": "fuzz", "LANG": "C.UTF-8",
                   "SLURM_JOB_ID": "1", "FLUX_URI": "local:///nonexistent"}
            try:
                proc = subprocess.run(["/bin/bash", "-x", str(path)], cwd=box, env=env, stdin=subprocess.DEVNULL,
                                      capture_output=True, timeout=60, preexec_fn=set_limits)
                trace = proc.stderr.decode("utf-8", "backslashreplace")
            except subprocess.TimeoutExpired:
                trace = "(timed out)"
            self.executed += 1
            created = sorted(str(p.relative_to(box)) for p in box.rglob("FZMARK*"))
            verdict = None
            if created:
                last = [line for line in trace.splitlines() if "FZMARK" in line][:2]
                verdict = f"payload ran: created {', '.join(created)} (bash -x: {' / '.join(last)[:160]})"
        finally:
            shutil.rmtree(box, ignore_errors=True)
        self.cache[key] = verdict
        return verdict


def _lookup(name: str) -> str:
    """An option name as sbatch's getopt_long resolves it (unique prefix), via hpc-bridge's option table."""
    from bridge.sbatch.options import OPTIONS

    if name in OPTIONS:
        return name
    matches = sorted({opt for opt in OPTIONS if opt.startswith(name)})
    return matches[0] if len(matches) == 1 else name


def check_directives(run: Run, script: str) -> list[Finding]:
    """The #SBATCH block of a rendered Slurm script holds exactly what the renderer meant, and nothing privileged."""
    from bridge.errors import InvalidSpec
    from bridge.sbatch.directives import parse_flags
    from bridge.sbatch.script import parse_script

    case, command = run.case, run.command
    findings: list[Finding] = []
    lines = script.split("\n")
    block = [line for line in lines if line.startswith("#SBATCH")]
    for line in block:
        if _LINE_BREAKS.search(line):
            findings.append(Finding(INJECTION, case, command, f"control or line-break character in a directive: "
                                    f"{line[:120]!r}"))
            break
    scanned = [_lookup(line[len("#SBATCH --"):].split("=", 1)[0].split(" ", 1)[0]) for line in block
               if line.startswith("#SBATCH --")]
    if len(scanned) != len(block):
        findings.append(Finding(INJECTION, case, command, "a #SBATCH line that is not one --option: "
                                f"{[b for b in block if not b.startswith('#SBATCH --')][0][:120]!r}"))
    try:
        parsed = parse_script(script, "rendered")
        got = {name: d.value for name, d in parsed.options.items()}
    except InvalidSpec as exc:
        findings.append(Finding(INJECTION, case, command, f"the rendered #SBATCH block does not parse back: {exc}"))
        got = None
    privileged = sorted((set(got or {}) | set(scanned)) & PRIVILEGED)
    if privileged:
        findings.append(Finding(INJECTION, case, command, f"privileged directive in the script: "
                                f"{', '.join('--' + p for p in privileged)}"))
    if run.directives:
        meant = run.directives[-1]
        meant_names = [_lookup(name) for name, _ in meant]
        if scanned != meant_names:
            extra = [n for n in scanned if n not in meant_names] or scanned[len(meant_names):]
            findings.append(Finding(INJECTION, case, command, f"line scan finds #SBATCH options the renderer did "
                                    f"not write: {extra[:4]} (meant {len(meant_names)}, found {len(scanned)})"))
        if got is not None:
            argv = [f"--{name}" if value is None else f"--{name}={value}" for name, value in meant]
            try:
                wanted = {name: d.value for name, d in parse_flags(argv).options.items()}
            except InvalidSpec:
                wanted = None  # the renderer meant something sbatch itself would refuse: compare names only
            if wanted is not None and got != wanted:
                diff = sorted(set(got.items()) ^ set(wanted.items()), key=str)[:3]
                findings.append(Finding(INJECTION, case, command,
                                        f"#SBATCH options differ from what the renderer meant: {diff!r}"[:300]))
            elif wanted is None and set(got) != {_lookup(n) for n in meant_names}:
                findings.append(Finding(INJECTION, case, command, "#SBATCH option names differ from the renderer's"))
    return findings


#: what the Kubernetes adapter puts into the MPI Secret at submit time (render leaves it empty: keys are secret)
_SSH_DATA = {"ssh-privatekey": base64.b64encode(b"-----BEGIN OPENSSH PRIVATE KEY-----\nfuzz\n"
                                                b"-----END OPENSSH PRIVATE KEY-----\n").decode(),
             "ssh-publickey": base64.b64encode(b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFuzz fuzz\n").decode()}


def as_submitted(obj: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """A rendered object as the Kubernetes adapter's submit sends it (bridge/adapters/kubernetes
    ``_create_all``): the cluster's namespace, and the MPI Secret with its keys."""
    obj = copy.deepcopy(obj)
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else None
    if metadata is not None and namespace:
        metadata["namespace"] = namespace
    if obj.get("kind") == "Secret" and obj.get("type") == "kubernetes.io/ssh-auth":
        obj["data"] = dict(_SSH_DATA)
        if metadata is not None and isinstance(metadata.get("annotations"), dict):
            metadata["annotations"].pop("hpcbridge.io/ssh-keys", None)
    return obj


def _submit_namespace(run: Run) -> str | None:
    """The namespace a configured kubernetes cluster submits to (``spec.kubernetes.namespace``), when the run
    rendered for the configured cluster rather than ``--to`` a backend type."""
    if "--to" in run.argv or run.case.config is None:
        return None
    try:
        documents = list(yaml.safe_load_all(run.case.config))
    except yaml.YAMLError:
        return None
    for doc in documents:
        spec = doc.get("spec") if isinstance(doc, dict) else None
        if isinstance(spec, dict) and spec.get("type") == "kubernetes" and isinstance(spec.get("kubernetes"), dict):
            namespace = spec["kubernetes"].get("namespace")
            return namespace if isinstance(namespace, str) and namespace else None
    return None


def judge(run: Run, sandbox: Sandbox, result: CaseResult) -> None:
    """Every oracle on one run; findings and Kubernetes objects go into *result*."""
    findings = judge_process(run)
    if run.returncode == 0 and not findings:
        try:
            artifacts = extract(run)
        except Exception as exc:  # noqa: BLE001 - an accepted run whose artifact we cannot read is a finding
            findings.append(Finding(OUTPUT, run.case, run.command, f"artifact does not read back: "
                                    f"{type(exc).__name__}: {exc}"[:200]))
        else:
            for command, script in artifacts.verbatim:
                findings.extend(check_verbatim(run, command, script))
            for backend, script in artifacts.scripts:
                verdict = sandbox.run(script, run.case.marker)
                if verdict:
                    findings.append(Finding(INJECTION, run.case, run.command, f"{backend} script: {verdict}"))
                if backend == "slurm":
                    findings.extend(check_directives(run, script))
            namespace = _submit_namespace(run)
            result.kube_objects.extend((run.command, as_submitted(obj, namespace)) for obj in artifacts.objects)
    result.findings.extend(findings)


def run_case(case: Case, base: Path, sandbox: Sandbox, *, subprocess_every: int = 0,
             only: Callable[[tuple[str, ...]], bool] | None = None) -> CaseResult:
    """Every command of *case*; heavy cases (and every *subprocess_every*-th) through the real entry point."""
    work, env, stdin_path = prepare_workspace(case, base)
    result = CaseResult(case)
    real = case.heavy or (subprocess_every and case.index % subprocess_every == 1)
    try:
        for template in case.commands:
            if only is not None and not only(template):
                continue
            argv = argv_for(case, template)
            run = (run_subprocess if real else run_fork)(case, argv, env, work, stdin_path)
            result.runs.append(run)
            judge(run, sandbox, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


# --- the API server ----------------------------------------------------------------------------------------


def check_kubernetes(results: Iterable[CaseResult], api: Any, *, log: Callable[[str], None] | None = None) \
        -> tuple[list[Finding], int]:
    """Dry-run create every distinct rendered object on the real API server; (findings, objects checked).

    A namespace the objects name is created for real first (dry-run needs it to exist); a namespace the API
    server refuses makes every object in it a refusal. Namespaces created here are deleted at the end.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    findings: list[Finding] = []
    seen: dict[str, str | None] = {}
    namespaces: dict[str, str | None] = {}
    created: list[str] = []
    checked = 0

    def namespace_problem(name: str) -> str | None:
        if name in namespaces:
            return namespaces[name]
        problem = None
        try:
            core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                try:
                    core.create_namespace({"metadata": {"name": name, "labels": {"hpcbridge.test/fuzz": "true"}}})
                    created.append(name)
                except ApiException as inner:
                    problem = f"namespace {name!r} refused: {_api_message(inner)}"
            else:
                problem = f"namespace {name!r} refused: {_api_message(exc)}"
        except ValueError as exc:  # the client refuses to build the URL (e.g. a NUL or '/')
            problem = f"namespace {name!r} cannot be addressed: {exc}"
        namespaces[name] = problem
        return problem

    def create(obj: dict[str, Any], namespace: str) -> None:
        kind = obj.get("kind")
        if kind == "JobSet":
            group, version = obj["apiVersion"].split("/")
            custom.create_namespaced_custom_object(group, version, namespace, "jobsets", obj, dry_run="All")
        elif kind == "Secret":
            core.create_namespaced_secret(namespace, obj, dry_run="All")
        elif kind == "ConfigMap":
            core.create_namespaced_config_map(namespace, obj, dry_run="All")
        else:
            raise ValueError(f"unexpected kind {kind!r}")

    try:
        for result in results:
            for command, obj in result.kube_objects:
                key = hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=True).encode()).hexdigest()
                if key not in seen:
                    namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
                    problem = namespace_problem(namespace)
                    if problem is None:
                        checked += 1
                        try:
                            create(obj, namespace)
                        except ApiException as exc:
                            problem = f"{obj.get('kind')} refused ({exc.status}): {_api_message(exc)}"
                            if exc.status is not None and exc.status >= 500:
                                problem = "5xx:" + problem
                        except ValueError as exc:
                            problem = f"{obj.get('kind')} cannot be sent: {exc}"
                    seen[key] = problem
                problem = seen[key]
                if problem is not None:
                    kind = API_ERROR if problem.startswith("5xx:") else API_REFUSAL
                    findings.append(Finding(kind, result.case, command, problem.removeprefix("5xx:")))
    finally:
        for name in created:
            with contextlib.suppress(Exception):
                core.delete_namespace(name)
    if log:
        log(f"API server: {checked} distinct objects dry-run created, {len(created)} namespaces made")
    return findings, checked


def _api_message(exc: Any) -> str:
    try:
        body = json.loads(exc.body)
        return str(body.get("message") or exc.reason)[:300]
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", exc))[:300]


# --- reporting ---------------------------------------------------------------------------------------------


@dataclass
class Summary:
    inputs: int = 0
    runs: int = 0
    accepted: int = 0
    refused: int = 0
    other_exit: int = 0
    scripts_executed: int = 0
    kube_objects_checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    def add(self, result: CaseResult) -> None:
        self.inputs += 1
        for run in result.runs:
            self.runs += 1
            if run.returncode == 0:
                self.accepted += 1
            elif run.returncode == 2:
                self.refused += 1
            else:
                self.other_exit += 1
        self.findings.extend(result.findings)

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)

    def distinct(self) -> dict[tuple[str, str, str], list[Finding]]:
        """Findings grouped by problem (``Finding.signature``), in first-seen order."""
        out: dict[tuple[str, str, str], list[Finding]] = {}
        for finding in self.findings:
            out.setdefault(finding.signature, []).append(finding)
        return out

    def problem_lines(self) -> list[str]:
        return [group[0].line(len(group), [f.case.payload for f in group]) for group in self.distinct().values()]

    def lines(self) -> list[str]:
        return [
            f"inputs run:              {self.inputs}",
            f"command runs:            {self.runs}",
            f"accepted (exit 0):       {self.accepted}",
            f"refused (exit 2):        {self.refused}",
            f"other exit codes:        {self.other_exit}",
            f"scripts run under bash:  {self.scripts_executed}",
            f"objects dry-run created: {self.kube_objects_checked}",
            f"injections:              {self.count(INJECTION)}",
            f"tracebacks:              {self.count(TRACEBACK)}",
            f"runs over the bound:     {self.count(OVER_BOUND)}",
            f"API-server refusals:     {self.count(API_REFUSAL)}",
            f"other findings:          {sum(self.count(k) for k in (EXIT_CODE, STDERR, OUTPUT, API_ERROR))} "
            f"(exit code {self.count(EXIT_CODE)}, stderr {self.count(STDERR)}, output {self.count(OUTPUT)}, "
            f"API errors {self.count(API_ERROR)})",
            f"distinct problems:       {len(self.distinct())}",
        ]


def append_findings(findings: Iterable[Finding], path: str | os.PathLike[str]) -> int:
    """Append one line per distinct problem not already in *path*; returns how many were added."""
    target = Path(path)
    existing = target.read_text(encoding="utf-8", errors="replace") if target.exists() else ""
    added = 0
    with open(target, "a", encoding="utf-8") as out:
        for signature, group in Summary(findings=list(findings)).distinct().items():
            tag = "sig=" + hashlib.sha1(repr(signature).encode()).hexdigest()[:10]
            if tag in existing:
                continue
            out.write(f"{group[0].line(len(group), [f.case.payload for f in group])} [{tag}]\n")
            existing += tag
            added += 1
    return added
