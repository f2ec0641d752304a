"""Waiting on a backend in tests: poll an adapter until a state shows up, bounded by a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable

from bridge.adapters.base import Adapter, JobRef, JobStatus


def poll_until(adapter: Adapter, ref: JobRef, predicate: Callable[[JobStatus], bool], timeout: float = 120.0,
               interval: float = 0.1) -> JobStatus:
    """The first status that satisfies *predicate*, or the last one seen when *timeout* passes.

    The deadline only bounds a hung test; it asserts nothing, so the caller's assertion reports the state.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = adapter.poll([ref])[ref]
        if predicate(status) or time.monotonic() > deadline:
            return status
        time.sleep(interval)
