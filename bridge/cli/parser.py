"""The ``hpcbridge`` argument parser: every subcommand, its options and the function that runs it.

hpcbridge's own short options are ``-c`` (``--cluster``), ``-o`` (``--output``) and ``-f`` (``--follow``), the
same on every subcommand; every other letter on ``submit`` and ``convert`` is sbatch's (bridge.cli.arguments).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol

from bridge import __version__
from bridge.adapters import REGISTRY
from bridge.annotations import CHECKPOINT_ANNOTATION, CLUSTER_ANNOTATION, QUEUE_LABEL
from bridge.cli.admin import cmd_cache, cmd_operator
from bridge.cli.arguments import AFTER_SEPARATOR, Parser, cluster_name, duration, output_format
from bridge.cli.completion import SHELLS, cmd_completion
from bridge.cli.inputs import cmd_convert, cmd_render, cmd_validate
from bridge.cli.jobs import cmd_cancel, cmd_clusters, cmd_list, cmd_logs, cmd_migrate, cmd_status
from bridge.cli.nodes import cmd_initialize, cmd_launch, cmd_stage
from bridge.cli.output import OUTPUTS, TABLE_OUTPUTS
from bridge.cli.submit import cmd_submit

#: where a job command looks for its job without --cluster
JOB_CLUSTER_DEFAULT = "default: $HPCBRIDGE_CLUSTER, else local"


def build_parser(command: str | None = None) -> Parser:
    """Every subcommand; with *command*, only that one's parser when it is one (a run parses one command, and
    argparse's building of the other sixteen was a tenth of a cold ``hpcbridge render``)."""
    parser = Parser(prog="hpcbridge", description="Run one Kubeflow TrainJob on Slurm, Flux, Kubernetes or this "
                                                  "machine.", epilog=f"On submit and convert, {AFTER_SEPARATOR}.")
    parser.add_argument("--version", action="version", version=f"hpcbridge {__version__}")
    if command == "completion":  # its script offers every command's options
        command = None
    sub = OnlySubparsers(parser.add_subparsers(dest="command_name", required=True, parser_class=Parser), command)
    # in the order `hpcbridge --help` lists them
    _add_input_commands(sub)
    _add_job_commands(sub)
    _add_node_commands(sub)
    _add_service_commands(sub)
    p = sub.add_parser("completion", help="print a shell completion script: "
                                          "source <(hpcbridge completion bash)")
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=cmd_completion, root_parser=parser)
    if command is not None and command not in sub.names:  # not a command: the whole parser says so
        return build_parser()
    parser.commands = sub.choices
    return parser


class Subparsers(Protocol):  # what add_subparsers gives
    choices: dict[str, Parser]

    def add_parser(self, name: str, *, help: str) -> Parser: ...


class Unbuilt(Parser):
    """A subcommand the run does not parse: what it declares is dropped, at no cost."""

    def __init__(self) -> None:  # noqa: D107 - argparse's own __init__ is the cost skipped
        self.declared = []
        self.commands = {}

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return argparse.Action([], argparse.SUPPRESS)

    def set_defaults(self, **kwargs: Any) -> None:
        return None


class OnlySubparsers:
    """add_subparsers' object building *only* (every one when None); the names of all are kept."""

    def __init__(self, sub: Subparsers, only: str | None) -> None:
        self.sub, self.only = sub, only
        self.names: list[str] = []
        self.choices = sub.choices

    def add_parser(self, name: str, *, help: str) -> Parser:
        self.names.append(name)
        if self.only is None or name == self.only:
            return self.sub.add_parser(name, help=help)
        return Unbuilt()


def _cluster_options(p: argparse.ArgumentParser, *, sbatch: bool = False) -> None:
    p.add_argument("--cluster", "-c", type=cluster_name if sbatch else str,
                   help="target cluster, or auto: the one that starts it soonest (default: the TrainJob's "
                        f"{CLUSTER_ANNOTATION} annotation, its runtime's, else local)")
    p.add_argument("--runtimes", action="append", default=[], help="file or directory of runtimes")


def _output_option(p: argparse.ArgumentParser, choices: tuple[str, ...] = OUTPUTS, *, sbatch: bool = False,
                   help_text: str = "how to print") -> None:
    # choices as well as the type that checks them: shell completion offers them
    p.add_argument("--output", "-o", type=output_format(choices, sbatch=sbatch), default="text", choices=choices,
                   metavar="{" + ",".join(choices) + "}", help=help_text)


def _add_input_commands(sub: Subparsers) -> None:
    """The commands that read a TrainJob or batch script: validate, render, submit, convert."""
    p = sub.add_parser("validate", help="check files the way submit would, without contacting a backend")
    p.add_argument("files", nargs="+", help="YAML files ('-' for stdin)")
    _cluster_options(p)
    _output_option(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="print exactly what submit would send")
    p.add_argument("file", help="TrainJob YAML ('-' for stdin)")
    p.add_argument("--to", choices=tuple(REGISTRY), help="render for a backend type instead of a configured cluster")
    _cluster_options(p)
    _output_option(p)
    p.set_defaults(func=cmd_render)
    _add_submit(sub)

    p = sub.add_parser("convert", help="convert a batch script or TrainJob; sbatch flags after the file override "
                                       f"({AFTER_SEPARATOR})")
    p.add_argument("file", help="batch script or TrainJob YAML ('-' for stdin)")
    p.add_argument("--to", required=True, choices=("trainjob", "sbatch", "jobspec", "jobset"))
    p.add_argument("--runtimes", action="append", default=[], help="file or directory of runtimes")
    p.set_defaults(func=cmd_convert, sbatch_flags_allowed=True)


def _add_submit(sub: Subparsers) -> None:
    # submit takes sbatch's own flags (-N, -n, -t, -p, ...) after the file; the ones whose names are
    # hpcbridge's too (-c, -o, --cluster, --wait) go after --
    p = sub.add_parser("submit", help="submit a TrainJob or batch script (the local cluster runs it in the "
                                      f"foreground); sbatch flags after the file override ({AFTER_SEPARATOR})")
    p.add_argument("file", help="TrainJob YAML or batch script ('-' for stdin)")
    p.add_argument("--dry-run", action="store_true", help="look the TrainJob up and ask the scheduler as submit "
                                                          "would (sbatch --test-only, a server-side dry run), print "
                                                          "the artifact, send nothing")
    p.add_argument("--wait", action="store_true", help="follow the job's states and exit with its exit code")
    p.add_argument("--rerun", action="store_true", help="run again a TrainJob whose job already finished "
                                                        "(without it, submitting a finished TrainJob is an error)")
    _cluster_options(p, sbatch=True)
    p.add_argument("--queue", help="Kubernetes: the Kueue LocalQueue the JobSet waits in (default: the TrainJob's "
                                   f"{QUEUE_LABEL} label, else the cluster's spec.kubernetes.queue)")
    _output_option(p, sbatch=True, help_text="how --dry-run prints the artifact")
    # the name --output had before -o was hpcbridge's on every subcommand
    p.add_argument("--format", dest="output", type=output_format(OUTPUTS), help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_submit, sbatch_flags_allowed=True)


def _job_command(sub: Subparsers, name: str, help_text: str, func: Callable[[argparse.Namespace], int],
                 many: bool = True, output: bool = True) -> Parser:
    p = sub.add_parser(name, help=help_text)
    if many:
        p.add_argument("jobs", nargs="+", help="backend job ids")
    p.add_argument("--cluster", "-c", help=f"the jobs' cluster ({JOB_CLUSTER_DEFAULT})")
    if output:
        _output_option(p, TABLE_OUTPUTS)
    p.set_defaults(func=func)
    return p


def _add_job_commands(sub: Subparsers) -> None:
    """The commands about submitted jobs (status, list, cancel, logs, migrate) and the clusters."""
    _job_command(sub, "status", "states of jobs", cmd_status)
    _job_command(sub, "list", "jobs hpc-bridge submitted to a cluster", cmd_list, many=False)
    p = _job_command(sub, "cancel", "cancel jobs", cmd_cancel, output=False)
    p.add_argument("--signal", help="send this signal first (e.g. TERM, USR1)")
    p.add_argument("--grace", type=float, help="seconds to wait after --signal before the hard cancel")
    p = _job_command(sub, "logs", "print a job's output", cmd_logs, many=False, output=False)
    p.add_argument("job", help="backend job id")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")

    p = sub.add_parser("migrate", help="stop a job and run it again on another cluster, resuming from its "
                                        f"checkpoint directory (annotation {CHECKPOINT_ANNOTATION})")
    p.add_argument("job", help="the job's id on its cluster")
    p.add_argument("--to", required=True, help="the cluster to run it on now")
    p.add_argument("--cluster", "-c", help=f"the job's cluster ({JOB_CLUSTER_DEFAULT})")
    p.add_argument("--signal", default="TERM@30", help="SIGNAL@SECONDS, as sbatch --signal: sent first, then "
                                                       "the hard stop after SECONDS (default TERM@30)")
    p.add_argument("--reason", default="", help="why it moves (kept in its history)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("clusters", help="list the configured clusters (the built-in local one included)")
    p.add_argument("check", nargs="?", choices=["check"], help="also reach every cluster once")
    _output_option(p, TABLE_OUTPUTS)
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
    p.add_argument("--older-than", type=duration, help="prune: entries unused this long (30m, 12h, 7d)")
    p.add_argument("--all", action="store_true", help="prune: every entry not in use right now")
    p.add_argument("--dry-run", action="store_true", help="prune: say what would go, remove nothing")
    _output_option(p, TABLE_OUTPUTS)
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("operator", help="run the Kubernetes operator: TrainJobs with spec.managedBy "
                                         "hpcbridge.io/bridge run on the BridgeClusters they name")
    p.add_argument("--namespace", action="append", default=[],
                   help="watch only this namespace (repeatable; default: every namespace)")
    p.add_argument("--default-cluster", help="BridgeCluster for TrainJobs whose annotations and runtime name none")
    p.add_argument("--liveness", help="serve a liveness probe on /healthz: PORT (127.0.0.1) or a URL, "
                                      "e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics on /metrics: PORT (127.0.0.1) "
                                                          "or HOST:PORT; beyond loopback needs --metrics-token-file")
    p.add_argument("--metrics-token-file", metavar="PATH",
                   help="bearer token /metrics asks for (default $HPCBRIDGE_METRICS_TOKEN_FILE)")
    p.add_argument("--leader-elect", metavar="NAMESPACE/NAME",
                   help="one active replica: stand by until holding this coordination.k8s.io Lease")
    p.add_argument("--lease-duration", type=float, metavar="SECONDS",
                   help="how long a Lease not renewed stays its holder's (default 15; renewal gives up at 2/3)")
    p.add_argument("--probes", metavar="HOST:PORT", help="serve /healthz and /readyz (active or standby)")
    p.set_defaults(func=cmd_operator)
