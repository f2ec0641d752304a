"""The operator's Prometheus metrics on ``/metrics`` (text exposition format 0.0.4), without a client library:
submissions, sync cycle durations, backend errors and TrainJobs by state, per BridgeCluster.

Every label value comes from a bounded set: a ``cluster`` label is a BridgeCluster's name (which the cluster
admin writes), ``none``, or ``other`` for any name a tenant wrote that names no BridgeCluster; otherwise each
distinct name in a TrainJob's annotations would make series of its own, without bound.

Served beyond loopback, ``/metrics`` asks for a bearer token (read from a file, compared in constant time).
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

log = logging.getLogger("hpcbridge.operator")

#: sync cycle duration buckets, seconds (one batched poll of a cluster and the status writes it causes)
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _labels(pairs: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{key}="{escape(value)}"' for key, value in sorted(pairs.items())) + "}" if pairs else ""


#: the cluster label of a TrainJob that names no cluster, and of one that names a cluster that is not configured
NO_CLUSTER, OTHER_CLUSTER = "none", "other"
#: submission results that name the cluster a job went to (a configured one, resolved by the operator)
_RESOLVED = frozenset({"submitted", "attached"})


class Metrics:
    def __init__(self, clusters: Callable[[], Iterable[str]] | None = None) -> None:
        """*clusters*: the configured BridgeClusters' names, asked when a name is not known yet (the operator's
        ``KubeApi.clusters``, cached there). Names a sync loop or a submission reports are learned as well."""
        self.clusters = clusters
        self.known: set[str] = set()
        self.lock = threading.Lock()
        self.submissions: dict[tuple[str, str], int] = defaultdict(int)
        self.backend_errors: dict[str, int] = defaultdict(int)
        self.journal_events: dict[str, int] = defaultdict(int)
        self.cycles: dict[str, list[int]] = {}
        self.cycle_sum: dict[str, float] = defaultdict(float)
        self.cycle_count: dict[str, int] = defaultdict(int)
        #: called at scrape time: {(cluster, state): count} of the TrainJobs the operator follows
        self.states: Callable[[], dict[tuple[str, str], int]] = dict

    def label(self, cluster: str) -> str:
        """*cluster* as a label value: a configured BridgeCluster's name, else ``none`` or ``other``."""
        if cluster in self.known or cluster == NO_CLUSTER:
            return cluster
        if self.clusters is not None:
            try:
                configured = set(self.clusters())
            except Exception as exc:  # noqa: BLE001 - an unreadable list must not fail what is being counted
                log.debug("metrics: cluster names unavailable: %s", exc)
                configured = set()
            if cluster in configured:
                with self.lock:
                    self.known.add(cluster)
                return cluster
        return OTHER_CLUSTER

    def _learn(self, cluster: str) -> str:
        """A name only the operator's own resolution produces (a sync loop's cluster, a job's target)."""
        with self.lock:
            self.known.add(cluster)
        return cluster

    def submission(self, cluster: str, result: str) -> None:
        cluster = self._learn(cluster) if result in _RESOLVED else self.label(cluster)
        with self.lock:
            self.submissions[(cluster, result)] += 1

    def backend_error(self, cluster: str) -> None:
        cluster = self.label(cluster)
        with self.lock:
            self.backend_errors[cluster] += 1

    def journal_event(self, cluster: str) -> None:
        cluster = self._learn(cluster)
        with self.lock:
            self.journal_events[cluster] += 1

    def cycle(self, cluster: str, seconds: float) -> None:
        cluster = self._learn(cluster)
        with self.lock:
            counts = self.cycles.setdefault(cluster, [0] * len(BUCKETS))
            for index, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    counts[index] += 1
            self.cycle_sum[cluster] += seconds
            self.cycle_count[cluster] += 1

    def render(self) -> str:
        lines = ["# HELP hpcbridge_submissions_total TrainJobs handed to a backend, by outcome "
                 "(submitted, attached to an existing job, refused, unavailable).",
                 "# TYPE hpcbridge_submissions_total counter"]
        with self.lock:
            for (cluster, result), value in sorted(self.submissions.items()):
                lines.append(f"hpcbridge_submissions_total{_labels({'cluster': cluster, 'result': result})} {value}")
            lines += ["# HELP hpcbridge_backend_errors_total Backend calls that failed (unreachable, refused).",
                      "# TYPE hpcbridge_backend_errors_total counter"]
            for cluster, value in sorted(self.backend_errors.items()):
                lines.append(f"hpcbridge_backend_errors_total{_labels({'cluster': cluster})} {value}")
            lines += ["# HELP hpcbridge_journal_events_total Job events a backend's journal pushed (Flux), each "
                      "waking its cluster's sync loop.", "# TYPE hpcbridge_journal_events_total counter"]
            for cluster, value in sorted(self.journal_events.items()):
                lines.append(f"hpcbridge_journal_events_total{_labels({'cluster': cluster})} {value}")
            lines += ["# HELP hpcbridge_sync_cycle_seconds One sync cycle of a cluster: its batched poll and the "
                      "status writes it causes.", "# TYPE hpcbridge_sync_cycle_seconds histogram"]
            for cluster, counts in sorted(self.cycles.items()):
                for bound, value in zip(BUCKETS, counts, strict=True):
                    lines.append(f"hpcbridge_sync_cycle_seconds_bucket"
                                 f"{_labels({'cluster': cluster, 'le': repr(bound)})} {value}")
                lines.append(f"hpcbridge_sync_cycle_seconds_bucket{_labels({'cluster': cluster, 'le': '+Inf'})} "
                             f"{self.cycle_count[cluster]}")
                lines.append(f"hpcbridge_sync_cycle_seconds_sum{_labels({'cluster': cluster})} "
                             f"{self.cycle_sum[cluster]:.6f}")
                lines.append(f"hpcbridge_sync_cycle_seconds_count{_labels({'cluster': cluster})} "
                             f"{self.cycle_count[cluster]}")
        lines += ["# HELP hpcbridge_trainjobs TrainJobs this operator follows, by their backend job's state.",
                  "# TYPE hpcbridge_trainjobs gauge"]
        for (cluster, state), value in sorted(self.states().items()):
            lines.append(f"hpcbridge_trainjobs{_labels({'cluster': cluster, 'state': state})} {value}")
        return "\n".join(lines) + "\n"

    def serve(self, host: str, port: int, token_file: str | None = None) -> ThreadingHTTPServer:
        """Serve ``/metrics`` on *host*:*port* from a daemon thread; with *token_file*, only to requests that
        carry ``Authorization: Bearer <the file's content>`` (read on every scrape, so a rotated Secret takes
        effect without a restart). Returns the server (``server_address``, ``shutdown()``)."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                if token_file is not None and not _authorized(self.headers.get("Authorization"), token_file):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Bearer realm="hpcbridge-metrics"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # scrapes are not news
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


def read_token(path: str) -> bytes:
    """The bearer token in *path* (surrounding whitespace dropped); OSError if unreadable, ValueError if empty."""
    with open(path, "rb") as handle:
        token = handle.read().strip()
    if not token:
        raise ValueError("is empty")
    return token


def _authorized(header: str | None, token_file: str) -> bool:
    """Whether *header* is ``Bearer <token>`` for the token now in *token_file*; fails closed when the file
    cannot be read. The comparison takes the same time wherever the first difference is."""
    try:
        token = read_token(token_file)
    except (OSError, ValueError) as exc:
        log.warning("metrics: bearer token file %s: %s; refusing scrapes", token_file,
                    exc.strerror if isinstance(exc, OSError) else exc)
        return False
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)
