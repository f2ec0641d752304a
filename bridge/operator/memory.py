"""The operator's heap given back to the system after bursts.

A mass apply or a restart with thousands of TrainJobs parses, plans and writes them all within minutes, on many
threads at once; afterwards the live objects are a fraction of what was allocated, but glibc's allocator keeps the
freed pages (one arena per busy thread, each holding on to its own) and the process's RSS stays at its peak. Two
settings of the C library undo that where it is glibc: few arenas (Python threads take turns on the GIL, so more
arenas buy no parallelism, only fragmentation), large blocks (a listing's output, a JSON body) mapped apart at
a fixed size and so unmapped as they are freed (glibc raises that size to the largest block freed, up to 32 MiB,
and from then on puts such buffers in the heap, where one block still held keeps the freed ones around it), and
free pages handed back (``malloc_trim``) at a steady pace. Elsewhere (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from typing import Any

#: glibc's mallopt parameters (malloc.h): the most arenas; the size from which a block is mapped on its own
M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3


def _glibc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
        return None
    return libc


def keep_heap_small(arenas: int = 2, every: float = 30.0, mapped_from: int = 256 * 1024) -> threading.Thread | None:
    """At most *arenas* malloc arenas from now on (call it before the threads start), blocks of *mapped_from*
    bytes and more mapped apart, and the heap's free pages handed back every *every* seconds by a daemon
    thread, which is returned; None where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return None
    libc.mallopt(M_ARENA_MAX, arenas)
    libc.mallopt(M_MMAP_THRESHOLD, mapped_from)
    libc.malloc_trim.argtypes = [ctypes.c_size_t]

    def trim() -> None:
        while True:
            time.sleep(every)
            libc.malloc_trim(0)

    thread = threading.Thread(target=trim, name="heap-trim", daemon=True)
    thread.start()
    return thread
