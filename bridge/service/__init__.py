"""The one orchestration layer: load → validate → resolve → plan → render → submit → poll → cancel → logs.

Every front end (the CLI, the operator) calls these functions and nothing below them: a front end never
builds a LaunchPlan or reaches into an adapter. What lives here and nowhere else:
- idempotent submit: a TrainJob uid that already has a job on the cluster gets that job back; a finished
  one is run again only when asked (``if_finished="rerun"``), never by accident;
- the durable record of submissions (``bridge.records``), written before submit returns;
- bounded retries of transient backend errors (``BackendUnavailable``), reported, then raised.

One module per step: ``inputs`` (read a file), ``targets`` (clusters and their adapters), ``preparation``
(plan and render), ``submission`` (send, or ask as sending would: ``dry_run``), ``jobs`` (status, follow, cancel, logs), ``migration`` (move a job
to another cluster), ``retries``, ``staging_cache``.
"""

from bridge.service.inputs import Input, queued, read_input
from bridge.service.jobs import (
    Follow,
    cancel,
    cancel_ref,
    exit_code,
    job_ref,
    job_refs,
    journal,
    list_jobs,
    logs,
    owned_job,
    poll,
    status,
    status_documents,
    stop_and_remove,
)
from bridge.service.migration import (
    RESUME_ENV,
    Moved,
    add_resume_env,
    history,
    migrate,
    move,
    move_record,
    parse_stop_signal,
    stop_to_move,
)
from bridge.service.preparation import Prepared, prepare, render
from bridge.service.retries import NO_RETRY, Retry
from bridge.service.staging_cache import cache_entries, cache_prune, staging_dir
from bridge.service.submission import (
    IfFinished,
    Listing,
    Submitted,
    dry_run,
    listing,
    submit,
    submit_array,
    submit_many,
    wait_for_dependency,
)
from bridge.service.targets import (
    backend_cluster,
    check,
    cluster_adapter,
    cluster_size,
    clusters,
    get_adapter,
    tenant_adapter,
)

__all__ = [
    "NO_RETRY", "RESUME_ENV", "Follow", "IfFinished", "Input", "Listing", "Moved", "Prepared", "Retry", "Submitted",
    "add_resume_env", "backend_cluster", "cache_entries", "cache_prune", "cancel", "cancel_ref", "check",
    "cluster_adapter", "cluster_size", "clusters", "dry_run", "exit_code", "get_adapter", "history", "job_ref", "job_refs", "journal", "list_jobs", "listing", "logs",
    "migrate", "move", "move_record", "owned_job", "parse_stop_signal", "poll", "prepare", "queued", "read_input", "render",
    "stop_and_remove", "stop_to_move", "staging_dir", "status", "status_documents", "submit", "submit_array", "submit_many",
    "tenant_adapter", "wait_for_dependency",
]
