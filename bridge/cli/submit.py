"""``hpcbridge submit``: send a TrainJob or batch script, run it in the foreground on the local cluster."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from bridge.cli.output import note, print_artifact, report, retry, show_change
from bridge.cli.progress import job_status_line
from bridge.errors import AlreadyRan

if TYPE_CHECKING:
    from bridge.adapters.base import JobRef, JobStatus
    from bridge.plan import LaunchPlan
    from bridge.service import Prepared, Submitted
    from bridge.service.submission import IfFinished


def cmd_submit(args: argparse.Namespace) -> int:
    from bridge import service

    prepared = service.render(args.file, cluster=args.cluster, runtimes=args.runtimes,
                              sbatch_flags=args.sbatch_flags, queue=args.queue)
    report(prepared.notes)
    plan = prepared.plan
    here = prepared.adapter.capabilities.foreground
    # a foreground run here is always a new run of a finished TrainJob; one still running is not started twice
    if_finished: IfFinished = "rerun" if args.rerun or here else "error"
    if args.dry_run:  # what submit would answer, in its words, nothing sent
        existing = service.dry_run(prepared, if_finished=if_finished, retry=retry())
        if existing is not None and not prepared.elements:
            if here:
                raise _running_here(plan, existing.ref)
            _already(plan, existing)
        print_artifact(prepared.artifact, args.output)
        return 0
    if prepared.elements:
        return _submit_array(prepared, args)
    if here:
        return _run_here(prepared)
    submitted = service.submit(prepared, if_finished=if_finished, retry=retry(), on_wait=note)
    if submitted.existing:
        _already(plan, submitted)
    print(submitted.ref.job_id)
    if not args.wait:
        return 0
    with job_status_line(plan, submitted.ref.uid, "Pending") as line:
        def changed(status: JobStatus) -> None:
            show_change(status)
            line.update(status.state.value)

        status = service.Follow(prepared.adapter, submitted.ref, on_change=changed).run()
    return service.exit_code(status)


def _already(plan: LaunchPlan, submitted: Submitted) -> None:
    state = submitted.status.state.value if submitted.status else "known"
    print(f"hpcbridge: note: {plan.namespace}/{plan.name} is already job {submitted.ref.job_id} ({state}); "
          "nothing was submitted", file=sys.stderr)


def _running_here(plan: LaunchPlan, ref: JobRef) -> AlreadyRan:
    return AlreadyRan(f"{plan.namespace}/{plan.name} is already running on this machine as job {ref.job_id}; "
                      f"`hpcbridge logs -f {ref.job_id} --cluster local` follows it, `hpcbridge cancel` stops it",
                      ref.job_id, "Running")


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

    adapter, plan = prepared.adapter, prepared.plan
    # the line shows from the start: a foreground submit runs the stage step before it returns
    with job_status_line(plan, plan.uid, "Pending") as line:
        submitted = service.submit(prepared, if_finished="rerun", on_wait=note)
        ref = submitted.ref
        if submitted.existing:
            raise _running_here(plan, ref)
        print(ref.job_id, flush=True)  # the first line of stdout, as every backend's submit prints it
        line.update("Running")
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
        service.submit_array(prepared, if_finished="rerun" if foreground or args.rerun else "error", retry=retry(),
                             on_wait=note, on_sent=sent_one)
        if not (foreground or args.wait):
            return 0
        codes = []
        for submitted in sent:
            status = adapter.wait(submitted.ref) if foreground else service.Follow(
                adapter, submitted.ref, on_change=show_change).run()
            print(f"hpcbridge: {plan.namespace}/{submitted.ref.name} {status.state.value} (exit code "
                  f"{status.exit_code})", file=sys.stderr)
            codes.append(service.exit_code(status))
        return max(codes)
