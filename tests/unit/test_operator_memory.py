"""The operator's heap handed back after a burst (bridge.operator.memory), measured as the kernel counts it."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

BURST = """
import sys, time
from bridge.operator import memory
def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))

# a burst as a mass apply makes: many small bodies, then all but a few freed (each kept one pins its page)
chunks = [bytes(1000) + str(i).encode() for i in range(300_000)]
kept = chunks[::100]
del chunks
peak = rss_mb()
if sys.argv[1] == "keep":
    memory.keep_heap_small(every=0.05)
deadline = time.monotonic() + 30
while rss_mb() > peak // 2 and time.monotonic() < deadline and sys.argv[1] == "keep":
    time.sleep(0.05)
print(peak, rss_mb(), len(kept))
"""


def _burst(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", BURST, mode], capture_output=True, text=True, check=True).stdout
    peak, after, _ = (int(value) for value in out.split())
    return peak, after


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="handed back on glibc only")
def test_the_heap_left_by_a_burst_is_handed_back() -> None:
    peak, after = _burst("leave")
    assert peak > 250 and after > peak * 0.9  # without it the freed pages stay the process's
    peak, after = _burst("keep")
    assert peak > 250 and after < peak // 2


LARGE = """
import sys
from bridge.operator import memory
def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))

if sys.argv[1] == "keep":
    memory.keep_heap_small(every=3600)  # no trim in this test's time: what is handed back is handed back on free
big = bytearray(16 << 20)  # freed, it raises glibc's own threshold for mapping a block apart to 16 MiB
del big
# large transient buffers (a listing's output, a JSON body), every 30th still held when the burst ends
blocks = [bytearray(1 << 20) for _ in range(300)]
kept = blocks[::30]
del blocks
print(rss_mb(), len(kept))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="handed back on glibc only")
def test_large_transient_buffers_are_handed_back_when_freed() -> None:
    def after(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", LARGE, mode], capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])

    assert after("leave") > 250  # in the heap between the kept ones: the process's until a trim
    assert after("keep") < 100  # each mapped apart, and unmapped as it is freed
