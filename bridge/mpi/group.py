"""Several processes that end as one: an srun step's tasks, a node's XGBoost workers.

Each child runs in its own session; the stop and checkpoint signals this process gets go to every child, and
with ``kill_on_bad_exit`` the first child that fails ends the others (srun -K; a dead XGBoost worker must not
leave its peers waiting on the tracker forever).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from bridge.mpi.exits import FORWARDED, shell_code

if TYPE_CHECKING:
    import threading


class _Process(Protocol):
    """A spawn.Process or a subprocess.Popen: its pid, and its return code, set here once it is reaped."""

    @property
    def pid(self) -> int: ...

    returncode: int | None


class Member(Protocol):
    """A started child: ``proc.pid``; ``code`` is set to its shell-style exit code once it ended."""

    @property
    def proc(self) -> _Process: ...

    code: int | None


def signal_group(member: Member, signum: int) -> None:
    try:
        os.killpg(member.proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def wait_all(members: Sequence[Member], kill_on_bad_exit: bool = False, grace: float = 10.0) -> int:
    """Wait for every member; the highest exit code (a signal N as 128+N), or with *kill_on_bad_exit* the code
    of the first that failed (the others get SIGTERM, and SIGKILL *grace* seconds later)."""
    import time

    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for member in members:
            signal_group(member, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    codes: list[int] = []
    first_failure = None
    kill_at = None
    try:
        pending = list(members)
        while pending:
            if kill_at is not None:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    if time.monotonic() >= kill_at:
                        for member in pending:
                            signal_group(member, signal.SIGKILL)
                        kill_at = float("inf")
                    time.sleep(0.05)
                    continue
            else:
                try:
                    pid, status = os.wait()
                except ChildProcessError:  # reaped elsewhere: its code is lost
                    for member in pending:
                        member.code = 1
                    codes.append(1)
                    break
            done = next((member for member in pending if member.proc.pid == pid), None)
            if done is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            done.proc.returncode = code
            code = done.code = shell_code(code)
            codes.append(code)
            pending.remove(done)
            if code and kill_on_bad_exit and first_failure is None:
                first_failure = code  # the group ends with the member that failed, not the ones it ended
                for member in pending:
                    signal_group(member, signal.SIGTERM)
                kill_at = time.monotonic() + grace
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return first_failure if first_failure is not None else max(codes, default=0)


class LineRelay:
    """Copies what several children write to this process's stdout and stderr, each line whole (several
    workers writing to one pipe would otherwise cut into each other's lines), in a thread.

    ``pipe()`` gives a (stdout, stderr) pair of write ends for one child, to pass to spawn.Process(outputs=…)
    and close here once it started (``started()``). Every line goes out after *prefix* (srun -l's label)."""

    def __init__(self, prefix: bytes = b"") -> None:
        import selectors

        self._prefix = prefix
        self._selector = selectors.DefaultSelector()
        self._partial: dict[int, bytes] = {}
        self._writers: list[int] = []
        self._thread: threading.Thread | None = None

    def pipe(self) -> tuple[int, int]:
        import sys

        ends = []
        for target in (sys.stdout, sys.stderr):
            read, write = os.pipe()
            self._selector.register(read, 1, target.fileno())
            self._partial[read] = b""
            self._writers.append(write)
            ends.append(write)
        return ends[0], ends[1]

    def started(self) -> None:
        """The children hold the write ends now; ours go, so the pipes end when the children do."""
        import threading

        for write in self._writers:
            os.close(write)
        self._writers = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._selector.get_map():
            for key, _ in self._selector.select():
                read, target = key.fd, key.data
                data = os.read(read, 65536)
                if not data:
                    self._selector.unregister(read)
                    os.close(read)
                    if self._partial[read]:
                        _write_all(target, self._prefix + self._partial[read] + b"\n")
                    continue
                *lines, self._partial[read] = (self._partial[read] + data).split(b"\n")
                if lines:
                    _write_all(target, b"".join(self._prefix + line + b"\n" for line in lines))

    def finish(self, timeout: float | None = 5.0) -> None:
        """Wait until every line is out (a child's own children may hold a pipe open: not beyond *timeout*;
        None waits for them)."""
        for write in self._writers:
            os.close(write)
        self._writers = []
        if self._thread is not None:
            self._thread.join(timeout)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:
            return  # our own output is gone: nothing to tell
