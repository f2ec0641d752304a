"""Submitting through the orchestration layer, as every front end does (idempotency lives there)."""

from __future__ import annotations

from bridge import service


def submit(adapter, plan, if_finished: service.IfFinished = "error"):
    """The JobRef of *plan* on *adapter*'s cluster: found by uid when it already exists, else sent."""
    return service.submit(service.Prepared(adapter, plan, adapter.render(plan)), if_finished=if_finished).ref


def submit_many(adapter, artifacts, if_finished: service.IfFinished = "error"):
    batch = [service.Prepared(adapter, artifact.plan, artifact) for artifact in artifacts]
    return [item.ref for item in service.submit_many(batch, if_finished=if_finished)]
