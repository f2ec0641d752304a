"""Slurm backend: batch scripts sent with sbatch, followed with one squeue per poll.

Jobs that have left squeue are looked up in accounting (sacct) or, on clusters without slurmdbd, in the
job-completion log (sacct -c): a finished job is never reported as lost.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

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
from bridge.adapters.slurm.render import (
    comment_uid,
    job_env,
    job_env_names,
    render_script,
    sbatch_command,
    tenant_flags,
)
from bridge.adapters.slurm.state import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmRecord,
    combine_components,
    parse_sacct,
    parse_squeue,
)
from bridge.errors import BackendRejected, BackendUnavailable
from bridge.plan import LaunchPlan

if TYPE_CHECKING:  # rendering needs neither: render never starts a process
    from bridge.adapters.slurm.sinfo import NodeRow
    from bridge.adapters.transport import CommandResult, Transport
    from bridge.api.cluster import BridgeCluster

_PARSABLE_ID = re.compile(r"^(\d+)(;\S+)?$")
_TEST_ONLY_REFUSAL = re.compile(r"^(?:sbatch: )?allocation failure: ", re.MULTILINE)
#: what --test-only says of a job that can never start, whether or not sbatch would queue it
_NEVER_STARTS = "Requested node configuration is not available"
# sbatch/squeue messages that mean "try again", as opposed to "your request is wrong"
_TRANSIENT = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
              "Slurm backup controller in standby mode", "Zero Bytes were transmitted or received",
              "Resource temporarily unavailable", "Communication connection failure")


def make_transport(cluster: BridgeCluster) -> Transport:
    from bridge.adapters.transport import LocalTransport, SSHTransport

    conn = cluster.spec.slurm
    env = {"SLURM_CONF": conn.slurm_conf} if conn and conn.slurm_conf else {}
    if conn is not None and conn.transport == "ssh":
        assert conn.host  # SlurmConnection requires a host for ssh
        return SSHTransport(conn.host, conn.port or 22, conn.user, conn.key_file, conn.known_hosts_file, env=env)
    local = LocalTransport(env)
    if conn is not None and conn.user:
        from bridge.adapters.run_as import RunAs, current_user

        if conn.user != current_user():  # a tenant's jobs: every command as its user, never as ours
            return RunAs(local, conn.user)
    return local


#: more job ids than this are read from one listing of every job, not squeue --jobs: squeue matches each job
#: against its --jobs list one by one (9,000 ids among 9,000 jobs: 1.15 s, against 68 ms for the listing)
SQUEUE_IDS_MAX = 256


def _job_number(job_id: str) -> int:
    """123, 123_4 (array task), 123+1 (het component) → 123, for "newest" comparisons."""
    match = re.match(r"\d+", job_id)
    return int(match.group()) if match else -1


class SlurmAdapter(Adapter):
    backend = "slurm"
    capabilities = Capabilities()
    #: 123, an array task 123_4, a heterogeneous component 123+1
    job_id_pattern = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10}|\+[0-9]{1,4})?")
    options = (
        OptionSpec("partition", "#SBATCH --partition"), OptionSpec("account", "#SBATCH --account"),
        OptionSpec("qos", "#SBATCH --qos"), OptionSpec("constraint", "#SBATCH --constraint"),
        OptionSpec("exclusive", "#SBATCH --exclusive"), OptionSpec("array", "#SBATCH --array"),
        OptionSpec("dependency", "#SBATCH --dependency"), OptionSpec("output", "#SBATCH --output"),
        OptionSpec("error", "#SBATCH --error"), OptionSpec("sbatch", "#SBATCH --<option>, verbatim"),
    )

    def __init__(self, cluster: BridgeCluster, transport: Transport | None = None) -> None:
        super().__init__(cluster)
        self._transport = transport
        conn = cluster.spec.slurm
        self.rest = None
        if conn is not None and conn.transport == "rest":
            from bridge.adapters.slurm.rest import RestClient

            assert conn.rest_url  # SlurmConnection requires restUrl for rest
            self.rest = RestClient(conn.rest_url, conn.user, conn.token_file, api_version=conn.rest_api_version)
        # slurmrestd takes options as JSON fields and reads no #SBATCH line: scripts go by what they mean
        self.capabilities = Capabilities(batch_scripts=self.rest is None, lists_every_job=True)
        self._local = conn is None or conn.transport == "local"

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = make_transport(self.cluster)
        return self._transport

    def render(self, plan: LaunchPlan) -> Artifact:
        if plan.batch_script is not None and self.rest is None:
            # the user's batch script as it is; here sbatch reads the file itself, as `sbatch FILE` would
            source = plan.batch_script
            name = os.path.basename(source.path) if source.path else f"{plan.name}.sbatch"
            env = self._job_env(plan)
            names = (ArtifactFile(f"{plan.name}.env", job_env_names(env)),) if env is not None else ()
            return Artifact("slurm", "batch-script", plan,
                            (ArtifactFile(name, source.text, "text/x-shellscript"), *names),
                            command=sbatch_command(plan, file_argument=self._local))
        script = ArtifactFile(f"{plan.name}.sbatch", render_script(plan), "text/x-shellscript")
        if self.rest is None:
            env = self._job_env(plan)
            if env is not None:
                # a tenant's job: what sbatch is called with, and the names of what it reads on fd 3
                return Artifact("slurm", "sbatch-script", plan,
                                (script, ArtifactFile(f"{plan.name}.env", job_env_names(env))),
                                command=("sbatch", "--parsable", *tenant_flags(plan)))
            return Artifact("slurm", "sbatch-script", plan, (script,))
        import json

        from bridge.adapters.slurm.rest import submission

        # the job description is in the terms of the API the server speaks (read from it once, unless pinned)
        body = submission(plan, self._rest_env(), self.rest.api)
        return Artifact("slurm", "slurmrestd-submission", plan,
                        (ArtifactFile(f"{plan.name}.job.json", json.dumps(body, indent=2) + "\n",
                                      "application/json"), script))

    def _job_env(self, plan: LaunchPlan) -> dict[str, str] | None:
        conn = self.cluster.spec.slurm
        return job_env(plan, conn.slurm_conf if conn else None)

    def _rest_env(self) -> dict[str, str]:
        conn = self.cluster.spec.slurm
        # srun inside a REST job looks for /etc/slurm/slurm.conf unless told otherwise
        return {"SLURM_CONF": conn.slurm_conf} if conn and conn.slurm_conf else {}

    # --- sending -------------------------------------------------------------------------------------

    def _check(self, result: CommandResult, what: str) -> CommandResult:
        if result.ok:
            return result
        message = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.returncode}").splitlines()
        text = " ".join(line.strip() for line in message)[:500].removeprefix(f"{what}: ")
        if any(marker in text for marker in _TRANSIENT):
            raise BackendUnavailable("slurm", f"{what}: {text}")
        raise BackendRejected("slurm", f"{what}: {text}")

    def _all_records(self, mine: bool = False, only: Collection[str] | None = None) -> list[SlurmRecord]:
        """squeue's records: all jobs, or with *mine* this user's (REST: the token's user); with *only*, just
        the jobs with those ids."""
        if self.rest is not None:
            user = self.cluster.spec.slurm.user if mine and self.cluster.spec.slurm else None
            records = combine_components([self.rest.api.record(job) for job in self.rest.jobs()
                                          if user is None or job.get("user_name") == user])
            return records if only is None else [r for r in records if r.job_id in only]
        argv = ["squeue", "--noheader", "--states=all", f"--Format={SQUEUE_FORMAT}"]
        if mine:
            argv.append("--me")
        return parse_squeue(self._check(self.transport.run(argv), "squeue").stdout, only)

    def find(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        """The newest job per uid. Jobs recorded for these uids are asked for by id first (``squeue --me
        --jobs``: costs what the batch holds, not what the queue holds, so an operator re-attaching thousands of
        TrainJobs does not read the whole queue once per group); every other uid, and one whose recorded job is
        not this user's, does not carry it or has finished (a newer rerun may exist), comes from one listing of
        this user's jobs (a job's Slurm name need not be its TrainJob's: a batch script keeps its own)."""
        found = self._found_where_recorded(identities)
        wanted = {identity.uid for identity in identities} - found.keys()
        if not wanted:
            return found
        newest: dict[str, tuple[int, JobStatus]] = {}
        for record in self._all_records(mine=True):
            uid = comment_uid(record.comment)
            if uid in wanted:
                order = _job_number(record.job_id)
                if uid not in newest or order > newest[uid][0]:
                    ref = JobRef(self.cluster.name, "slurm", record.job_id, uid, record.name)
                    newest[uid] = (order, self._status(ref, record))
        return {**found, **{uid: status for uid, (_, status) in newest.items()}}

    def _found_where_recorded(self, identities: Sequence[Identity]) -> dict[str, JobStatus]:
        """The uids whose recorded job id names a live job of this user that carries the uid (the id is only a
        hint: a tenant can write it)."""
        recorded = {identity.job_id: identity.uid for identity in identities
                    if identity.job_id and identity.job_id.isdigit()}
        if self.rest is not None or not recorded or len(recorded) > SQUEUE_IDS_MAX:
            return {}  # slurmrestd lists every job anyway; so many ids cost more than one listing
        found: dict[str, JobStatus] = {}
        for record in self._squeue_jobs(list(recorded), mine=True):
            uid = recorded.get(record.job_id)
            if uid is None or comment_uid(record.comment) != uid:
                continue
            if record.state.finished or record.state is JobState.UNKNOWN:
                continue
            found[uid] = self._status(JobRef(self.cluster.name, "slurm", record.job_id, uid, record.name), record)
        return found

    def list_jobs(self) -> list[JobStatus]:
        """This user's jobs that carry an hpc-bridge uid (squeue --me; REST: the token's user)."""
        statuses = []
        for record in self._all_records(mine=True):
            uid = comment_uid(record.comment)
            if uid:
                ref = JobRef(self.cluster.name, "slurm", record.job_id, uid, record.name)
                statuses.append(self._status(ref, record))
        return statuses

    def _node_rows(self) -> list[NodeRow]:
        from bridge.adapters.slurm import sinfo

        if self.rest is not None:
            return self.rest.node_rows()
        return sinfo.parse(self._check(self.transport.run(sinfo.SINFO, timeout=30), "sinfo").stdout)

    def capacity(self, plan: LaunchPlan) -> Capacity:
        from bridge.adapters.slurm import sinfo

        return sinfo.count(self._node_rows(), NodeNeed.of(plan), plan.nodes, plan.options.partition,
                           plan.time_limit_seconds)

    def size(self) -> ClusterSize:
        from bridge.adapters.slurm import sinfo

        return sinfo.size(self._node_rows(), "slurmrestd nodes" if self.rest is not None else "sinfo")

    def check(self) -> str:
        if self.rest is not None:
            return self.rest.ping()
        result = self._check(self.transport.run(["scontrol", "ping"], timeout=10), "scontrol ping")
        version = self.transport.run(["sinfo", "--version"], timeout=30).stdout.strip()
        return f"{' '.join(result.stdout.split())}; {version}"

    def submit(self, artifact: Artifact) -> JobRef:
        plan = artifact.plan
        return JobRef(self.cluster.name, "slurm", self._send(artifact), plan.uid, plan.name)

    def _send(self, artifact: Artifact) -> str:
        if self.rest is not None:
            import json

            return self.rest.submit(json.loads(artifact.main))
        result = self._check(self._sbatch(artifact), "sbatch")
        match = _PARSABLE_ID.match(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "")
        if not match:
            raise BackendUnavailable("slurm", f"sbatch printed no job id: {result.stdout.strip()[:200]!r}")
        return match.group(1)

    def _sbatch(self, artifact: Artifact, *flags: str) -> CommandResult:
        """sbatch as submit calls it (command, script, tenant environment), with *flags* after its name."""
        command = artifact.command or ("sbatch", "--parsable")
        reads_file = command[-1] == (artifact.plan.batch_script and artifact.plan.batch_script.path)
        env = self._job_env(artifact.plan) if artifact.command else None
        # a tenant's job environment travels apart from the command (the transport hands it to sbatch on fd 3);
        # the CLI's sbatch exports the user's environment as it always has
        extra: dict[str, Any] = {"job_env": env} if env is not None else {}
        return self.transport.run([command[0], *flags, *command[1:]], stdin=None if reads_file else artifact.main,
                                  resend=False, **extra)

    def dry_run(self, artifact: Artifact) -> None:
        """``sbatch --test-only`` with submit's command, script and environment: slurmctld checks the job as
        if submitted (partition, limits, node configuration, account, QOS) and queues nothing. slurmrestd has
        no such call: over REST a dry run ends with what planning checked, and the scheduler answers at submit."""
        if self.rest is not None:
            return
        result = self._sbatch(artifact, "--test-only")
        if result.ok or _NEVER_STARTS in result.stderr and self._would_pend(artifact.plan):
            return
        # --test-only words the controller's refusal as "allocation failure: <reason>"; submit's sbatch says
        # "error: Batch job submission failed: <reason>": the dry run reports it as submit does (submit alone
        # adds the controller's detail line before it, which --test-only never receives)
        self._check(replace(result, stderr=_TEST_ONLY_REFUSAL.sub("sbatch: error: Batch job submission failed: ",
                                                                  result.stderr)), "sbatch")

    def _would_pend(self, plan: LaunchPlan) -> bool:
        """A job --test-only refuses because it can never start, which sbatch still queues, to pend until the
        partition grows: it exceeds a limit of its partition, and the cluster does not enforce partition limits
        at submission (EnforcePartLimits=NO, Slurm's default)."""
        from bridge.adapters.slurm import sinfo

        rows = sinfo.parse(self._check(self.transport.run(sinfo.SINFO, timeout=30), "sinfo").stdout)
        beyond = sinfo.beyond_partition(rows, NodeNeed.of(plan), plan.nodes, plan.options.partition,
                                        plan.time_limit_seconds)
        if beyond is None:
            return False  # within its partition's limits and still impossible: sbatch refuses it too
        config = self._check(self.transport.run(["scontrol", "show", "config"], timeout=30), "scontrol").stdout
        enforce = re.search(r"^EnforcePartLimits\s*=\s*(\S+)", config, re.MULTILINE)
        version = re.search(r"^SLURM_VERSION\s*=\s*(\d+)\.(\d+)", config, re.MULTILINE)
        if version is not None and (int(version.group(1)), int(version.group(2))) == (24, 11):
            return False  # 24.11's sbatch refuses such a job at submission, whatever EnforcePartLimits says
        return enforce is not None and enforce.group(1).upper() == "NO"

    # --- following -----------------------------------------------------------------------------------

    def poll(self, refs: Sequence[JobRef]) -> dict[JobRef, JobStatus]:
        """One squeue for every tracked job; only jobs squeue no longer knows cost a second (sacct) call."""
        if not refs:
            return {}
        by_id = {ref.job_id: ref for ref in refs}
        records = {r.job_id: r for r in self._squeue(list(by_id))}
        missing = [job_id for job_id in by_id if job_id not in records]
        if missing:
            records.update({r.job_id: r for r in self._sacct(missing)})
        statuses = {}
        for job_id, ref in by_id.items():
            record = records.get(job_id)
            if record is None:
                statuses[ref] = JobStatus(ref, JobState.UNKNOWN, reason="NoRecord",
                                          message="neither squeue nor accounting knows this job")
            else:
                statuses[ref] = self._status(ref, record)
        return self._with_stage_phases(statuses)

    def _with_stage_phases(self, statuses: dict[JobRef, JobStatus]) -> dict[JobRef, JobStatus]:
        if self.rest is not None:
            return statuses  # no shell on the cluster to read the phase files with
        from bridge.staging.phase import with_stage_phases
        from bridge.tenancy import tenant_of

        # one command prints every job's phase file, each on its own line (a job without initializers: empty)
        return with_stage_phases(statuses, self.cluster.spec.staging_dir,
                                 lambda argv: self.transport.run(argv, timeout=30).stdout, tenant_of(self.cluster))

    def _squeue(self, job_ids: list[str]) -> list[SlurmRecord]:
        # a plain job id is a listing's row (a heterogeneous job's components fold into it); an array task's
        # (123_4) or a component's (123+1) is asked for by name, as a listing may print it otherwise
        if self.rest is not None:
            return self._all_records(only=set(job_ids))
        plain = {job_id for job_id in job_ids if job_id.isdigit()}
        if len(plain) <= SQUEUE_IDS_MAX:
            return self._squeue_jobs(job_ids)
        named = [job_id for job_id in job_ids if job_id not in plain]
        return self._all_records(only=plain) + (self._squeue_jobs(named) if named else [])

    def _squeue_jobs(self, job_ids: list[str], mine: bool = False) -> list[SlurmRecord]:
        result = self.transport.run(["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}",
                                     f"--Format={SQUEUE_FORMAT}", *(["--me"] if mine else [])])
        if not result.ok and "Invalid job id specified" in result.stderr:
            return []  # none of them is in squeue any more
        return parse_squeue(self._check(result, "squeue").stdout)

    def _sacct(self, job_ids: list[str]) -> list[SlurmRecord]:
        if self.rest is not None:
            return []  # history needs slurmdbd's API (not loaded): such jobs read as NoRecord
        fields = ",".join(SACCT_FIELDS)
        base = ["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={','.join(job_ids)}",
                f"--format={fields}"]
        result = self.transport.run(base)
        if result.ok:
            return parse_sacct(result.stdout)
        if "accounting storage is disabled" in result.stderr or "accounting_storage/none" in result.stderr:
            # no slurmdbd: the job-completion log still has every finished job
            result = self._check(self.transport.run([*base[:1], "--completion", "--starttime=1970-01-01", *base[1:]]),
                                 "sacct --completion")
            return [r for r in parse_sacct(result.stdout) if r.job_id in job_ids]
        self._check(result, "sacct")
        return []

    def _status(self, ref: JobRef, record: SlurmRecord) -> JobStatus:
        nodes = (record.nodes,) if record.nodes and record.nodes not in ("(null)", "None assigned") else ()
        return JobStatus(ref, record.state, exit_code=record.exit_code, reason=record.reason,
                         message=record.slurm_state, nodes=nodes)

    def cancel(self, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None) -> None:
        """TERM (the default) is Slurm's own cancel: SIGTERM to every step, SIGKILL after the cluster's
        KillWait, and the job ends CANCELLED. Another signal (USR1 to checkpoint, say) is sent first; a job
        that ends by itself within *grace_seconds* keeps the state its exit gives it, else it is cancelled."""
        self.check_job_id(ref.job_id)
        if signal not in (None, "TERM"):
            if self.rest is not None:
                self.rest.cancel(ref.job_id, signal)
            else:
                self._check(self.transport.run(["scancel", f"--signal={signal}", ref.job_id]), "scancel")
            if not grace_seconds:
                return
            deadline = time.monotonic() + grace_seconds
            while time.monotonic() < deadline:
                if self.poll([ref])[ref].state.finished:
                    return
                time.sleep(min(1.0, grace_seconds))
        # over REST as on the CLI: Slurm's own cancel (a signal request only signals the job's steps, so a batch
        # script running no step would go on)
        if self.rest is not None:
            self.rest.cancel(ref.job_id)
        else:
            self._check(self.transport.run(["scancel", ref.job_id]), "scancel")

    def output_path(self, ref: JobRef) -> str | None:
        self.check_job_id(ref.job_id)
        if self.rest is not None:
            return self.rest.output_path(ref.job_id)
        result = self.transport.run(["scontrol", "--oneliner", "show", "job", ref.job_id])
        if not result.ok:
            return None
        match = re.search(r"(?:^|\s)StdOut=(\S+)", result.stdout)
        return match.group(1) if match else None

    def logs(self, ref: JobRef, follow: bool = False, poll_interval: float = 1.0) -> Iterator[str]:
        """The job's output file, read over the transport; with *follow*, until the job ends."""
        path = self.output_path(ref)
        if path is None:
            raise BackendRejected("slurm", f"job {ref.job_id} has no output file Slurm still knows of")
        if self.rest is not None and not os.path.exists(path):
            raise BackendRejected("slurm", f"{path} is not readable here; slurmrestd serves no files "
                                           "(use a shared filesystem, or the ssh transport for logs)")
        offset = 0
        while True:
            result = self.transport.run(["tail", "-c", f"+{offset + 1}", path])
            if result.ok and result.stdout:
                offset += len(result.stdout.encode("utf-8"))
                yield result.stdout
            if not follow:
                return
            if self.poll([ref])[ref].state.finished:
                final = self.transport.run(["tail", "-c", f"+{offset + 1}", path])
                if final.ok and final.stdout:
                    yield final.stdout
                return
            time.sleep(poll_interval)
