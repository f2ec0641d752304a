"""Group commit of one cluster's submissions from the operator's many workers, through
``bridge.service.submit_many``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from bridge import service
from bridge.errors import BridgeError


class Submitter:
    """Group commit of one cluster's submissions: ``run`` calls arriving from many kopf workers while a group
    is being sent wait and go out together as the next group, with one lookup by uid for all of it (one
    squeue for a burst of TrainJobs instead of one each); a lone submission goes out at once.

    Re-attaches (TrainJobs whose status says they were sent) come in bursts: a restart or a fail-over follows
    every TrainJob again, one group after another. Their lookups share one listing of the cluster's jobs,
    read for the first group of several and kept *listing_life* seconds (each job in it answers only for the
    TrainJob that recorded it, while it has not finished), where the backend's listing is what its lookup
    reads (``service.listing``)."""

    def __init__(self, retry: service.Retry, listing_life: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.retry, self.listing_life, self.clock = retry, listing_life, clock
        self._queue: list[tuple[Any, service.IfFinished, Future[service.Submitted]]] = []
        self._lock = threading.Lock()
        self._sending = False
        #: the listing kept per adapter (one identity on the cluster) and when it was read; only the caller
        #: sending touches it
        self._listings: dict[int, tuple[float, service.Listing]] = {}

    def submit(self, prepared: service.Prepared, if_finished: service.IfFinished) -> service.Submitted:
        future: Future[service.Submitted] = Future()
        with self._lock:
            self._queue.append((prepared, if_finished, future))
            lead, self._sending = not self._sending, True
        if lead:  # this caller sends groups until none is waiting; the others wait for their answers
            while True:
                with self._lock:
                    group, self._queue = self._queue, []
                    if not group:
                        self._sending = False
                        break
                self._send(group)
        return future.result()

    def _send(self, group: list[tuple[Any, service.IfFinished, Future[service.Submitted]]]) -> None:
        batches: dict[tuple[int, str], list[tuple[Any, service.IfFinished, Future[service.Submitted]]]] = {}
        for entry in group:
            batches.setdefault((id(entry[0].adapter), entry[1]), []).append(entry)
        for batch in batches.values():
            self._send_batch(batch)

    def _send_batch(self, batch: list[tuple[Any, service.IfFinished, Future[service.Submitted]]]) -> None:
        # one plan per uid (kopf runs one handler per TrainJob at a time; a duplicate shares the answer)
        by_uid: dict[str, list[Future[service.Submitted]]] = {}
        plans = []
        for prepared, _, future in batch:
            if prepared.plan.uid not in by_uid:
                plans.append(prepared)
            by_uid.setdefault(prepared.plan.uid, []).append(future)
        try:
            listing = self._listing(plans[0].adapter, len(plans)) if batch[0][1] == "reattach" else None
            results = service.submit_many(plans, if_finished=batch[0][1], retry=self.retry, listing=listing)
        except BaseException as exc:
            if len(plans) > 1 and not (isinstance(exc, BridgeError) and exc.retryable):
                # one plan the backend refuses must not fail the others: each alone (those already sent are
                # found by uid, not sent again)
                for prepared in plans:
                    self._send_batch([(prepared, batch[0][1], f) for f in by_uid[prepared.plan.uid]])
                return
            for futures in by_uid.values():
                for future in futures:
                    future.set_exception(exc)
            return
        for prepared, result in zip(plans, results, strict=True):
            for future in by_uid[prepared.plan.uid]:
                future.set_result(result)

    def _listing(self, adapter: Any, size: int) -> service.Listing | None:
        """The listing a re-attach group of *size* is looked up in: the one kept for *adapter* while fresh, a
        new one for a group of several (a lookup of several reads as much), none for a lone re-attach."""
        now = self.clock()
        self._listings = {key: kept for key, kept in self._listings.items() if now - kept[0] < self.listing_life}
        kept = self._listings.get(id(adapter))
        if kept is not None and kept[1].adapter is adapter:
            return kept[1]
        if size < 2:
            return None
        listing = service.listing(adapter, self.retry)
        if listing is not None:
            self._listings[id(adapter)] = (now, listing)
        return listing
