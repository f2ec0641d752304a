"""The commands that read a TrainJob or batch script and print what it becomes: validate, convert, render."""

from __future__ import annotations

import argparse
import sys

from bridge.cli.output import print_artifact, print_document, report


def cmd_validate(args: argparse.Namespace) -> int:
    from bridge import service
    from bridge.api.loader import to_yaml

    for file in args.files:
        source = service.read_input(file)
        report(source.notes)
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
            print_document([obj.to_wire() for obj in source.objects], args.output)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Between formats: a batch script or TrainJob in; a TrainJob, batch script, jobspec or JobSet out."""
    from bridge import service

    source = service.read_input(args.file, args.sbatch_flags)
    if args.to == "trainjob":
        from bridge.api.loader import to_yaml

        objects = source.converted()
        report(source.notes)
        sys.stdout.write(to_yaml(objects))
        return 0
    # one writer per format: converting is rendering for that backend type
    backend = {"jobspec": "flux", "jobset": "kubernetes", "sbatch": "slurm"}[args.to]
    prepared = service.prepare(source, to=backend, runtimes=args.runtimes)
    report(prepared.notes)
    sys.stdout.write(prepared.artifact.text())
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from bridge import service

    prepared = service.render(args.file, cluster=args.cluster, to=args.to, runtimes=args.runtimes)
    report(prepared.notes)
    print_artifact(prepared.artifact, args.output)
    return 0
