"""Phase timings of ``hpcbridge launch`` (HPCBRIDGE_TRACE=1): when each node reached each step."""

from __future__ import annotations

import os
import sys
import time


def _process_age() -> float:
    """Seconds since this process started (interpreter start-up and imports included), else 0."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            started = int(stat.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


_T0 = time.monotonic() - _process_age() if os.environ.get("HPCBRIDGE_TRACE") else time.monotonic()


def trace(message: str) -> None:
    """Phase timings on stderr when HPCBRIDGE_TRACE is set (why is my launch slow?): the wall clock, to line up
    the nodes' traces, the time since this process started and the CPU time it used so far."""
    if os.environ.get("HPCBRIDGE_TRACE"):
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        print(f"[hpcbridge launch {os.uname().nodename} {stamp} +{time.monotonic() - _T0:.3f}s "
              f"cpu {time.process_time():.3f}s] {message}", file=sys.stderr, flush=True)
