"""Bounded retries of transient backend errors (``BackendUnavailable``): reported, then raised."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from bridge.errors import BridgeError

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """Bounded exponential backoff for errors that say they are ``retryable`` (``BackendUnavailable``);
    every other error passes through at once."""

    attempts: int = 4
    first_delay: float = 0.5
    factor: float = 2.0
    sleep: Callable[[float], None] = time.sleep
    #: told of each retry: the error, the attempt that failed (1-based), the delay before the next
    on_retry: Callable[[BridgeError, int, float], None] | None = None

    def call(self, fn: Callable[[], T]) -> T:
        delay = self.first_delay
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except BridgeError as exc:
                if not exc.retryable or attempt == self.attempts:
                    raise
                if self.on_retry is not None:
                    self.on_retry(exc, attempt, delay)
                self.sleep(delay)
                delay *= self.factor
        raise AssertionError("unreachable")


NO_RETRY = Retry(attempts=1)
