"""``hpcbridge``: the command line (DESIGN §8).

Start-up stays fast: only the api, plan and the chosen adapter are imported; Kubernetes, kopf, paramiko
and flux load inside the adapters that talk to them. Exit codes: 0 success, 1 backend failure, 2 invalid
input; ``submit`` to the local cluster exits with the job's own code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Annotated

import typer

from bridge.errors import BridgeError, InvalidSpec

app = typer.Typer(
    name="hpcbridge",
    help="Run one Kubeflow TrainJob on Slurm, Flux, Kubernetes or this machine.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

OutputFormat = Annotated[str, typer.Option("--output", "-o", help="text, yaml or json")]
ClusterOption = Annotated[str | None, typer.Option("--cluster", "-c", help="target cluster (default: the TrainJob's "
                                                      "hpcbridge.io/cluster annotation, else local)")]
RuntimesOption = Annotated[list[str] | None, typer.Option("--runtimes", help="file or directory of runtimes")]
BACKENDS = ("local", "slurm", "flux", "kubernetes")


def _read_objects(file: str):
    from bridge.api.loader import load_documents, load_file

    if file == "-":
        return load_documents(sys.stdin.read(), "<stdin>")
    return load_file(file)


def _prepare(file: str, cluster_name: str | None, to: str | None, runtimes: list[str] | None):
    """Input → (adapter, plan): the shared first half of validate, render and submit."""
    from bridge.adapters import get_adapter
    from bridge.api.catalog import all_runtimes, load_clusters
    from bridge.api.cluster import BridgeCluster
    from bridge.api.trainjob import TrainJob
    from bridge.plan import ANNOTATION_PREFIX, find_runtime, resolve, select_cluster

    objects = _read_objects(file)
    trainjobs = [obj for obj in objects if isinstance(obj, TrainJob)]
    if len(trainjobs) != 1:
        raise InvalidSpec("file", file, f"expected exactly one TrainJob, found {len(trainjobs)}")
    trainjob = trainjobs[0]
    runtime = find_runtime(trainjob, all_runtimes(objects, runtimes or []))
    if to is not None:
        if cluster_name is not None:
            raise InvalidSpec("--to", to, "give either --to or --cluster, not both")
        if to not in BACKENDS:
            raise InvalidSpec("--to", to, f"use one of {', '.join(BACKENDS)}")
        cluster = BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                                "metadata": {"name": to}, "spec": {"type": to}})
    else:
        clusters = load_clusters()
        clusters.update({obj.name: obj for obj in objects if isinstance(obj, BridgeCluster)})
        cluster = select_cluster(trainjob, runtime, clusters, cluster_name)
    if cluster.spec.type == "local":
        cluster = _local_cluster_for_this_process(cluster)
        workdir_key = f"{ANNOTATION_PREFIX}workdir"
        workdir = (trainjob.metadata.annotations or {}).get(workdir_key)
        if workdir and not os.path.isabs(workdir) and file != "-":
            # a relative workdir is relative to the TrainJob's file, so examples run from any directory
            annotations = dict(trainjob.metadata.annotations or {})
            annotations[workdir_key] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(file)), workdir))
            trainjob = trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(
                update={"annotations": annotations})})
    plan = resolve(trainjob, runtime, cluster)
    return get_adapter(cluster), plan


def _local_cluster_for_this_process(cluster):
    """The local cluster launches with this very interpreter unless its config says otherwise."""
    if cluster.spec.defaults.launch_command:
        return cluster
    defaults = cluster.spec.defaults.model_copy(update={"launch_command": [sys.executable, "-m", "bridge", "launch"]})
    return cluster.model_copy(update={"spec": cluster.spec.model_copy(update={"defaults": defaults})})


def _print_artifact(artifact, output: str) -> None:
    if output == "text":
        sys.stdout.write(artifact.text())
        return
    document = {"backend": artifact.backend, "kind": artifact.kind,
                "files": [{"name": f.name, "mediaType": f.media_type, "content": f.content} for f in artifact.files]}
    _print_document(document, output)


def _print_document(document, output: str) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    elif output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(document, sort_keys=False, width=1_000_000))
    else:
        raise InvalidSpec("--output", output, "use text, yaml or json")


@app.command()
def validate(
    files: Annotated[list[str], typer.Argument(help="YAML files ('-' for stdin)")],
    cluster: ClusterOption = None,
    runtimes: RuntimesOption = None,
    output: OutputFormat = "text",
) -> None:
    """Check files the way submit would, without contacting any backend."""
    from bridge.api.loader import to_yaml
    from bridge.api.trainjob import TrainJob

    for file in files:
        objects = _read_objects(file)
        if any(isinstance(obj, TrainJob) for obj in objects):
            adapter, plan = _prepare(file, cluster, None, runtimes)
            adapter.render(plan)  # backend-specific checks (e.g. shell env names) live in render
            summary = f"{plan.namespace}/{plan.name}: runtime {plan.runtime_name}, cluster {plan.cluster}, " \
                      f"{plan.nodes} node(s) x {plan.procs_per_node} proc(s)"
        else:
            summary = ", ".join(f"{obj.kind} {obj.metadata.name}" for obj in objects) or "no objects"
        if output == "text":
            print(f"valid: {file}: {summary}")
        elif output == "yaml":
            sys.stdout.write(to_yaml(objects))
        else:
            _print_document([obj.to_wire() for obj in objects], output)


@app.command()
def render(
    file: Annotated[str, typer.Argument(help="TrainJob YAML ('-' for stdin)")],
    cluster: ClusterOption = None,
    to: Annotated[str | None, typer.Option("--to", help="render for a backend type: " + ", ".join(BACKENDS))] = None,
    runtimes: RuntimesOption = None,
    output: OutputFormat = "text",
) -> None:
    """Print exactly what submit would send to the cluster."""
    adapter, plan = _prepare(file, cluster, to, runtimes)
    _print_artifact(adapter.render(plan), output)


@app.command()
def submit(
    file: Annotated[str, typer.Argument(help="TrainJob YAML ('-' for stdin)")],
    cluster: ClusterOption = None,
    runtimes: RuntimesOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the artifact instead of sending it")] = False,
    output: OutputFormat = "text",
) -> None:
    """Submit a TrainJob. On the local cluster it runs in the foreground and exits with the job's code."""
    adapter, plan = _prepare(file, cluster, None, runtimes)
    artifact = adapter.render(plan)
    if dry_run:
        _print_artifact(artifact, output)
        return
    ref = adapter.submit(artifact)
    if plan.backend != "local":
        print(ref.job_id)
        return
    stop = lambda signum, _frame: adapter.cancel(ref)  # noqa: E731 - one-line signal bridge
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = adapter.wait(ref)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"hpcbridge: {plan.namespace}/{plan.name} {status.state.value} (exit code {status.exit_code})",
          file=sys.stderr)
    raise typer.Exit(status.exit_code or 0)


@app.command()
def clusters(output: OutputFormat = "text") -> None:
    """List the configured clusters (the built-in local one included)."""
    from bridge.api.catalog import load_clusters

    found = load_clusters()
    if output == "text":
        for name, obj in sorted(found.items()):
            print(f"{name}\t{obj.spec.type}")
    else:
        _print_document([obj.to_wire() for obj in found.values()], output)


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    command: Annotated[list[str], typer.Argument(help="the training command, after --")],
    launcher: Annotated[str, typer.Option(help="openmpi, mpich, intel, torchrun, plain or flux")] = "plain",
    discovery: Annotated[str, typer.Option(help="slurm, flux, jobset, hostfile, explicit or local")] = "local",
    procs_per_node: Annotated[int, typer.Option(help="ranks (MPI slots) or workers per node")] = 1,
    nodes: Annotated[int | None, typer.Option(help="expected node count")] = None,
    host: Annotated[list[str] | None, typer.Option(help="a peer, in rank order (explicit discovery)")] = None,
    node_rank: Annotated[int | None, typer.Option(help="this node's rank (default: from the environment)")] = None,
    hostfile: Annotated[str | None, typer.Option(help="hostfile to read peers from")] = None,
    rdzv_port: Annotated[int, typer.Option(help="torchrun rendezvous port on node 0")] = 29500,
    job_id: Annotated[str, typer.Option(help="job identity (torchrun rendezvous id)")] = "",
    forward_env: Annotated[list[str] | None, typer.Option(help="env variable the launcher forwards to ranks")] = None,
) -> None:
    """Run on every node of an allocation: discover peers, write the hostfile, start the launcher."""
    from bridge.mpi.bootstrap import LaunchSpec, run

    spec = LaunchSpec(launcher=launcher, discovery=discovery, procs_per_node=procs_per_node, command=tuple(command),
                      nodes=nodes, forward_env=tuple(forward_env or ()), hosts=tuple(host or ()),
                      node_rank=node_rank, hostfile=hostfile, rdzv_port=rdzv_port, job_id=job_id)
    raise typer.Exit(run(spec))


def main(argv: list[str] | None = None) -> int:
    import click

    try:
        app(args=argv, prog_name="hpcbridge", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        print(f"hpcbridge: {exc.format_message()}", file=sys.stderr)
        return 2
    except click.Abort:
        return 130
    except BridgeError as exc:
        print(f"hpcbridge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
