"""slurmrestd with JWT: which API a server speaks, one job description per API generation, and a small client.

slurmrestd serves a few OpenAPI versions at once, and each Slurm release moves the window (22.05: v0.0.36 to
v0.0.38; 24.11: v0.0.40 to v0.0.42; 26.05: v0.0.42 to v0.0.45). The client reads the server's OpenAPI document
once, speaks the newest version it knows (or the one the cluster pins), and checks every field of a job
description against that version's schema before sending it: slurmrestd answers an unknown field with a
warning and submits the job without it, which would be a different job.

Two generations of the API:
- v0.0.38 (Slurm 22.05): sbatch's own option names as keys; plain strings and integers; ``job_state`` a string,
  ``exit_code`` the raw wait status.
- v0.0.40 and later (the data_parser, Slurm 23.11 on): typed fields (``{set, infinite, number}``, flag lists),
  ``tres_per_node`` for GPUs, ``shared`` for exclusive nodes, the environment as ``NAME=value`` strings;
  ``job_state`` a list of a base state and flags, ``exit_code`` an object.

The REST API ignores ``#SBATCH`` lines, so the plan is rendered a second way: a job description whose fields
carry what the directives say. The script is sent along unchanged (its directives then only document the job).
Only the standard library is used: urllib, json.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

from bridge.adapters.slurm import sinfo
from bridge.adapters.slurm.render import directives, render_script
from bridge.adapters.slurm.state import SlurmRecord, decode_wait_status, map_state
from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX, WORKDIR_ANNOTATION
from bridge.errors import BackendRejected, BackendUnavailable, InvalidSpec
from bridge.plan import LaunchPlan, stage_input_environment

#: the API versions hpc-bridge speaks, oldest first; each was checked against a real slurmrestd
VERSIONS = ("v0.0.38", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
#: REST jobs inherit no environment from anyone; the launcher needs at least a PATH
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Slurm's error number for "Job is in held state, pending scheduler release" (not a failure: the job exists)
ESLURM_JOB_HELD = 2042
#: ... which the data_parser APIs report as a warning instead
HELD_TEXT = "Job is in held state"
_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


def _spans(versions: Iterable[str]) -> str:
    ordered = sorted(set(versions), key=_key)
    return ", ".join(ordered) if len(ordered) <= 2 else f"{ordered[0]} to {ordered[-1]}"


def choose_version(served: Iterable[str], pinned: str | None = None, where: str = "slurmrestd") -> str:
    """The newest version both sides speak, or *pinned* if the server serves it; a clear error otherwise."""
    served = set(served)
    if pinned:
        if pinned not in served:
            raise BackendRejected("slurmrestd", f"{where} does not serve the pinned API {pinned} (spec.slurm."
                                                f"restApiVersion); it serves {_spans(served) or 'no Slurm API'}")
        return pinned
    common = [v for v in VERSIONS if v in served]
    if common:
        return common[-1]
    if not served:
        raise BackendRejected("slurmrestd", f"{where} serves no Slurm API (is the openapi/slurmctld plugin loaded?)")
    newest = max(served, key=_key)
    relation = "newer than" if _key(newest) > _key(VERSIONS[-1]) else "none of"
    raise BackendRejected("slurmrestd", f"{where} serves {_spans(served)}, {relation} the APIs hpc-bridge speaks "
                                        f"(v0.0.38, v0.0.40 to {VERSIONS[-1]})")


def served_versions(document: dict[str, Any]) -> set[str]:
    """The Slurm API versions an OpenAPI document has paths for."""
    return {m.group(1) for path in document.get("paths", {}) if (m := _VERSION.match(path))}


def _resolve_ref(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while isinstance(schema, dict) and "$ref" in schema:
        target: Any = document
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        schema = target
    return schema if isinstance(schema, dict) else {}


def job_fields(document: dict[str, Any], version: str) -> frozenset[str] | None:
    """The fields *version*'s job submission takes (its ``job`` object), or None where the document does not
    say (then slurmrestd's own answer is the only check)."""
    post = document.get("paths", {}).get(f"/slurm/{version}/job/submit", {}).get("post", {})
    body = post.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    job = _resolve_ref(document, _resolve_ref(document, body).get("properties", {}).get("job", {}))
    properties = job.get("properties")
    return frozenset(properties) if isinstance(properties, dict) and properties else None


# --- what the plan asks: the batch script's own directives, then shaped per generation ---------------------

#: the sbatch options a job description carries (the directives hpc-bridge writes, and the pass-through options
#: slurmrestd has a field for); any other is refused naming it, never dropped
REST_OPTIONS = frozenset({
    "job-name", "comment", "nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "mem", "gpus-per-node", "gres",
    "gpus", "gpus-per-task", "threads-per-core", "time", "partition", "account", "qos", "constraint", "array",
    "dependency", "exclusive", "output", "error", "chdir", "hold"})
#: what sbatch puts in a job's environment for an option it was given (slurmrestd sets none of it): a REST job
#: sees what the same script sees under sbatch
OPTION_ENVIRONMENT = {"ntasks": ("SLURM_NTASKS", "SLURM_NPROCS"), "ntasks-per-node": ("SLURM_NTASKS_PER_NODE",),
                      "cpus-per-task": ("SLURM_CPUS_PER_TASK",), "gpus": ("SLURM_GPUS",),
                      "gpus-per-task": ("SLURM_GPUS_PER_TASK",), "gpus-per-node": ("SLURM_GPUS_PER_NODE",),
                      "threads-per-core": ("SLURM_THREADS_PER_CORE",)}
_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _request(plan: LaunchPlan, extra_env: dict[str, str] | None, derive_ntasks: bool = False) -> dict[str, Any]:
    """The job the plan describes: the options its batch script states (``render.directives``: the same
    layout, GPU spelling and defaults), the time limit in minutes and the environment."""
    if not plan.workdir or not plan.workdir.startswith("/"):
        raise InvalidSpec(f"metadata.annotations[{WORKDIR_ANNOTATION}]", plan.workdir,
                          "slurmrestd needs an absolute working directory (there is no submitting shell)")
    options = dict(directives(plan))
    unknown = [name for name in options if name not in REST_OPTIONS]
    if unknown:
        raise InvalidSpec("metadata.annotations", ", ".join(unknown),
                          f"{SBATCH_PASSTHROUGH_PREFIX}* options slurmrestd has no field for; use the local or ssh "
                          "transport")
    nodes, per_node = options.get("nodes"), options.get("ntasks-per-node")
    if derive_ntasks and nodes and per_node and not options.get("ntasks"):
        # sbatch up to 22.05 derives the task total from a node count and tasks per node, and sends and exports it
        low, high = _node_range(nodes)
        if low == high:
            options["ntasks"] = str(low * int(per_node))
    environment = {"PATH": BASE_PATH, **(extra_env or {})}
    for option, names in OPTION_ENVIRONMENT.items():
        value = options.get(option)
        if value:
            environment.update(dict.fromkeys(names, value))
    environment.update({entry.name: entry.value or "" for entry in plan.env})
    environment.update(stage_input_environment(plan))
    return {"options": options, "environment": environment,
            "time_minutes": math.ceil(plan.time_limit_seconds / 60) if plan.time_limit_seconds else None}


def _mebibytes(value: str) -> int:
    """sbatch's ``--mem`` value (a number, megabytes unless K, M, G or T follows) in MiB."""
    number, unit = (value[:-1], value[-1].upper()) if value[-1:].isalpha() else (value, "M")
    if not number.isdigit() or unit not in _UNITS:
        raise InvalidSpec("--mem", value, "not a memory size sbatch takes (a number, then K, M, G or T)")
    return math.ceil(int(number) * _UNITS[unit])


def _node_range(value: str) -> tuple[int, int]:
    low, _, high = value.partition("-")
    return int(low), int(high or low)


def _absolute(path: str, workdir: str) -> str:
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"


def _set(number: int) -> dict[str, Any]:
    """The data_parser's ``{set, infinite, number}`` for a value that is set."""
    return {"set": True, "infinite": False, "number": number}


def _number(value: Any) -> int | None:
    """A plain integer, or the data_parser's ``{set, infinite, number}``; None when unset or infinite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and value.get("set") and not value.get("infinite"):
        number = value.get("number")
        return number if isinstance(number, int) else None
    return None


class Api:
    """One API generation: how a job is described to slurmrestd, and how its answers read. Each describes a
    job as the sbatch of the Slurm releases that serve it would (v0.0.38: 22.05; the data_parser: 23.11 on)."""

    generation = ""
    #: sbatch's own derivations that the job description must make explicit
    derive_ntasks = False

    def __init__(self, version: str) -> None:
        self.version = version

    def job(self, request: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def record(self, job: dict[str, Any]) -> SlurmRecord:
        raise NotImplementedError

    def release(self, payload: dict[str, Any]) -> str:
        raise NotImplementedError

    def pings(self, payload: dict[str, Any]) -> str:
        """The controllers slurmrestd reached; none answering is trouble (24.11 reports a forged token so)."""
        pings = [p for p in payload.get("pings", []) if isinstance(p, dict)]
        up = [p for p in pings if p.get("responding", str(p.get("pinged") or p.get("ping")).upper() == "UP")]
        if not up:
            shown = ", ".join(f"{p.get('hostname')} {p.get('pinged') or p.get('status') or 'DOWN'}" for p in pings)
            raise BackendUnavailable("slurmrestd", f"slurmctld does not answer slurmrestd ({shown or 'no controller'})"
                                                   "; is the token valid?")
        return ", ".join(f"{p.get('hostname')} UP" for p in up)

    def node_rows(self, nodes: list[dict[str, Any]], partitions: list[dict[str, Any]]) -> list[sinfo.NodeRow]:
        return sinfo.rest_rows(nodes, partitions)

    def output_path(self, job: dict[str, Any], job_id: str) -> str | None:
        path = str(job.get("stdout_expanded") or job.get("standard_output") or "")
        if not path:
            # no --output (a batch script left to Slurm's default): v0.0.38 leaves the field empty, and the
            # file is slurmd's default in the job's working directory
            workdir = str(job.get("current_working_directory") or "")
            array_job, task = _number(job.get("array_job_id")), _number(job.get("array_task_id"))
            name = f"slurm-{array_job}_{task}.out" if array_job and task is not None else f"slurm-{job_id}.out"
            return f"{workdir.rstrip('/')}/{name}" if workdir.startswith("/") else None
        return path.replace("%j", job_id).replace("%x", str(job.get("name")))


def _common_fields(request: dict[str, Any]) -> dict[str, Any]:
    """The fields both generations spell alike."""
    options = request["options"]
    workdir = options["chdir"]
    job: dict[str, Any] = {"current_working_directory": workdir}
    for option, key in (("job-name", "name"), ("comment", "comment"), ("partition", "partition"),
                        ("account", "account"), ("qos", "qos"), ("constraint", "constraints"), ("array", "array"),
                        ("dependency", "dependency")):
        if options.get(option):
            job[key] = options[option]
    for option, key in (("ntasks", "tasks"), ("ntasks-per-node", "tasks_per_node"),
                        ("cpus-per-task", "cpus_per_task"), ("threads-per-core", "threads_per_core")):
        if options.get(option):
            job[key] = int(options[option])
    for option, key in (("output", "standard_output"), ("error", "standard_error")):
        if options.get(option):
            job[key] = _absolute(options[option], workdir)
    if "hold" in options:
        job["hold"] = True
    return job


class Legacy(Api):
    """v0.0.38: keys are sbatch's options spelled with underscores; values as sbatch takes them."""

    generation = "v0.0.38"
    derive_ntasks = True

    def job(self, request: dict[str, Any]) -> dict[str, Any]:
        job = _common_fields(request)
        options = request["options"]
        job["environment"] = request["environment"]
        if options.get("nodes"):
            job["nodes"] = options["nodes"]  # a count, or a range as sbatch takes it
        if options.get("mem"):
            job["memory_per_node"] = _mebibytes(options["mem"])
        for option, key in (("gpus-per-node", "gpus_per_node"), ("gres", "gres"), ("gpus", "gpus"),
                            ("gpus-per-task", "gpus_per_task")):
            if options.get(option):
                job[key] = options[option]
        if request["time_minutes"]:
            job["time_limit"] = request["time_minutes"]
        if "exclusive" in options:
            job["exclusive"] = "exclusive"  # sbatch's --exclusive; "true" is refused as an invalid specification
        return job

    def record(self, job: dict[str, Any]) -> SlurmRecord:
        slurm_state = str(job.get("job_state", ""))
        raw = job.get("exit_code")
        leader = job.get("het_job_id")
        return _record(job, slurm_state, decode_wait_status(raw) if isinstance(raw, int) else None,
                       leader if isinstance(leader, int) else None)

    def release(self, payload: dict[str, Any]) -> str:
        return str(payload.get("meta", {}).get("Slurm", {}).get("release", "?"))


#: Slurm shows a job's state flag instead of its base state when one is set, in this order (job_state_string)
_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "EXPEDITING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
               "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


def shown_state(states: Any) -> str:
    """The state squeue would print for the data_parser's ``job_state`` list (a base state, then flags)."""
    if isinstance(states, str):
        return states
    names = [str(s) for s in states or []]
    return next((flag for flag in _FLAG_ORDER if flag in names[1:]), names[0] if names else "")


def _exit_code(value: Any) -> int | None:
    """The data_parser's ``exit_code`` object: a signal is 128 + its number, else the return code."""
    if isinstance(value, int) and not isinstance(value, bool):
        return decode_wait_status(value)
    if not isinstance(value, dict):
        return None
    signal = value.get("signal", {})
    number = _number(signal.get("id")) if isinstance(signal, dict) else None
    if number:
        return 128 + number
    return _number(value.get("return_code"))


class DataParser(Api):
    """v0.0.40 to v0.0.45: typed fields, flag lists, and numbers that may be unset or infinite."""

    generation = "v0.0.40+"

    def job(self, request: dict[str, Any]) -> dict[str, Any]:
        job = _common_fields(request)
        options = request["options"]
        job["environment"] = [f"{name}={value}" for name, value in request["environment"].items()]
        if options.get("nodes"):
            job["minimum_nodes"], job["maximum_nodes"] = _node_range(options["nodes"])
        if options.get("mem"):
            job["memory_per_node"] = _set(_mebibytes(options["mem"]))
        # GPUs as trackable resources, per node, job or task as the option says (gpus_per_node is not a field)
        if options.get("gpus-per-node"):
            job["tres_per_node"] = f"gres/gpu:{options['gpus-per-node']}"
        if options.get("gres"):
            job["tres_per_node"] = ",".join(f"gres/{item}" for item in options["gres"].split(","))
        if options.get("gpus"):
            job["tres_per_job"] = f"gres/gpu:{options['gpus']}"
        # per task as sbatch from 23.11 on states it: CPUs and GPUs both
        per_task = [f"cpu={options['cpus-per-task']}"] if options.get("cpus-per-task") else []
        if options.get("gpus-per-task"):
            per_task.append(f"gres/gpu:{options['gpus-per-task']}")
        if per_task:
            job["tres_per_task"] = ",".join(per_task)
        if request["time_minutes"]:
            job["time_limit"] = _set(request["time_minutes"])
        if "exclusive" in options:
            job["shared"] = ["none"]  # what sbatch --exclusive sets
        return job

    def record(self, job: dict[str, Any]) -> SlurmRecord:
        return _record(job, shown_state(job.get("job_state")), _exit_code(job.get("exit_code")),
                       _number(job.get("het_job_id")))

    def release(self, payload: dict[str, Any]) -> str:
        return str(payload.get("meta", {}).get("slurm", {}).get("release", "?"))

    def node_rows(self, nodes: list[dict[str, Any]], partitions: list[dict[str, Any]]) -> list[sinfo.NodeRow]:
        # the same rows v0.0.38 gives: states as sinfo names them, limits in minutes with -1 for none
        legacy_nodes = []
        for node in nodes:
            cpus = int(node.get("cpus", 0))
            idle = node.get("alloc_idle_cpus")
            legacy_nodes.append({**node, "state": _node_state(node.get("state")),
                                 "idle_cpus": int(idle) if isinstance(idle, int) else cpus - int(
                                     node.get("alloc_cpus", 0))})
        legacy_partitions = []
        # v0.0.40 to v0.0.42 (Slurm 24.11) leave partitions' flags out, Default among them: a lone partition is
        # the default all the same; of several, which one is cannot be told (count() then says so)
        lone = len(partitions) == 1 and partitions[0].get("flags") is None
        for part in partitions:
            maximums = part.get("maximums", {})
            states = part.get("partition", {}).get("state", ["UP"])
            flags = part.get("flags") or (["DEFAULT"] if lone else [])
            legacy_partitions.append({
                "name": part.get("name", ""), "flags": [str(f).lower() for f in flags],
                "maximum_time": _or_none(_number(maximums.get("time"))),
                "max_nodes": _or_none(_number(maximums.get("nodes"))),
                "state": "up" if "UP" in states else ",".join(states).lower()})
        return sinfo.rest_rows(legacy_nodes, legacy_partitions)


def _or_none(number: int | None) -> int:
    return -1 if number is None else number


def _node_state(states: Any) -> str:
    """A node's state flag list as the one word sinfo prints for it."""
    names = [str(s).upper() for s in (states if isinstance(states, list) else [states or ""])]
    for flag, word in (("DRAIN", "drain"), ("MAINTENANCE", "maint"), ("RESERVED", "resv"),
                       ("COMPLETING", "comp"), ("PLANNED", "planned")):
        if flag in names[1:]:
            return word
    return names[0].lower() if names else ""


def _record(job: dict[str, Any], slurm_state: str, exit_code: int | None, het_leader: int | None) -> SlurmRecord:
    state, mapped = map_state(slurm_state)
    reason = str(job.get("state_reason") or "")
    shown = f"{mapped}: {reason}" if mapped and reason not in ("", "None") else (
        reason if reason not in ("", "None") else mapped)
    job_id = str(het_leader) if het_leader else str(job.get("job_id"))
    return SlurmRecord(job_id, state, slurm_state, shown, exit_code if state.finished else None,
                       str(job.get("nodes") or ""), str(job.get("name") or ""), str(job.get("comment") or ""))


def api_for(version: str) -> Api:
    if version not in VERSIONS:
        raise BackendRejected("slurmrestd", f"hpc-bridge does not speak slurmrestd API {version}")
    return Legacy(version) if version == "v0.0.38" else DataParser(version)


def job_description(plan: LaunchPlan, extra_env: dict[str, str] | None = None, api: Api | None = None
                    ) -> dict[str, Any]:
    """The ``job`` object equivalent to the batch script's directives, in *api*'s terms (default v0.0.38)."""
    api = api or Legacy("v0.0.38")
    return api.job(_request(plan, extra_env, api.derive_ntasks))


def submission(plan: LaunchPlan, extra_env: dict[str, str] | None = None, api: Api | None = None) -> dict[str, Any]:
    return {"script": render_script(plan), "job": job_description(plan, extra_env, api)}


# --- the client ---------------------------------------------------------------------------------------


#: what each server's OpenAPI document said, by URL: read once per process (the operator builds a client per
#: cluster and tenant; the document of a 26.05 slurmrestd is a few MB)
_DISCOVERED: dict[str, tuple[set[str], dict[str, frozenset[str] | None]]] = {}
_DISCOVERY_LOCK = threading.Lock()


class RestClient:
    """Talks to slurmrestd; a token file (``scontrol token`` output or the bare token) or $SLURM_JWT."""

    name = "slurmrestd"

    def __init__(self, url: str, user: str | None = None, token_file: str | None = None, timeout: float = 30.0,
                 api_version: str | None = None):
        self.url = url.rstrip("/")
        if not user:
            # the user this process runs as, by uid ($USER may be unset or say anything); never a guessed root
            from bridge.adapters.run_as import current_user

            user = current_user()
        self.user = user
        self.token_file = os.path.expanduser(token_file) if token_file else None
        self.timeout = timeout
        self.pinned = api_version
        self._api: Api | None = None
        self.requests = 0  # tests and benchmarks count backend calls

    def _token(self) -> str:
        if self.token_file:
            try:
                text = open(self.token_file, encoding="utf-8").read().strip()
            except OSError as exc:
                raise BackendUnavailable(self.name, f"cannot read token file {self.token_file}: {exc.strerror}") \
                    from None
            return text.split("=", 1)[1] if text.startswith("SLURM_JWT=") else text
        token = os.environ.get("SLURM_JWT")
        if not token:
            raise InvalidSpec("spec.slurm.tokenFile", None, "slurmrestd needs a JWT: set tokenFile or $SLURM_JWT")
        return token

    @property
    def api(self) -> Api:
        """The API generation this server is spoken to in (its OpenAPI document read on first use)."""
        if self._api is None:
            # a pinned version renders without asking the server; submit still checks the server serves it
            version = self.pinned or choose_version(self._discover()[0], None, f"slurmrestd at {self.url}")
            self._api = api_for(version)
        return self._api

    def _discover(self) -> tuple[set[str], dict[str, frozenset[str] | None]]:
        with _DISCOVERY_LOCK:
            known = _DISCOVERED.get(self.url)
        if known is not None:
            return known
        document = self._call("GET", f"{self.url}/openapi/v3", None, "GET /openapi/v3")
        served = served_versions(document)
        fields = {version: job_fields(document, version) for version in served if version in VERSIONS}
        with _DISCOVERY_LOCK:
            _DISCOVERED[self.url] = (served, fields)
        return served, fields

    def check_fields(self, job: dict[str, Any]) -> None:
        """Refuse, before anything is sent, a field the server's API would ignore."""
        served, known = self._discover()
        choose_version(served, self.pinned, f"slurmrestd at {self.url}")
        fields = known.get(self.api.version)
        unknown = sorted(set(job) - fields) if fields is not None else []
        if unknown:
            raise BackendRejected(self.name, f"slurmrestd {self.api.version} at {self.url} has no job field "
                                             f"{', '.join(unknown)}; the job would run without it")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                tolerate: frozenset[int] = frozenset()) -> dict[str, Any]:
        return self._call(method, f"{self.url}/slurm/{self.api.version}{path}", body, f"{method} {path}", tolerate)

    def _call(self, method: str, url: str, body: dict[str, Any] | None, what: str,
              tolerate: frozenset[int] = frozenset()) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token(),
            "Content-Type": "application/json", "Accept": "application/json"})
        self.requests += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                payload = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = _errors(_json_or_empty(exc.read())) or exc.reason
            if exc.code in (401, 403):
                raise BackendUnavailable(self.name, f"HTTP {exc.code}: authentication failed ({detail})") from None
            if exc.code >= 500:
                raise BackendUnavailable(self.name, f"HTTP {exc.code}: {detail}") from None
            raise BackendRejected(self.name, f"HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise BackendUnavailable(self.name, f"{self.url}: {getattr(exc, 'reason', exc)}") from None
        except json.JSONDecodeError:
            raise BackendUnavailable(self.name, f"{what}: the answer is not JSON") from None
        if not isinstance(payload, dict):
            raise BackendUnavailable(self.name, f"{what}: the answer is not a JSON object")
        errors = _errors(payload, tolerate)
        if errors:
            raise BackendRejected(self.name, errors)
        return payload

    def submit(self, body: dict[str, Any]) -> str:
        self.check_fields(body.get("job", {}))
        # a held job is submitted, yet slurmrestd lists "Job is in held state" among the errors
        payload = self.request("POST", "/job/submit", body, tolerate=frozenset({ESLURM_JOB_HELD}))
        job_id = str(payload.get("job_id") or (payload.get("result") or {}).get("job_id") or "")
        warnings = _warnings(payload, HELD_TEXT if body.get("job", {}).get("hold") else None)
        if warnings:
            # slurmrestd submitted the job without something it was asked: that job is not the one asked for
            if job_id:
                try:
                    self.cancel(job_id)
                except (BackendRejected, BackendUnavailable):
                    pass
            raise BackendRejected(self.name, f"slurmrestd {self.api.version} ignored part of the job, so job "
                                             f"{job_id or '?'} was cancelled: {warnings}")
        if not job_id:
            raise BackendUnavailable(self.name, "POST /job/submit: the answer has no job id")
        return job_id

    def jobs(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self.request("GET", "/jobs").get("jobs", [])
        return jobs

    def records(self) -> list[SlurmRecord]:
        return [self.api.record(job) for job in self.jobs()]

    def node_rows(self) -> list[sinfo.NodeRow]:
        return self.api.node_rows(self.request("GET", "/nodes").get("nodes", []),
                                  self.request("GET", "/partitions").get("partitions", []))

    def output_path(self, job_id: str) -> str | None:
        job = next((j for j in self.jobs() if str(j.get("job_id")) == job_id), None)
        return self.api.output_path(job, job_id) if job else None

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        suffix = f"?signal={signal if signal.startswith('SIG') else 'SIG' + signal}" if signal else ""
        self.request("DELETE", f"/job/{job_id}{suffix}")

    def ping(self) -> str:
        payload = self.request("GET", "/ping")
        return f"slurmrestd {self.api.version} on Slurm {self.api.release(payload)}: {self.api.pings(payload)}"

    def close(self) -> None:
        pass


def _json_or_empty(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _errors(payload: dict[str, Any], tolerate: frozenset[int] = frozenset()) -> str:
    items = [e for e in payload.get("errors") or [] if isinstance(e, dict)
             and e.get("error_code", e.get("error_number")) not in tolerate]
    return "; ".join(_message(e) for e in items)


def _warnings(payload: dict[str, Any], expected: str | None = None) -> str:
    """The warnings of an answer as one line, but for those saying *expected* (what was asked for)."""
    items = [w for w in payload.get("warnings") or [] if isinstance(w, dict)
             and not (expected and expected in str(w.get("description", "")))]
    return "; ".join(_message(w) for w in items)


def _message(item: dict[str, Any]) -> str:
    """An error or warning as one line: its text, Slurm's error number, and where slurmrestd raised it."""
    text = " ".join(str(item[k]) for k in ("error", "description") if item.get(k)) or "?"
    number = item.get("error_code", item.get("error_number"))
    code = f" ({number})" if number not in (None, 0, -1) else ""
    source = f" [{item['source']}]" if item.get("source") else ""
    return f"{text}{code}{source}"
