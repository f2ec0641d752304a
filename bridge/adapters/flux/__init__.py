"""Flux backend: jobspec v1 submitted with ``flux job submit``, followed through the broker.

Two transports (bridge.adapters.flux.client): the ``flux`` command, here or on a login host over SSH, which
drives a broker of any version, and flux-python for a matching release. State comes from one ``flux jobs --json`` call per poll;
waiting for a job blocks on its eventlog (``flux job wait-event``), not a polling loop.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from bridge.adapters.base import (
    Adapter,
    Artifact,
    ArtifactFile,
    Capabilities,
    Capacity,
    ClusterSize,
    Identity,
    JobRef,
    JobState,
    JobStatus,
    NodeNeed,
    OptionSpec,
)
from bridge.adapters.flux.client import FluxCLI, FluxPython
from bridge.adapters.flux.render import BASE_PATH, render_jobspec
from bridge.adapters.transport import LocalTransport, SSHTransport, Transport
from bridge.api.cluster import BridgeCluster
from bridge.errors import BackendRejected
from bridge.plan import Launcher, LaunchPlan
from bridge.staging.phase import with_stage_phases
from bridge.tenancy import tenant_of

#: Flux job states (RFC 21) → ours; INACTIVE is decided by the result
STATES = {"NEW": JobState.PENDING, "DEPEND": JobState.PENDING, "PRIORITY": JobState.PENDING,
          "SCHED": JobState.PENDING, "RUN": JobState.RUNNING, "CLEANUP": JobState.COMPLETING}
RESULTS = {"COMPLETED": JobState.SUCCEEDED, "FAILED": JobState.FAILED, "CANCELED": JobState.CANCELLED,
           "TIMEOUT": JobState.TIMEOUT}


def make_transport(cluster: BridgeCluster) -> Transport:
    conn = cluster.spec.flux
    env = {"FLUX_URI": conn.uri} if conn is not None and conn.uri else {}
    if conn is not None and conn.host:
        return SSHTransport(conn.host, conn.port or 22, conn.user, conn.key_file, conn.known_hosts_file, env=env,
                            known_hosts_field="spec.flux.knownHostsFile")
    return LocalTransport(env)


def status_from_json(ref: JobRef, job: dict[str, Any]) -> JobStatus:
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


_F58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def f58_number(job_id: str) -> int:
    """A Flux job id (f58 ``ƒ2Xm…``/``f2Xm…`` or decimal) as its integer: FLUIDs grow with submit time."""
    # one prefix only: "f" is also an f58 digit, so lstrip("ƒf") would eat the id's first digit when it is "f"
    text = job_id[1:] if job_id[:1] in ("ƒ", "f") else job_id
    if job_id.isdigit():
        return int(job_id)
    number = 0
    for char in text:
        position = _F58.find(char)
        if position < 0:
            return -1
        number = number * 58 + position
    return number


class FluxAdapter(Adapter):
    backend = "flux"
    capabilities = Capabilities()
    #: Flux's encodings of one id: f58 (ƒ or f, then base58), decimal, hex, dothex, words
    job_id_pattern = re.compile(r"[ƒf]?[1-9A-HJ-NP-Za-km-z]{1,16}|[0-9]{1,20}|0x[0-9a-f]{1,16}|"
                                 r"[0-9a-f]{4}(?:\.[0-9a-f]{4}){3}|[a-z]+(?:-[a-z]+){5}")
    options = (
        OptionSpec("partition", "attributes.system.queue"), OptionSpec("account", "attributes.system.bank"),
        OptionSpec("dependency", "attributes.system.dependencies (RFC 26)"),
        OptionSpec("exclusive", "exclusive node allocation"),
        OptionSpec("constraint", "attributes.system.constraints properties (RFC 31)"),
        OptionSpec("output", "shell output.stdout path"), OptionSpec("error", "shell output.stderr path"),
    )

    def __init__(self, cluster: BridgeCluster, transport: Transport | None = None) -> None:
        super().__init__(cluster)
        self._transport = transport
        self._client: FluxCLI | FluxPython | None = None
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

    @property
    def client(self) -> FluxCLI | FluxPython:
        if self._client is None:
            conn = self.cluster.spec.flux
            if conn is not None and conn.transport == "python":
                self._client = FluxPython(conn.uri)
            else:
                self._client = FluxCLI(self.transport, self.flux)
        return self._client

    def _uid_of(self, job_id: str) -> tuple[str | None, str]:
        spec = self.client.jobspec(job_id) or {}
        user = (spec.get("attributes") or {}).get("user") or {}
        meta = user.get("hpcbridge", {}) if isinstance(user, dict) else {}
        return meta.get("uid"), str(meta.get("name", ""))

    def find(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        """One job listing; only jobs whose name matches are opened to compare uids; newest per uid."""
        by_name = self.client.ids_by_name()
        wanted = {identity.uid: identity for identity in identities}
        newest: dict[str, str] = {}
        for name in {identity.name for identity in identities}:
            for job_id in by_name.get(name, []):
                uid = self._uid_of(job_id)[0]
                if uid in wanted and (uid not in newest or f58_number(job_id) > f58_number(newest[uid])):
                    newest[uid] = job_id
        refs = [JobRef(self.cluster.name, "flux", job_id, uid, wanted[uid].name) for uid, job_id in newest.items()]
        return {ref.uid: status for ref, status in self.poll(refs).items()}

    def submit(self, artifact: Artifact) -> JobRef:
        plan = artifact.plan
        # a suspended TrainJob is submitted held (urgency 0); `flux job urgency ID 16` releases it
        job_id = self.client.submit(artifact.main, 0 if plan.suspend else None)
        return JobRef(self.cluster.name, "flux", job_id, plan.uid, plan.name)

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        """One query for every tracked job."""
        if not refs:
            return {}
        found: dict[str, dict[str, Any]] = {}
        for job in self.client.jobs([ref.job_id for ref in refs]):
            for key in ("id", "jobid"):
                if key in job:
                    found[str(job[key])] = job
        statuses = {}
        for ref in refs:
            record = found.get(ref.job_id)
            statuses[ref] = status_from_json(ref, record) if record else JobStatus(ref, JobState.UNKNOWN, reason="NoRecord")
        return with_stage_phases(statuses, self.cluster.spec.staging_dir,
                                 lambda argv: self.transport.run(argv, timeout=30).stdout, tenant_of(self.cluster))

    def changes(self) -> Generator[str | None, None, None]:
        """The job manager's event journal (``job-manager.events-journal``): a job's id when it starts, ends or
        gets an exception."""
        return self.client.journal()

    def wait(self, ref: JobRef, timeout: float | None = None) -> JobStatus:
        """Block on the job's eventlog until it is clean (event-driven), then read its final state once."""
        self.client.wait_clean(ref.job_id, 7 * 24 * 3600.0 if timeout is None else timeout)
        return self.poll([ref])[ref]

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        self.check_job_id(ref.job_id)
        if signal:
            self.client.kill(ref.job_id, signal)
            if not grace_seconds or self.client.wait_clean(ref.job_id, grace_seconds):
                return
        self.client.cancel(ref.job_id)

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        """The job's output from its guest.output eventlog; with *follow*, streamed until the job ends."""
        yield from self.client.output(ref.job_id, follow)

    def list_jobs(self) -> list[JobStatus]:
        """This user's jobs that carry an hpc-bridge uid (one listing, then each job's jobspec)."""
        refs = []
        for name, ids in self.client.ids_by_name(mine=True).items():
            for job_id in ids:
                uid, recorded_name = self._uid_of(job_id)
                if uid:
                    refs.append(JobRef(self.cluster.name, "flux", job_id, uid, recorded_name or name))
        return list(self.poll(refs).values())

    def dry_run(self, artifact: Artifact) -> None:
        """Flux has no submission that sends nothing: what its job manager refuses at submit beyond the
        jobspec's own checks (done when rendering) is a queue the instance does not have; asked here, and
        refused in the words submit gets. Resources it could never give are not refused at submit (the job is
        taken and fails when the scheduler finds it unsatisfiable), so not here either."""
        queue = artifact.plan.options.partition
        if queue and queue not in self.client.queues():
            raise BackendRejected("flux", self.client.submit_refusal(f"'{queue}' is not a valid queue"))

    def capacity(self, plan: LaunchPlan) -> Capacity:
        from bridge.adapters.flux import capacity

        # a batch (every launcher but Flux's own PMI) takes its nodes exclusively, as `flux batch` does
        return capacity.count(self.client.resources(plan.options.partition), NodeNeed.of(plan),
                              whole_nodes=plan.launcher != Launcher.FLUX)

    def size(self) -> ClusterSize:
        from bridge.adapters.flux import capacity

        return capacity.size(self.client.resources(None))

    def check(self) -> str:
        return self.client.describe()
