"""slurmrestd (OpenAPI v0.0.38, Slurm 22.05) with JWT: the job description and a small client.

The REST API ignores ``#SBATCH`` lines, so the plan is rendered a second way: a v0.0.38 job description
whose fields carry what the directives say. The script is sent along unchanged (its directives then only
document the job). Only the standard library is used: urllib, json.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request
from typing import Any

from bridge.adapters.slurm.render import DEFAULT_OUTPUT, job_comment, render_script, tasks_per_node
from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX, WORKDIR_ANNOTATION
from bridge.errors import BackendRejected, BackendUnavailable, InvalidSpec
from bridge.plan import LaunchPlan, stage_input_environment

API = "/slurm/v0.0.38"
#: REST jobs inherit no environment from anyone; the launcher needs at least a PATH
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def job_description(plan: LaunchPlan, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The v0.0.38 ``job`` object equivalent to the batch script's directives."""
    if not plan.workdir or not plan.workdir.startswith("/"):
        raise InvalidSpec(f"metadata.annotations[{WORKDIR_ANNOTATION}]", plan.workdir,
                          "slurmrestd needs an absolute working directory (there is no submitting shell)")
    extra = [name for name, _ in plan.options.sbatch_extra if name != "comment"]
    if extra:
        names = ", ".join(extra)
        raise InvalidSpec("metadata.annotations", names, f"{SBATCH_PASSTHROUGH_PREFIX}* pass-through options cannot be "
                                                         "expressed over slurmrestd; use the local or ssh transport")
    job: dict[str, Any] = {
        "name": plan.options.slurm_job_name or plan.name,
        "comment": job_comment(plan),
        "nodes": plan.nodes,
        "tasks_per_node": tasks_per_node(plan),
        "current_working_directory": plan.workdir,
        "standard_output": _absolute(plan.options.output or DEFAULT_OUTPUT, plan.workdir),
        "environment": {"PATH": BASE_PATH, **(extra_env or {}),
                        **{entry.name: entry.value or "" for entry in plan.env}, **stage_input_environment(plan)},
    }
    resources = plan.resources
    if resources.cpu_count is not None:
        job["cpus_per_task"] = -(-resources.cpu_count // tasks_per_node(plan))
    if resources.memory_mib is not None:
        job["memory_per_node"] = resources.memory_mib
    if resources.gpus:
        job["gpus_per_node"] = str(resources.gpus)
    if plan.time_limit_seconds:
        job["time_limit"] = math.ceil(plan.time_limit_seconds / 60)
    options = plan.options
    for field, key in (("partition", "partition"), ("account", "account"), ("qos", "qos"),
                       ("constraint", "constraints"), ("array", "array"), ("dependency", "dependency")):
        value = getattr(options, field)
        if value:
            job[key] = value
    if options.exclusive:
        job["exclusive"] = "true"
    if options.error:
        job["standard_error"] = _absolute(options.error, plan.workdir)
    if plan.suspend:
        job["hold"] = True
    return job


def _absolute(path: str, workdir: str) -> str:
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"


def submission(plan: LaunchPlan, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"script": render_script(plan), "job": job_description(plan, extra_env)}


class RestClient:
    """Talks to slurmrestd; a token file (``scontrol token`` output or the bare token) or $SLURM_JWT."""

    name = "slurmrestd"

    def __init__(self, url: str, user: str | None = None, token_file: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        if not user:
            # the user this process runs as, by uid ($USER may be unset or say anything); never a guessed root
            from bridge.adapters.run_as import current_user

            user = current_user()
        self.user = user
        self.token_file = os.path.expanduser(token_file) if token_file else None
        self.timeout = timeout
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

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}{API}{path}", data=data, method=method, headers={
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
            raise BackendUnavailable(self.name, f"{method} {path}: the answer is not JSON") from None
        errors = _errors(payload)
        if errors:
            raise BackendRejected(self.name, errors)
        return payload

    def submit(self, body: dict[str, Any]) -> str:
        return str(self.request("POST", "/job/submit", body)["job_id"])

    def jobs(self) -> list[dict[str, Any]]:
        return self.request("GET", "/jobs").get("jobs", [])

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        suffix = f"?signal={signal if signal.startswith('SIG') else 'SIG' + signal}" if signal else ""
        self.request("DELETE", f"/job/{job_id}{suffix}")

    def ping(self) -> str:
        payload = self.request("GET", "/ping")
        release = payload.get("meta", {}).get("Slurm", {}).get("release", "?")
        pings = ", ".join(f"{p.get('hostname')} {p.get('ping')}" for p in payload.get("pings", []))
        return f"slurmrestd {API.rsplit('/', 1)[1]} on Slurm {release}: {pings}"

    def close(self) -> None:
        pass


def _json_or_empty(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _errors(payload: dict[str, Any]) -> str:
    items = payload.get("errors") or []
    return "; ".join(f"{e.get('error', '')} ({e.get('error_code', '?')})".strip() for e in items
                     if isinstance(e, dict))
