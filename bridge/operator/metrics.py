"""The operator's Prometheus metrics on ``/metrics`` (text exposition format 0.0.4), without a client library:
submissions, sync cycle durations, backend errors and TrainJobs by state, per BridgeCluster."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

#: sync cycle duration buckets, seconds (one batched poll of a cluster and the status writes it causes)
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _labels(pairs: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{key}="{escape(value)}"' for key, value in sorted(pairs.items())) + "}" if pairs else ""


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.submissions: dict[tuple[str, str], int] = defaultdict(int)
        self.backend_errors: dict[str, int] = defaultdict(int)
        self.journal_events: dict[str, int] = defaultdict(int)
        self.cycles: dict[str, list[int]] = {}
        self.cycle_sum: dict[str, float] = defaultdict(float)
        self.cycle_count: dict[str, int] = defaultdict(int)
        #: called at scrape time: {(cluster, state): count} of the TrainJobs the operator follows
        self.states: Callable[[], dict[tuple[str, str], int]] = dict

    def submission(self, cluster: str, result: str) -> None:
        with self.lock:
            self.submissions[(cluster, result)] += 1

    def backend_error(self, cluster: str) -> None:
        with self.lock:
            self.backend_errors[cluster] += 1

    def journal_event(self, cluster: str) -> None:
        with self.lock:
            self.journal_events[cluster] += 1

    def cycle(self, cluster: str, seconds: float) -> None:
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

    def serve(self, address: str) -> threading.Thread:
        """Serve ``/metrics`` on *address* (``host:port``) from a daemon thread."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # scrapes are not news
                pass

        host, _, port = address.rpartition(":")
        server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
        thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
        thread.start()
        return thread
