"""A live status line for long waits: the job, its state and the time it has taken, redrawn on the terminal.

While the job's stage step downloads, the line says so too: ``staging <role> <uri> <bytes> <rate>``
(StagingMeter, from the phase file the stage step rewrites as it goes).

Only where both stdout and stderr are terminals: piped or redirected output stays exactly the job's lines.
The line lives on stderr; while it shows, every write to stdout or stderr (the job's lines, state changes)
first erases it, so it is never glued to a line, and the next redraw puts it back below them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from bridge.plan import LaunchPlan

#: back to the line's start, erase to its end (VT100; every terminal an HPC user has)
ERASE = "\r\033[K"


def elapsed_text(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h01m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole // 60 % 60:02d}m"


def on_terminal() -> bool:
    return _isatty(sys.stdout) and _isatty(sys.stderr)


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class StagingMeter:
    """``staging dataset hf://org/set 12.0 MiB 4.0 MiB/s`` while the stage step downloads, else None: *read*
    gives its phase document (bridge.staging.phase) at each call, and the rate is what came since the last
    call with a larger count, by *clock*."""

    def __init__(self, read: Callable[[], Mapping[str, Any] | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read = read
        self.clock = clock
        self._last: tuple[str, int, float] | None = None
        self._rate = 0.0

    def text(self) -> str | None:
        from bridge.staging.cache import size_text

        doc = self.read() or {}
        role, uri, written = doc.get("phase"), str(doc.get("uri", "")), doc.get("bytes")
        if role not in ("dataset", "model") or not isinstance(written, int):
            self._last, self._rate = None, 0.0
            return None
        now = self.clock()
        if self._last is None or self._last[0] != uri or written < self._last[1]:
            self._last, self._rate = (uri, written, now), 0.0
        elif written > self._last[1] and now > self._last[2]:
            self._rate = (written - self._last[1]) / (now - self._last[2])
            self._last = (uri, written, now)
        return f"staging {role} {uri} {size_text(written)} {size_text(self._rate)}/s"


class _Erasing:
    """A stream that erases the status line before anything is written through it."""

    def __init__(self, stream: TextIO, status: StatusLine) -> None:
        self._stream = stream
        self._status = status

    def write(self, text: str) -> int:
        with self._status.lock:
            self._status.erase()
            return self._stream.write(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


class StatusLine:
    """``with StatusLine("default/train") as line: line.update("Running"); …`` shows
    ``default/train Running 1m05s`` on the terminal, redrawn every *interval* seconds, until the block ends
    (with a *detail*: ``default/train Running 12s  staging dataset s3://b/d 12.0 MiB 4.0 MiB/s``).
    Off (nothing drawn, the streams untouched) unless *enabled*, by default when stdout and stderr are
    terminals."""

    def __init__(self, job: str, state: str = "Queued", enabled: bool | None = None, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 detail: Callable[[], str | None] | None = None) -> None:
        """*detail*: more to show after the elapsed time, asked at each redraw (a StagingMeter's text)."""
        self.job = job
        self.detail = detail
        self.state = state
        self.enabled = on_terminal() if enabled is None else enabled
        self.interval = interval
        self.clock = clock
        self.lock = threading.RLock()
        self._started = clock()
        self._shown = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._streams: tuple[TextIO, TextIO] | None = None

    def text(self) -> str:
        line = f"{self.job} {self.state} {elapsed_text(self.clock() - self._started)}"
        more = self.detail() if self.detail is not None else None
        return f"{line}  {more}" if more else line

    def update(self, state: str) -> None:
        with self.lock:
            self.state = state
        if self.enabled:
            self.draw()

    def draw(self) -> None:
        if self._streams is None:
            return
        with self.lock:
            err = self._streams[1]
            err.write(ERASE + self.text())
            err.flush()
            self._shown = True

    def erase(self) -> None:
        """Called under the lock by every write while the line is active."""
        if self._shown and self._streams is not None:
            self._streams[1].write(ERASE)
            self._streams[1].flush()
            self._shown = False

    def __enter__(self) -> StatusLine:
        if self.enabled:
            self._streams = (sys.stdout, sys.stderr)
            sys.stdout = _Erasing(sys.stdout, self)
            sys.stderr = _Erasing(sys.stderr, self)
            self._thread = threading.Thread(target=self._redraw, daemon=True)
            self._thread.start()
        return self

    def _redraw(self) -> None:
        while not self._done.wait(self.interval):
            self.draw()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._streams is not None:
            with self.lock:
                self.erase()
                self._streams[1].flush()
                sys.stdout, sys.stderr = self._streams
            self._streams = None


def job_status_line(plan: LaunchPlan, uid: str, state: str) -> StatusLine:
    """The status line of a submitted job, with its stage step's progress where this machine can read it."""
    from bridge.service.staging_cache import staging_phase

    read = staging_phase(plan, uid)
    return StatusLine(f"{plan.namespace}/{plan.name}", state,
                      detail=StagingMeter(read).text if read is not None else None)
