"""A live status line for long waits: the job, its state and the time it has taken, redrawn on the terminal.

Only where both stdout and stderr are terminals: piped or redirected output stays exactly the job's lines.
The line lives on stderr; while it shows, every write to stdout or stderr (the job's lines, state changes)
first erases it, so it is never glued to a line, and the next redraw puts it back below them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

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
    ``default/train Running 1m05s`` on the terminal, redrawn every *interval* seconds, until the block ends.
    Off (nothing drawn, the streams untouched) unless *enabled*, by default when stdout and stderr are
    terminals."""

    def __init__(self, job: str, state: str = "Queued", enabled: bool | None = None, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
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
        return f"{self.job} {self.state} {elapsed_text(self.clock() - self._started)}"

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
