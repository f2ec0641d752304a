"""Several processes that end as one: an srun step's tasks, a node's XGBoost workers.

Each child runs in its own session; the stop and checkpoint signals this process gets go to every child, and
with ``kill_on_bad_exit`` the first child that fails ends the others (srun -K; a dead XGBoost worker must not
leave its peers waiting on the tracker forever).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from bridge.mpi.exits import FORWARDED, shell_code

if TYPE_CHECKING:
    import threading


class _Process(Protocol):
    """A spawn.Process or a subprocess.Popen: its pid, and its return code, set here once it is reaped."""

    @property
    def pid(self) -> int: ...

    returncode: int | None


class Splitter(Protocol):
    """Cuts one stream into whole lines: ``feed`` gives what a read completes, ``close`` the rest at its end."""

    def feed(self, data: bytes) -> bytes: ...

    def close(self) -> bytes: ...


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


class Lines:
    """One stream cut into whole lines, each after *prefix*; a last line without its newline is given one at
    the end, so it is never glued to whatever is written next."""

    def __init__(self, prefix: bytes = b"") -> None:
        self._prefix = prefix
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """The lines *data* completes, labelled; the rest waits for its newline."""
        *lines, self._partial = (self._partial + data).split(b"\n")
        return b"".join(self._prefix + line + b"\n" for line in lines)

    def close(self) -> bytes:
        rest, self._partial = self._partial, b""
        return self._prefix + rest + b"\n" if rest else b""


#: how an MPI launcher tags the chunks it relays from its ranks (Open MPI's --tag-output:
#: ``[jobid,rank]<stdout>:``; Hydra's -prepend-rank: ``[rank] ``); group 1 is the rank
OPENMPI_TAG = rb"\[\d+,(\d+)\]<std(?:out|err|diag)>:"
HYDRA_TAG = rb"\[(\d+)\] "
#: the longest a tag's first part may be while its end is still to come in the next read
_LONGEST_TAG = 40


class RankLines:
    """A launcher's tagged stream cut into each rank's whole lines, each after ``label(rank)``.

    The launchers tag every chunk a rank writes, not every line, so two ranks' halves of lines come out
    interleaved (``[1,0]<stdout>:rank 0 A [1,1]<stdout>:rank 1 A [1,0]<stdout>:B``); here each rank's text is
    kept apart until its newline. Text after a newline with no tag is the launcher's own (its error messages):
    it goes out under *own*. A tag right after another is the rank's text, not a second tag (a rank printing
    ``[1] …`` under Hydra); a tag-shaped text in the middle of a rank's line cannot be told from one."""

    def __init__(self, tag: bytes, label: Callable[[int], bytes], own: bytes = b"") -> None:
        """*own*: the label of the launcher's own lines (none by default)."""
        import re

        self._tag = re.compile(tag)
        self._label = label
        self._own = own
        self._pending = b""
        self._rank: int | None = None
        self._partial: dict[int | None, bytes] = {}

    def feed(self, data: bytes) -> bytes:
        buffer, self._pending = self._pending + data, b""
        out: list[bytes] = []
        position = 0
        after_tag = -1
        while True:
            match = self._tag.search(buffer, position)
            while match is not None and match.start() == after_tag:  # text of the rank, not a tag
                match = self._tag.search(buffer, match.start() + 1)
            if match is None:
                tail = self._held_back(buffer, position)
                out.append(self._text(buffer[position:len(buffer) - len(tail)]))
                self._pending = tail
                return b"".join(out)
            out.append(self._text(buffer[position:match.start()]))
            self._rank = int(match.group(1))
            position = after_tag = match.end()

    def close(self) -> bytes:
        out = [self._text(self._pending)]
        self._pending = b""
        for rank, rest in self._partial.items():
            if rest:
                out.append(self._line(rank, rest))
        self._partial.clear()
        return b"".join(out)

    @staticmethod
    def _held_back(buffer: bytes, position: int) -> bytes:
        """The end of *buffer* that may be the first part of a tag the next read completes."""
        start = buffer.rfind(b"[", position)
        if start < 0 or len(buffer) - start > _LONGEST_TAG or b"\n" in buffer[start:]:
            return b""
        return buffer[start:]

    def _text(self, text: bytes) -> bytes:
        out = []
        while text:
            line, newline, text = text.partition(b"\n")
            partial = self._partial.pop(self._rank, b"") + line
            if not newline:
                self._partial[self._rank] = partial
                break
            out.append(self._line(self._rank, partial))
            self._rank = None
        return b"".join(out)

    def _line(self, rank: int | None, text: bytes) -> bytes:
        return (self._own if rank is None else self._label(rank)) + text + b"\n"


class LineRelay:
    """Copies what several children write to this process's stdout and stderr, each line whole (several
    workers writing to one pipe would otherwise cut into each other's lines), in a thread.

    ``pipe()`` gives a (stdout, stderr) pair of write ends for one child, to pass to spawn.Process(outputs=…)
    and close here once it started (``started()``). Every line goes out after *prefix* (srun -l's label), or
    the pipe's own; ``pipe(split=…)`` cuts each stream with a splitter of the caller's (``RankLines``)."""

    def __init__(self, prefix: bytes = b"") -> None:
        import selectors

        self._prefix = prefix
        self._selector = selectors.DefaultSelector()
        self._writers: list[int] = []
        self._thread: threading.Thread | None = None

    def pipe(self, prefix: bytes | None = None,
             split: Callable[[], Splitter] | None = None) -> tuple[int, int]:
        import sys

        ends = []
        for target in (sys.stdout, sys.stderr):
            read, write = os.pipe()
            splitter = split() if split is not None else Lines(self._prefix if prefix is None else prefix)
            self._selector.register(read, 1, (target.fileno(), splitter))
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
                read, (target, splitter) = key.fd, key.data
                data = os.read(read, 65536)
                if not data:
                    self._selector.unregister(read)
                    os.close(read)
                    _write_all(target, splitter.close())
                    continue
                _write_all(target, splitter.feed(data))

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
