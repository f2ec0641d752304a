"""Flux backend (DESIGN §5): jobspec v1 submitted with ``flux job submit``, followed through the broker.

The ``flux`` command is the transport (here, or on a login host over SSH), so a broker of any version can
be driven without matching Python bindings. State comes from one ``flux jobs --json`` call per poll;
waiting for a job blocks on its eventlog (``flux job wait-event``), not a polling loop.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

from bridge.adapters.base import Adapter, Artifact, ArtifactFile, JobRef, JobState, JobStatus
from bridge.adapters.flux.render import BASE_PATH, render_jobspec
from bridge.adapters.transport import CommandResult, LocalTransport, SSHTransport, Transport
from bridge.errors import BackendRejected, BackendUnavailable
from bridge.plan import LaunchPlan

_TRANSIENT = ("Connection refused", "No such file or directory", "Unable to connect", "flux_open",
              "broker is not running", "Connection reset")
#: Flux job states (RFC 21) → ours; INACTIVE is decided by the result
STATES = {"NEW": JobState.PENDING, "DEPEND": JobState.PENDING, "PRIORITY": JobState.PENDING,
          "SCHED": JobState.PENDING, "RUN": JobState.RUNNING, "CLEANUP": JobState.COMPLETING}
RESULTS = {"COMPLETED": JobState.SUCCEEDED, "FAILED": JobState.FAILED, "CANCELED": JobState.CANCELLED,
           "TIMEOUT": JobState.TIMEOUT}


def make_transport(cluster) -> Transport:
    conn = cluster.spec.flux
    env = {"FLUX_URI": conn.uri} if conn is not None and conn.uri else {}
    if conn is not None and conn.host:
        return SSHTransport(conn.host, conn.port or 22, conn.user, conn.key_file, conn.known_hosts_file, env=env)
    return LocalTransport(env)


def status_from_json(ref: JobRef, job: dict) -> JobStatus:
    """One entry of ``flux jobs --json``."""
    state_name = str(job.get("state", ""))
    if state_name == "INACTIVE":
        result = str(job.get("result", ""))
        state = RESULTS.get(result, JobState.UNKNOWN)
    else:
        state = STATES.get(state_name, JobState.UNKNOWN)
    exception = job.get("exception") or {}
    reason = None
    if exception.get("occurred"):
        reason = f"{exception.get('type', 'exception')}: {exception.get('note', '')}".strip(": ")
    exit_code = job.get("returncode") if state.finished else None
    nodes = (str(job["nodelist"]),) if job.get("nodelist") else ()
    return JobStatus(ref, state, exit_code=exit_code if isinstance(exit_code, int) else None, reason=reason,
                     message=state_name if state_name != "INACTIVE" else str(job.get("result", "")), nodes=nodes)


class FluxAdapter(Adapter):
    backend = "flux"

    def __init__(self, cluster, transport: Transport | None = None) -> None:
        super().__init__(cluster)
        self._transport = transport
        conn = cluster.spec.flux
        self.flux = conn.flux_command if conn is not None else "flux"

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = make_transport(self.cluster)
        return self._transport

    def base_environment(self, plan: LaunchPlan) -> dict[str, str]:
        """PATH that finds flux (for the batch broker) and the launch command, plus the cluster's env."""
        conn = self.cluster.spec.flux
        dirs = [os.path.dirname(path) for path in (self.flux, plan.launch_command[0]) if os.path.isabs(path)]
        env = dict(conn.environment or {}) if conn else {}
        path = env.pop("PATH", BASE_PATH)
        return {"PATH": ":".join(dict.fromkeys([*dirs, *path.split(":")])), **env}

    def render(self, plan: LaunchPlan) -> Artifact:
        text = render_jobspec(plan, self.base_environment(plan))
        return Artifact("flux", "jobspec", plan, (ArtifactFile(f"{plan.name}.jobspec.json", text, "application/json"),))

    def _run(self, args: Sequence[str], what: str, stdin: str | None = None, timeout: float = 60.0,
             check: bool = True) -> CommandResult:
        result = self.transport.run([self.flux, *args], stdin=stdin, timeout=timeout)
        if result.ok or not check:
            return result
        text = " ".join((result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}").split())
        if any(marker in text for marker in _TRANSIENT):
            raise BackendUnavailable("flux", f"{what}: {text[:400]}")
        raise BackendRejected("flux", f"{what}: {text[:400]}")

    def _uid_of(self, job_id: str) -> tuple[str | None, str]:
        info = self._run(["job", "info", job_id, "jobspec"], "flux job info", check=False)
        try:
            user = json.loads(info.stdout)["attributes"].get("user", {}) if info.ok else {}
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return None, ""
        meta = user.get("hpcbridge", {}) if isinstance(user, dict) else {}
        return meta.get("uid"), str(meta.get("name", ""))

    def _ids_by_name(self) -> dict[str, list[str]]:
        listing = self._run(["jobs", "-a", "--no-header", "--format={id.f58} {name}"], "flux jobs").stdout
        names: dict[str, list[str]] = {}
        for line in listing.splitlines():
            job_id, _, name = line.partition(" ")
            names.setdefault(name.strip(), []).append(job_id)
        return names

    def find(self, uid: str, name: str | None = None) -> JobRef | None:
        candidates = self._ids_by_name()
        for job_id in (candidates.get(name, []) if name else [i for ids in candidates.values() for i in ids]):
            found_uid, found_name = self._uid_of(job_id)
            if found_uid == uid:
                return JobRef(self.cluster.name, "flux", job_id, uid, found_name or name or "")
        return None

    def submit(self, artifact: Artifact) -> JobRef:
        return self.submit_many([artifact])[0]

    def submit_many(self, artifacts: Sequence[Artifact]) -> list[JobRef]:
        """One job listing for all; only jobs whose name matches are opened to compare uids."""
        by_name = self._ids_by_name()
        refs = []
        for artifact in artifacts:
            plan = artifact.plan
            existing = next((job_id for job_id in by_name.get(plan.name, []) if self._uid_of(job_id)[0] == plan.uid),
                            None)
            if existing is None:
                # a suspended TrainJob is submitted held (urgency 0); `flux job urgency ID 16` releases it
                hold = ["--urgency=0"] if plan.suspend else []
                result = self._run(["job", "submit", *hold], "flux job submit", stdin=artifact.main)
                existing = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
                if not existing:
                    raise BackendUnavailable("flux", "flux job submit printed no job id")
                by_name.setdefault(plan.name, []).append(existing)
            refs.append(JobRef(self.cluster.name, "flux", existing, plan.uid, plan.name))
        return refs

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        if not refs:
            return {}
        result = self._run(["jobs", "--json", *[ref.job_id for ref in refs]], "flux jobs", check=False)
        found: dict[str, dict] = {}
        for line in result.stdout.splitlines():
            try:
                payload = json.loads(line)
            except json.JSONDecodeError:
                continue
            jobs = payload.get("jobs", [payload]) if isinstance(payload, dict) else []
            for job in jobs:
                for key in ("id", "f58", "jobid"):
                    if key in job:
                        found[str(job[key])] = job
        if not found and not result.ok and not any(marker in result.stderr for marker in ("unknown", "not found")):
            self._run(["jobs", "--json", *[ref.job_id for ref in refs]], "flux jobs")  # raises the typed error
        statuses = {}
        for ref in refs:
            job = found.get(ref.job_id) or self._by_any_id(found, ref.job_id)
            statuses[ref] = status_from_json(ref, job) if job else JobStatus(ref, JobState.UNKNOWN, reason="NoRecord")
        return statuses

    def _by_any_id(self, found: dict[str, dict], job_id: str) -> dict | None:
        for job in found.values():
            if job_id in (str(job.get("id")), str(job.get("f58", "")), str(job.get("jobid", ""))):
                return job
        return None

    def wait(self, ref: JobRef, timeout: float = 3600.0) -> JobStatus:
        """Block on the job's eventlog until it is clean (event-driven), then read its final state once."""
        self._run(["job", "wait-event", f"--timeout={timeout:g}", ref.job_id, "clean"], "flux job wait-event",
                  timeout=timeout + 30)
        return self.poll([ref])[ref]

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        if signal:
            self._run(["job", "kill", f"--signal={signal}", ref.job_id], "flux job kill")
            if grace_seconds:
                done = self._run(["job", "wait-event", f"--timeout={grace_seconds:g}", ref.job_id, "clean"],
                                 "flux job wait-event", check=False, timeout=grace_seconds + 30)
                if done.ok:
                    return
            else:
                return
        self._run(["cancel", ref.job_id], "flux cancel")

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        """The job's output from its guest.output eventlog; with *follow*, streamed until the job ends."""
        if follow:
            result = self._run(["job", "attach", "--read-only", ref.job_id], "flux job attach", timeout=24 * 3600,
                               check=False)
            yield result.stdout
            return
        result = self._run(["job", "eventlog", "--format=json", "--path=guest.output", ref.job_id],
                           "flux job eventlog")
        for line in result.stdout.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            context = event.get("context", {})
            if event.get("name") == "data" and "data" in context:
                yield context["data"]

    def list_jobs(self) -> list[JobStatus]:
        refs = [JobRef(self.cluster.name, "flux", job_id, "", name)
                for name, ids in self._ids_by_name().items() for job_id in ids]
        return list(self.poll(refs).values())

    def check(self) -> str:
        version = self._run(["version"], "flux version").stdout.splitlines()
        size = self._run(["getattr", "size"], "flux getattr size").stdout.strip()
        return f"{version[0] if version else 'flux'}; instance size {size}"
