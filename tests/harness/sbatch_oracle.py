"""Slurm as the oracle for batch scripts: submit a script natively (``sbatch --hold``) and through hpc-bridge
(``hpcbridge submit --hold``), read both jobs back from slurmctld, and list every field that differs.

What is read back, per job (every component of a heterogeneous job):
- ``scontrol show job -o``: every field, job ids replaced by a placeholder;
- the script and the environment slurmctld stored under StateSaveLocation (``hash.N/job.ID/``).
What may differ: the ids, the times, and hpc-bridge's identity — the ``hpcbridge.io/uid=…`` appended to the
job's comment (anything else in the comment must match).

Three ways in (``Oracle(way=…)``), each against the script submitted natively:
- ``script``: ``hpcbridge submit FILE``; the job must be the native one.
- ``trainjob``: ``hpcbridge convert FILE --to trainjob``, then ``hpcbridge submit`` that TrainJob;
- ``sbatch-back``: ``convert FILE --to trainjob | convert - --to sbatch``, then plain ``sbatch`` of that script
  from the path the original was submitted from.
The last two run hpc-bridge's batch script, not the user's: its stored script may differ, but only in
hpc-bridge's own lines — its ``exec`` line must run the original body byte for byte (``runs_body``).
"""

from __future__ import annotations

import re
import shlex
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: fields that hold times (set by slurmctld at submit) and ids; never compared
TIME_FIELDS = ("SubmitTime", "EligibleTime", "AccrueTime", "StartTime", "EndTime", "LastSchedEval",
               "SuspendTime", "PreemptEligibleTime", "PreemptTime", "Deadline_")
ID_FIELDS = ("JobId", "HetJobId", "HetJobIdSet", "ArrayJobId", "ArrayTaskId")
IDENTITY = re.compile(r"(?:^| )hpcbridge\.io/uid=[0-9a-f-]+$")
#: a corpus script may name the sbatch flags its test passes after the file (both paths get the same)
FLAGS_LINE = re.compile(r"^# fidelity-flags: (.*)$", re.MULTILINE)
_FIELD = re.compile(r"(?:^| )([A-Za-z][A-Za-z/:_]*(?:\[[^\]]*\])?)=")


@dataclass
class Outcome:
    script: str
    #: "identical", "different", "rejected by both", or what went wrong
    verdict: str
    differences: list[str] = field(default_factory=list)


def flags_of(text: str) -> list[str]:
    match = FLAGS_LINE.search(text)
    return shlex.split(match.group(1)) if match else []


def parse_scontrol(line: str) -> dict[str, str]:
    """``scontrol show job -o`` → fields; a value may hold blanks (Comment, JobName), so a field starts only
    where a known-looking ``Key=`` follows a blank."""
    fields: dict[str, str] = {}
    starts = [(m.start(1), m.group(1)) for m in _FIELD.finditer(line)]
    for index, (start, key) in enumerate(starts):
        value_start = start + len(key) + 1
        end = starts[index + 1][0] - 1 if index + 1 < len(starts) else len(line)
        fields[key] = line[value_start:end].rstrip(" ")
    return fields


def _component_ids(run, job_id: str) -> list[str]:
    out = run("squeue", "--noheader", "--states=all", "--Format=JobID:|,HetJobID:|").stdout
    ids = []
    for line in out.splitlines():
        job, het = (part.strip() for part in line.split("|")[:2])
        if job == job_id or het == job_id:
            ids.append(job)
    return sorted(ids, key=int) or [job_id]


def read_environment(path: Path) -> list[str]:
    """slurmctld's stored job environment: a little-endian count, then NUL-terminated ``NAME=value``."""
    data = path.read_bytes()
    (count,) = struct.unpack("<I", data[:4])
    entries = data[4:].split(b"\0")[:count]
    return sorted(entry.decode("utf-8", "replace") for entry in entries)


@dataclass
class StoredJob:
    fields: dict[str, str]
    script: bytes | None
    environment: list[str] | None


def read_job(run, state_dir: Path, job_id: str) -> list[StoredJob]:
    jobs = []
    for component in _component_ids(run, job_id):
        line = run("scontrol", "show", "job", "-o", component).stdout.strip().splitlines()[0]
        stored = state_dir / f"hash.{int(component) % 10}" / f"job.{component}"
        script = (stored / "script").read_bytes() if (stored / "script").exists() else None
        env = read_environment(stored / "environment") if (stored / "environment").exists() else None
        jobs.append(StoredJob(parse_scontrol(line), script, env))
    return jobs


#: fields whose values hold the job id (file patterns expanded by slurmctld)
_HOLDS_ID = ("StdOut", "StdErr", "StdIn")


def _normalised(job: StoredJob, ids: list[str]) -> dict[str, str]:
    out = {}
    for key, value in job.fields.items():
        if key in TIME_FIELDS or key in ID_FIELDS:
            continue
        if key == "SubmitLine":
            # the sbatch command line Slurm records from 23.02 on: hpc-bridge's only addition is the --comment
            # carrying its uid (appended to the user's own comment, which stays a difference if it changed)
            value = re.sub(r" --comment=(?:(?:(?! --comment=).)*? )?hpcbridge\.io/uid=[0-9a-f-]+", "", value)
        if key in _HOLDS_ID:
            folder, slash, name = value.rpartition("/")
            for number in sorted(ids, key=len, reverse=True):
                name = re.sub(rf"(?<![0-9A-Za-z]){number}(?![0-9A-Za-z])", "<id>", name)
            value = folder + slash + name
        out[key] = value
    return out


def exec_argv(script: bytes) -> list[str] | None:
    """The words of a script's last ``exec`` line as bash reads them (None: no such line)."""
    lines = [line for line in script.decode("utf-8", "surrogateescape").split("\n") if line.startswith("exec ")]
    if not lines:
        return None
    # printf receives the words exactly as exec would: hpc-bridge quotes every one, so nothing expands
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {lines[-1][len('exec '):]}"], capture_output=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    return out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1] if out.returncode == 0 else None


def runs_body(script: bytes, original: bytes) -> str | None:
    """None when hpc-bridge's stored *script* runs the *original* batch script's body (its directive lines
    removed) unchanged, through its own ``#!`` interpreter; else what is wrong."""
    from bridge.convert.sbatch import command_body, parse_exec_body
    from bridge.sbatch.script import split_script

    body = split_script(original.decode("utf-8", "surrogateescape")).body
    argv = exec_argv(script)
    if argv is None:
        return "hpc-bridge's script has no exec line"
    exec_form = parse_exec_body(body)
    if command_body(argv) == body or (exec_form is not None and not exec_form[1] and argv == exec_form[0]):
        return None
    return f"hpc-bridge's script does not run the script's body: exec {argv!r}"


def compare(native: list[StoredJob], bridged: list[StoredJob], native_ids: list[str],
            bridged_ids: list[str], original: bytes | None = None) -> list[str]:
    """Every difference between the two jobs, field by field, the identity tag allowed. Given the *original*
    script, the bridged job runs hpc-bridge's script: it may be stored in place of the original if it runs
    the original's body (``runs_body``)."""
    if len(native) != len(bridged):
        return [f"components: {len(native)} natively, {len(bridged)} through hpc-bridge"]
    problems = []
    for index, (a, b) in enumerate(zip(native, bridged, strict=True)):
        where = f"component {index}: " if len(native) > 1 else ""
        fa, fb = _normalised(a, native_ids), _normalised(b, bridged_ids)
        comment = fb.pop("Comment", "(null)")
        if not IDENTITY.search(comment):
            problems.append(f"{where}Comment: no hpc-bridge identity at its end: {comment!r}")
        user = IDENTITY.sub("", comment) or "(null)"
        expected = fa.pop("Comment", "(null)")
        if user != expected:
            problems.append(f"{where}Comment: {expected!r} natively, {user!r} before the identity")
        for key in sorted(set(fa) | set(fb)):
            if fa.get(key) != fb.get(key):
                problems.append(f"{where}{key}: {fa.get(key)!r} natively, {fb.get(key)!r} through hpc-bridge")
        if a.script != b.script:
            wrong = "stored script differs" if original is None or b.script is None else runs_body(b.script, original)
            if wrong:
                problems.append(f"{where}stored script: {wrong}" if original is not None else f"{where}{wrong}")
        if (a.environment is None) != (b.environment is None):
            problems.append(f"{where}stored environment: stored only {'natively' if a.environment else 'by hpc-bridge'}")
        env_a = dict(entry.partition("=")[::2] for entry in a.environment or ())
        env_b = dict(entry.partition("=")[::2] for entry in b.environment or ())
        for name in sorted(set(env_a) | set(env_b)):
            if env_a.get(name) != env_b.get(name):
                problems.append(f"{where}environment {name}: {env_a.get(name)!r} natively, {env_b.get(name)!r} "
                                "through hpc-bridge")
    return problems


class Oracle:
    """Submits corpus scripts both ways on one real Slurm cluster and compares what it stored."""

    WAYS = ("script", "trainjob", "sbatch-back")

    def __init__(self, slurm_conf: Path, state_dir: Path, config_file: Path, cluster: str, workdir: Path,
                 env: dict[str, str], way: str = "script") -> None:
        assert way in self.WAYS, way
        self.state_dir, self.cluster, self.workdir = state_dir, cluster, workdir
        #: how the script goes in through hpc-bridge (see the module's docstring)
        self.way = way
        self.env = {**env, "SLURM_CONF": str(slurm_conf), "HPCBRIDGE_CONFIG": str(config_file)}

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, cwd=self.workdir,
                              stdin=subprocess.DEVNULL, timeout=120)

    def _submitted_path(self, path: Path) -> Path:
        """Where a script is given to sbatch: the sbatch-back way submits the original and the script that
        came back from one path, the file a user would write it to (Slurm records it as the job's Command)."""
        return self.workdir / path.name if self.way == "sbatch-back" else path

    def native(self, path: Path, flags: list[str]) -> subprocess.CompletedProcess:
        submitted = self._submitted_path(path)
        if submitted != path:
            submitted.write_bytes(path.read_bytes())
        return self.run("sbatch", "--parsable", "--hold", *flags, str(submitted))

    def _hpcbridge(self, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bridge", *argv], capture_output=True, text=True,
                              env=self.env, cwd=self.workdir, input=stdin, timeout=120,
                              stdin=None if stdin is not None else subprocess.DEVNULL)

    def bridged(self, path: Path, flags: list[str]) -> subprocess.CompletedProcess:
        # sbatch's flags go after "--", as the CLI asks where its own -c/-o/--cluster/--wait would collide
        sbatch_flags = ["--", *flags] if flags else []
        if self.way == "script":
            return self._hpcbridge("submit", str(path), "--cluster", self.cluster, "--hold", *sbatch_flags)
        converted = self._hpcbridge("convert", str(path), "--to", "trainjob", *sbatch_flags)
        if converted.returncode != 0:
            return converted
        if self.way == "trainjob":
            yaml_path = self.workdir / f"{path.name}.yaml"
            yaml_path.write_text(converted.stdout)
            return self._hpcbridge("submit", str(yaml_path), "--cluster", self.cluster, "--hold", "--rerun")
        back = self._hpcbridge("convert", "-", "--to", "sbatch", stdin=converted.stdout)
        if back.returncode != 0:
            return back
        submitted = self._submitted_path(path)
        submitted.write_text(back.stdout)
        return self.run("sbatch", "--parsable", "--hold", str(submitted))

    def job_ids(self) -> set[str]:
        """Jobs slurmctld knows now. A set, not a count: finished jobs age out of squeue (MinJobAge) while a
        check runs, so only a new id shows that a job was created."""
        return set(self.run("squeue", "--noheader", "--states=all", "--Format=JobID").stdout.split())

    def check(self, path: Path) -> Outcome:
        """Both ways, compared. A held job's ``singleton`` dependency reads ``singleton(unfulfilled)`` until
        slurmctld's periodic purge pass (every 60 s) judges it and, with no earlier job of that name pending,
        hides it as ``(null)``: two reads either side of a pass differ by timing alone. A held probe job of its
        own name shows whether a pass came while the two were read; if one did, the check is taken again."""
        if "singleton" not in path.read_bytes().decode("utf-8", "replace"):
            return self._check_once(path)
        for attempt in range(5):
            probe = self.run("sbatch", "--parsable", "--hold", f"--job-name=oracle-probe-{attempt}",
                             "--dependency=singleton", "--wrap", "true").stdout.strip()
            try:
                outcome = self._check_once(path)
                if "singleton(unfulfilled)" in self.run("scontrol", "show", "job", "-o", probe).stdout:
                    return outcome
            finally:
                self.run("scancel", probe)
        return outcome

    def _check_once(self, path: Path) -> Outcome:
        text = path.read_bytes().decode("utf-8", "replace")
        flags = flags_of(text)
        before = self.job_ids()
        native = self.native(path, flags)
        after_native = self.job_ids()
        bridged = self.bridged(path, flags)
        after_bridged = self.job_ids()
        native_id = native.stdout.strip().split(";")[0] if native.returncode == 0 else None
        bridged_id = bridged.stdout.strip().splitlines()[-1] if bridged.returncode == 0 and bridged.stdout.strip() \
            else None
        try:
            if native_id is None:
                if bridged.returncode == 0:
                    return Outcome(path.name, "accepted by hpc-bridge though sbatch refuses it",
                                   [native.stderr.strip(), bridged.stdout.strip()])
                problems = []
                if (after_native | after_bridged) - before:
                    problems.append("a job was created")
                if bridged.returncode != 2 and "sbatch:" not in bridged.stderr:
                    problems.append(f"hpc-bridge exit {bridged.returncode}: {bridged.stderr.strip()}")
                errors = [line for line in bridged.stderr.strip().splitlines() if not line.startswith("hpcbridge: note:")]
                if len(errors) != 1:
                    problems.append(f"not one line: {bridged.stderr.strip()!r}")
                return Outcome(path.name, "different" if problems else "rejected by both", problems)
            if bridged_id is None:
                return Outcome(path.name, "refused by hpc-bridge though sbatch accepts it",
                               [bridged.stderr.strip()])
            native_ids = _component_ids(self.run, native_id)
            bridged_ids = _component_ids(self.run, bridged_id)
            problems = compare(read_job(self.run, self.state_dir, native_id),
                               read_job(self.run, self.state_dir, bridged_id), native_ids, bridged_ids,
                               None if self.way == "script" else path.read_bytes())
            return Outcome(path.name, "different" if problems else "identical", problems)
        finally:
            for job_id in (native_id, bridged_id):
                if job_id:
                    self.run("scancel", job_id)
