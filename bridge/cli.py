"""``hpcbridge``: the command line, a front end that parses arguments and calls bridge.service.

Start-up stays fast: only the api, plan and the chosen adapter are imported; Kubernetes, kopf, paramiko
and flux load inside the adapters that talk to them. argparse rather than typer: typer's import alone
costs more than the whole 150 ms start-up budget. Exit codes: 0 success, 1 backend failure, 2 invalid
input; ``submit`` to the local cluster exits with the job's own code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from bridge import __version__
from bridge.adapters import REGISTRY
from bridge.annotations import CHECKPOINT_ANNOTATION, CLUSTER_ANNOTATION, QUEUE_LABEL
from bridge.errors import AlreadyRan, BridgeError, InvalidSpec

if TYPE_CHECKING:
    from bridge.adapters.base import Artifact, JobStatus
    from bridge.service import Prepared, Retry, Submitted


def _report(lines: Iterable[str]) -> None:
    for line in lines:
        _waiting(line)


def _waiting(line: str) -> None:
    print(f"hpcbridge: note: {line}", file=sys.stderr, flush=True)


def _retry() -> Retry:
    """Transient backend errors are retried a few times, each retry said on stderr."""
    from bridge.service import Retry

    def told(exc: BridgeError, attempt: int, delay: float) -> None:
        print(f"hpcbridge: note: {exc}; retrying in {delay:g}s (attempt {attempt + 1})", file=sys.stderr)

    return Retry(on_retry=told)


def _print_artifact(artifact: Artifact, output: str) -> None:
    if output == "text":
        sys.stdout.write(artifact.text())
    else:
        _print_document(artifact.document(), output)


def _print_document(document: object, output: str) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    elif output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(document, sort_keys=False, width=1_000_000))
    else:
        raise InvalidSpec("--output", output, "use text, yaml or json")


OUTPUTS = ("text", "yaml", "json")


def cmd_validate(args: argparse.Namespace) -> int:
    from bridge import service
    from bridge.api.loader import to_yaml

    for file in args.files:
        source = service.read_input(file)
        _report(source.notes)
        if source.trainjobs:
            plan = service.prepare(source, cluster=args.cluster, runtimes=args.runtimes).plan
            summary = f"{plan.namespace}/{plan.name}: runtime {plan.runtime_name}, cluster {plan.cluster}, " \
                      f"{plan.nodes} node(s) x {plan.procs_per_node} proc(s)"
        else:
            summary = ", ".join(f"{obj.kind} {obj.metadata.name}" for obj in source.objects) or "no objects"
        if args.output == "text":
            print(f"valid: {file}: {summary}")
        elif args.output == "yaml":
            sys.stdout.write(to_yaml(source.objects))
        else:
            _print_document([obj.to_wire() for obj in source.objects], args.output)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Between formats: a batch script or TrainJob in; a TrainJob, batch script, jobspec or JobSet out."""
    from bridge import service

    source = service.read_input(args.file, args.sbatch_flags)
    if args.to == "trainjob":
        from bridge.api.loader import to_yaml

        objects = source.converted()
        _report(source.notes)
        sys.stdout.write(to_yaml(objects))
        return 0
    # one writer per format: converting is rendering for that backend type
    backend = {"jobspec": "flux", "jobset": "kubernetes", "sbatch": "slurm"}[args.to]
    prepared = service.prepare(source, to=backend, runtimes=args.runtimes)
    _report(prepared.notes)
    sys.stdout.write(prepared.artifact.text())
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from bridge import service

    prepared = service.render(args.file, cluster=args.cluster, to=args.to, runtimes=args.runtimes)
    _report(prepared.notes)
    _print_artifact(prepared.artifact, args.output)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from bridge import service

    prepared = service.render(args.file, cluster=args.cluster, runtimes=args.runtimes,
                              sbatch_flags=args.sbatch_flags, queue=args.queue)
    _report(prepared.notes)
    if args.dry_run:
        _print_artifact(prepared.artifact, args.format)
        return 0
    plan = prepared.plan
    if prepared.elements:
        return _submit_array(prepared, args)
    if prepared.adapter.capabilities.foreground:
        return _run_here(prepared)
    submitted = service.submit(prepared, if_finished="rerun" if args.rerun else "error", retry=_retry(),
                               on_wait=_waiting)
    if submitted.existing:
        state = submitted.status.state.value if submitted.status else "known"
        print(f"hpcbridge: note: {plan.namespace}/{plan.name} is already job {submitted.ref.job_id} ({state}); "
              "nothing was submitted", file=sys.stderr)
    print(submitted.ref.job_id)
    if not args.wait:
        return 0
    return service.exit_code(service.Follow(prepared.adapter, submitted.ref, on_change=_show_change).run())


@contextmanager
def _interrupts_call(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Ctrl-C and SIGTERM call *handler* while the block runs: a job in the foreground is cancelled."""
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)


def _run_here(prepared: Prepared) -> int:
    """A backend whose jobs run in the process that submits (``Capabilities.foreground``: the local cluster)
    runs the job in the foreground: Ctrl-C (or SIGTERM) cancels it."""
    from bridge import service

    # a foreground run here is always a new run of a finished TrainJob; one still running is not started twice
    submitted = service.submit(prepared, if_finished="rerun", on_wait=_waiting)
    adapter, ref, plan = prepared.adapter, submitted.ref, prepared.plan
    if submitted.existing:
        raise AlreadyRan(f"{plan.namespace}/{plan.name} is already running on this machine as job {ref.job_id}; "
                         f"`hpcbridge logs -f {ref.job_id} --cluster local` follows it, `hpcbridge cancel` stops it",
                         ref.job_id, "Running")
    with _interrupts_call(lambda signum, _frame: adapter.cancel(ref)):
        status = adapter.wait(ref)
    print(f"hpcbridge: {plan.namespace}/{plan.name} {status.state.value} (exit code {status.exit_code})",
          file=sys.stderr)
    return service.exit_code(status)


def _submit_array(prepared: Prepared, args: argparse.Namespace) -> int:
    """A job array on a backend without arrays: its elements in order (a foreground backend runs them here),
    each id printed as it is sent; with --wait (always, in the foreground) the worst element's exit code."""
    from bridge import service

    adapter, plan = prepared.adapter, prepared.plan
    foreground = adapter.capabilities.foreground
    sent: list[Submitted] = []

    def sent_one(submitted: Submitted) -> None:
        sent.append(submitted)
        print(submitted.ref.job_id, flush=True)

    def stop(_signum: int, _frame: object) -> None:
        for submitted in list(sent):
            adapter.cancel(submitted.ref)
        raise SystemExit(130)

    with _interrupts_call(stop) if foreground else nullcontext():
        service.submit_array(prepared, if_finished="rerun" if foreground or args.rerun else "error", retry=_retry(),
                             on_wait=_waiting, on_sent=sent_one)
        if not (foreground or args.wait):
            return 0
        codes = []
        for submitted in sent:
            status = adapter.wait(submitted.ref) if foreground else service.Follow(
                adapter, submitted.ref, on_change=_show_change).run()
            print(f"hpcbridge: {plan.namespace}/{submitted.ref.name} {status.state.value} (exit code "
                  f"{status.exit_code})", file=sys.stderr)
            codes.append(service.exit_code(status))
        return max(codes)


def _show_change(status: JobStatus) -> None:
    detail = f" ({status.reason})" if status.reason else ""
    where = f" on {','.join(status.nodes)}" if status.nodes and not status.state.finished else ""
    print(f"{status.ref.job_id} {status.state.value}{detail}{where}", file=sys.stderr, flush=True)


def _move_line(move: dict[str, Any]) -> str:
    source, target = move["from"], move["to"]
    how = f" after {move['signal']}" if move.get("signal") else ""
    why = f": {move['reason']}" if move.get("reason") else ""
    return (f"moved from {source['cluster']} job {source['job']} ({source['state']}{how}) to {target['cluster']} "
            f"job {target['job']}{why}")


def _print_statuses(statuses: Iterable[JobStatus], output: str) -> None:
    from bridge.service import status_documents

    rows = status_documents(statuses)
    if output != "text":
        _print_document(rows, output)
        return
    header = ("JOB", "NAME", "STATE", "EXIT", "REASON", "NODES")
    table = [header] + [(r["job"], r["name"] or "-", r["state"], "-" if r["exitCode"] is None else str(r["exitCode"]),
                         r["reason"] or "-", r["nodes"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for row in rows:
        # why it waits (a queue, the scheduler), what it is fetching first, why its initializer failed
        if row.get("message") and (row["state"] in ("Pending", "Suspended")
                                   or row["reason"] in ("Initializing", "InitializerFailed")):
            print(f"{row['job']}: {row['state']}: {row['message']}")
        for move in row.get("history", ()):
            print(f"{row['job']}: {_move_line(move)}")


def cmd_status(args: argparse.Namespace) -> int:
    from bridge import service

    _print_statuses(service.status(service.cluster_adapter(args.cluster), args.jobs, retry=_retry()), args.output)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from bridge import service

    _print_statuses(service.list_jobs(service.cluster_adapter(args.cluster), retry=_retry()), args.output)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from bridge import service

    service.cancel(service.cluster_adapter(args.cluster), args.jobs, signal=args.signal, grace_seconds=args.grace,
                   retry=_retry())
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from bridge import service

    signal, grace = service.parse_stop_signal(args.signal)
    moved = service.migrate(service.cluster_adapter(args.cluster), args.job, args.to, signal=signal,
                            grace_seconds=grace, reason=args.reason, retry=_retry())
    _report(moved.prepared.notes)
    print(f"hpcbridge: {_move_line(moved.move)}", file=sys.stderr)
    print(moved.submitted.ref.job_id)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from bridge import service

    for chunk in service.logs(service.cluster_adapter(args.cluster), args.job, follow=args.follow):
        print(chunk, end="", flush=True)
    return 0


def cmd_clusters(args: argparse.Namespace) -> int:
    from bridge import service

    found = service.clusters()
    if args.check:
        failures = 0
        for name, obj in sorted(found.items()):
            try:
                detail = "ok: " + service.check(obj)
            except BridgeError as exc:
                failures += 1
                detail = f"unreachable: {exc}"
            print(f"{name}\t{obj.spec.type}\t{detail}")
        return 1 if failures else 0
    if args.output == "text":
        for name, obj in sorted(found.items()):
            print(f"{name}\t{obj.spec.type}")
    else:
        _print_document([obj.to_wire() for obj in found.values()], args.output)
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from bridge.mpi.bootstrap import run
    from bridge.mpi.spawn import become_init_if_pid1
    from bridge.mpi.spec import LaunchSpec

    become_init_if_pid1()  # a pod's container starts the launch as PID 1

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    given = ("launcher", "discovery", "procs_per_node", "nodes", "node_rank", "hostfile", "rdzv_port", "job_id",
             "ssh_dir", "ssh_port", "wait_timeout", "leader", "framework", "gpus_per_node")
    spec = LaunchSpec(command=tuple(command), forward_env=tuple(args.forward_env), hosts=tuple(args.host),
                      **{name: getattr(args, name) for name in given})
    code = run(spec)
    # every node runs this at once: skip the interpreter's teardown (~5-8 ms of CPU each), output flushed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_stage(args: argparse.Namespace) -> int:
    from bridge.staging.stage import command_sources, run

    requested = {role: (getattr(args, role), getattr(args, f"{role}_env"), getattr(args, f"{role}_secret"))
                 for role in ("dataset", "model")}
    sources = command_sources(args.job_id, args.tenant, args.namespace, requested,
                              sys.stdin.read if args.env_stdin else None)
    return run(args.job_id, args.staging_dir, sources, args.secrets_dir, tenant=args.tenant,
               namespace=args.namespace)


def cmd_initialize(args: argparse.Namespace) -> int:
    from bridge.staging.stage import initialize

    return initialize(args.role, args.into)


def cmd_cache(args: argparse.Namespace) -> int:
    from bridge import service
    from bridge.staging.cache import size_text

    directory = args.dir or service.staging_dir(args.cluster)
    if args.action == "list":
        entries = service.cache_entries(directory)
        if args.output != "text":
            _print_document([entry for entry in entries], args.output)
            return 0
        print("KEY\tSIZE\tFILES\tLAST USED\tURI\tVERSION")
        for entry in entries:
            print(f"{entry['key']}\t{size_text(entry['bytes'])}\t{entry['files']}\t{entry['lastUsed']}\t"
                  f"{entry['uri']}\t{entry['version'][:12]}")
        return 0
    if not args.all and args.older_than is None:
        raise InvalidSpec("--older-than", None, "say how long unused (e.g. 7d, 12h) or --all")
    removed = service.cache_prune(directory, None if args.all else args.older_than, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for entry in removed:
        print(f"{verb} {entry['key']} {entry['uri']} ({size_text(entry['bytes'])})")
    print(f"hpcbridge: {verb} {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}, "
          f"{size_text(sum(e['bytes'] for e in removed))}", file=sys.stderr)
    return 0


def _duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 12h, 7d)")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, like every other input error
        raise InvalidSpec("", " ".join(sys.argv[1:])[:60], f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hpcbridge", description="Run one Kubeflow TrainJob on Slurm, Flux, Kubernetes or this machine.")
    parser.add_argument("--version", action="version", version=f"hpcbridge {__version__}")
    sub = parser.add_subparsers(dest="command_name", required=True, parser_class=_Parser)
    # in the order `hpcbridge --help` lists them
    _add_input_commands(sub)
    _add_job_commands(sub)
    _add_node_commands(sub)
    _add_service_commands(sub)
    return parser


class Subparsers(Protocol):  # what add_subparsers gives
    def add_parser(self, name: str, *, help: str) -> _Parser: ...


def _cluster_options(p: argparse.ArgumentParser, *flags: str) -> None:
    p.add_argument("--cluster", *flags, help="target cluster, or auto: the one that starts it soonest (default: the "
                                             f"TrainJob's {CLUSTER_ANNOTATION} annotation, its runtime's, else local)")
    p.add_argument("--runtimes", action="append", default=[], help="file or directory of runtimes")


def _output_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=OUTPUTS, default="text")


def _add_input_commands(sub: Subparsers) -> None:
    """The commands that read a TrainJob or batch script: validate, render, submit, convert."""
    p = sub.add_parser("validate", help="check files the way submit would, without contacting a backend")
    p.add_argument("files", nargs="+", help="YAML files ('-' for stdin)")
    _cluster_options(p, "-c")
    _output_option(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="print exactly what submit would send")
    p.add_argument("file", help="TrainJob YAML ('-' for stdin)")
    p.add_argument("--to", choices=tuple(REGISTRY), help="render for a backend type instead of a configured cluster")
    _cluster_options(p, "-c")
    _output_option(p)
    p.set_defaults(func=cmd_render)

    # submit and convert take sbatch's own flags (-N, -n, -c, -t, -p, -o, ...) after the file, so their own
    # options have long names only: -c and -o mean what they mean to sbatch
    p = sub.add_parser("submit", help="submit a TrainJob or batch script (the local cluster runs it in the "
                                      "foreground); sbatch flags after the file override")
    p.add_argument("file", help="TrainJob YAML or batch script ('-' for stdin)")
    p.add_argument("--dry-run", action="store_true", help="print the artifact instead of sending it")
    p.add_argument("--wait", action="store_true", help="follow the job's states and exit with its exit code")
    p.add_argument("--rerun", action="store_true", help="run again a TrainJob whose job already finished "
                                                        "(without it, submitting a finished TrainJob is an error)")
    _cluster_options(p)
    p.add_argument("--queue", help="Kubernetes: the Kueue LocalQueue the JobSet waits in (default: the TrainJob's "
                                   f"{QUEUE_LABEL} label, else the cluster's spec.kubernetes.queue)")
    p.add_argument("--format", choices=OUTPUTS, default="text", help="how --dry-run prints the artifact")
    p.set_defaults(func=cmd_submit, sbatch_flags_allowed=True)

    p = sub.add_parser("convert", help="convert a batch script or TrainJob; sbatch flags after the file override")
    p.add_argument("file", help="batch script or TrainJob YAML ('-' for stdin)")
    p.add_argument("--to", required=True, choices=("trainjob", "sbatch", "jobspec", "jobset"))
    p.add_argument("--runtimes", action="append", default=[], help="file or directory of runtimes")
    p.set_defaults(func=cmd_convert, sbatch_flags_allowed=True)


def _job_command(sub: Subparsers, name: str, help_text: str, func: Callable[[argparse.Namespace], int],
                 many: bool = True) -> _Parser:
    p = sub.add_parser(name, help=help_text)
    if many:
        p.add_argument("jobs", nargs="+", help="backend job ids")
    p.add_argument("--cluster", "-c", help="cluster name (default: $HPCBRIDGE_CLUSTER, or the only remote one)")
    _output_option(p)
    p.set_defaults(func=func)
    return p


def _add_job_commands(sub: Subparsers) -> None:
    """The commands about submitted jobs (status, list, cancel, logs, migrate) and the clusters."""
    _job_command(sub, "status", "states of jobs", cmd_status)
    _job_command(sub, "list", "jobs hpc-bridge submitted to a cluster", cmd_list, many=False)
    p = _job_command(sub, "cancel", "cancel jobs", cmd_cancel)
    p.add_argument("--signal", help="send this signal first (e.g. TERM, USR1)")
    p.add_argument("--grace", type=float, help="seconds to wait after --signal before the hard cancel")
    p = _job_command(sub, "logs", "print a job's output", cmd_logs, many=False)
    p.add_argument("job", help="backend job id")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")

    p = sub.add_parser("migrate", help="stop a job and run it again on another cluster, resuming from its "
                                        f"checkpoint directory (annotation {CHECKPOINT_ANNOTATION})")
    p.add_argument("job", help="the job's id on its cluster")
    p.add_argument("--to", required=True, help="the cluster to run it on now")
    p.add_argument("--cluster", "-c", help="the job's cluster (default: $HPCBRIDGE_CLUSTER, or the only remote one)")
    p.add_argument("--signal", default="TERM@30", help="SIGNAL@SECONDS, as sbatch --signal: sent first, then "
                                                       "the hard stop after SECONDS (default TERM@30)")
    p.add_argument("--reason", default="", help="why it moves (kept in its history)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("clusters", help="list the configured clusters (the built-in local one included)")
    p.add_argument("check", nargs="?", choices=["check"], help="also reach every cluster once")
    _output_option(p)
    p.set_defaults(func=cmd_clusters)


def _add_node_commands(sub: Subparsers) -> None:
    """What a job runs on its nodes: launch, stage, initialize."""
    p = sub.add_parser("launch", help="run on every node of an allocation: discover peers, start the launcher")
    p.add_argument("--launcher", default="plain", help="openmpi, mpich, intel, torchrun, plain, flux or script "
                                                       "(a batch script, with srun and scontrol shims)")
    p.add_argument("--discovery", default="local", help="slurm, flux, jobset, hostfile, explicit or local")
    p.add_argument("--procs-per-node", type=int, default=1, help="ranks (MPI slots) or workers per node")
    p.add_argument("--nodes", type=int, help="expected node count")
    p.add_argument("--host", action="append", default=[], help="a peer, in rank order (explicit or jobset discovery)")
    p.add_argument("--node-rank", type=int, help="this node's rank (default: from the environment)")
    p.add_argument("--hostfile", help="hostfile to read peers from")
    p.add_argument("--leader", help="the peer that is rank 0 and starts the launcher (jobset: the MPI launcher pod)")
    p.add_argument("--rdzv-port", type=int, default=29500, help="torchrun rendezvous (JAX coordinator) port on node 0")
    p.add_argument("--framework", default="", help="jax: each node's process gets JAX_NUM_PROCESSES, JAX_PROCESS_ID "
                                                  "and JAX_COORDINATOR_ADDRESS; xgboost: --procs-per-node workers "
                                                  "per node with DMLC_* and a GPU share each")
    p.add_argument("--gpus-per-node", type=int, default=0,
                   help="GPUs the scheduler gives each node's ranks (--launcher flux asks flux run for them)")
    p.add_argument("--job-id", default="", help="job identity (torchrun rendezvous id)")
    p.add_argument("--forward-env", action="append", default=[], help="variable the launcher forwards to ranks")
    p.add_argument("--ssh-dir", help="the job's SSH keys: ranks reach each other with sshd on --ssh-port")
    p.add_argument("--ssh-port", type=int, default=2222,
                   help="port of the job's sshd on every node (the next port releases the peers)")
    p.add_argument("--wait-timeout", type=float, default=120.0, help="seconds rank 0 waits for every peer's sshd")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("stage", help="fetch a job's dataset and model into the cluster's staging cache (the step "
                                      "an HPC backend runs before launch)")
    p.add_argument("--job-id", required=True, help="the TrainJob's uid: its links go to <staging-dir>/jobs/<uid>/")
    p.add_argument("--staging-dir", required=True, help="the cluster's shared staging directory")
    p.add_argument("--secrets-dir", help="where --*-secret NAME is read, as <dir>/NAME (default "
                                         "~/.config/hpcbridge/secrets; a tenant's: <dir>/<namespace>/NAME)")
    p.add_argument("--tenant", help="the operator's tenant: stage under <staging-dir>/tenants/<tenant>/, 0700")
    p.add_argument("--namespace", help="the TrainJob's namespace (with --tenant: where its secrets are)")
    p.add_argument("--env-stdin", action="store_true",
                   help='read the initializers\' env as JSON from stdin: {"dataset": [[NAME, VALUE], ...], ...}')
    for role in ("dataset", "model"):
        p.add_argument(f"--{role}", help=f"the {role}'s URI (hf://, s3://, file:// or a path)")
        p.add_argument(f"--{role}-env", action="append", default=[], metavar="NAME=VALUE",
                       help=f"the {role} initializer's env (ENDPOINT, IGNORE_PATTERNS, ...)")
        p.add_argument(f"--{role}-secret", metavar="NAME", help=f"the {role} initializer's secret")
    p.set_defaults(func=cmd_stage)

    p = sub.add_parser("initialize", help="Kubeflow's initializer in a pod: fetch $STORAGE_URI into "
                                           "/workspace/<role> (what the dataset-/model-initializer image does)")
    p.add_argument("role", choices=("dataset", "model"))
    p.add_argument("--into", help="where to (default /workspace/<role>)")
    p.set_defaults(func=cmd_initialize)


def _add_service_commands(sub: Subparsers) -> None:
    """What a cluster's keepers run: the staging cache, the operator."""
    p = sub.add_parser("cache", help="the staging cache of a cluster: list its entries, prune unused ones")
    p.add_argument("action", choices=("list", "prune"))
    p.add_argument("--cluster", "-c", help="whose stagingDir (default: the local cluster's)")
    p.add_argument("--dir", help="a staging directory instead of a cluster's")
    p.add_argument("--older-than", type=_duration, help="prune: entries unused this long (30m, 12h, 7d)")
    p.add_argument("--all", action="store_true", help="prune: every entry not in use right now")
    p.add_argument("--dry-run", action="store_true", help="prune: say what would go, remove nothing")
    _output_option(p)
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("operator", help="run the Kubernetes operator: TrainJobs with spec.managedBy "
                                         "hpcbridge.io/bridge run on the BridgeClusters they name")
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable; default: every namespace)")
    p.add_argument("--default-cluster", help="BridgeCluster for TrainJobs whose annotations and runtime name none")
    p.add_argument("--liveness", help="serve a liveness probe on /healthz: PORT (127.0.0.1) or a URL, "
                                      "e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics on /metrics: PORT (127.0.0.1) "
                                                          "or HOST:PORT; beyond loopback needs --metrics-token-file")
    p.add_argument("--metrics-token-file", metavar="PATH",
                   help="bearer token /metrics asks for (default $HPCBRIDGE_METRICS_TOKEN_FILE)")
    p.set_defaults(func=cmd_operator)


def cmd_operator(args: argparse.Namespace) -> int:
    from bridge.operator.main import run

    return run(namespaces=args.namespace, default_cluster=args.default_cluster, liveness=args.liveness,
               metrics=args.metrics, metrics_token_file=args.metrics_token_file)


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("HPCBRIDGE_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG, format="hpcbridge: debug: %(message)s", stream=sys.stderr)
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "sbatch_flags_allowed", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.sbatch_flags = extra
        code: int = args.func(args)
        return code
    except BridgeError as exc:
        print(f"hpcbridge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line for the user, the traceback on request
        if os.environ.get("HPCBRIDGE_DEBUG"):
            raise
        text = " ".join(str(exc).split())[:200]
        print(f"hpcbridge: internal error: {type(exc).__name__}: {text} (a bug; HPCBRIDGE_DEBUG=1 shows where)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
