"""Child processes without the subprocess module: os.posix_spawn and waitpid.

Every node of a job starts one child on its start-up path (rank 0 the launcher, the other ranks sshd), and
subprocess with what it imports (threading, selectors, ...) costs ~7 ms of CPU there, on each node, while
all of them start at once. This is the part of Popen the bootstrap needs: start (in a new session, or with
stdio on /dev/null), poll, wait with a timeout, signals. Linux (glibc posix_spawn with POSIX_SPAWN_SETSID).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence

from bridge.mpi.exits import INIT_FORWARDED, shell_code

# Python ignores these at start-up; Popen's restore_signals gives a child the defaults back, and so do we
_RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


def which(name: str, path: str | None = None) -> str | None:
    """*name* if it has a slash, else the first executable file of that name on *path* (default $PATH)."""
    if os.sep in name:
        return name
    for directory in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


class Process:
    """A started child; ``returncode`` is None while it runs, then its exit code, or -N after signal N (as Popen).

    Raises FileNotFoundError when argv[0] is found nowhere on the environment's PATH, PermissionError when it
    cannot be executed.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None, *, new_session: bool = False,
                 quiet: bool = False, outputs: tuple[int, int] | None = None) -> None:
        """*outputs*: descriptors that become the child's stdout and stderr (the write ends of pipes)."""
        env = os.environ if env is None else env
        program = which(argv[0], env.get("PATH", os.defpath))
        if program is None:
            raise FileNotFoundError(2, "command not found", argv[0])
        actions: list[tuple[int | str, ...]] = []
        if quiet:
            actions = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
        elif outputs is not None:
            actions = [(os.POSIX_SPAWN_DUP2, outputs[0], 1), (os.POSIX_SPAWN_DUP2, outputs[1], 2)]
        self.args = list(argv)
        self.returncode: int | None = None
        self.pid = os.posix_spawn(program, self.args, env, file_actions=actions, setsid=new_session,
                                  setsigdef=_RESTORED)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                self.returncode = 0
                return 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its return code, once it has exited; TimeoutError when it still runs after *timeout* seconds."""
        if self.returncode is not None:
            return self.returncode
        if timeout is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = 0
            return self.returncode
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.args[0]} still runs after {timeout:g}s")
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def end(self, grace: float = 5.0) -> int:
        """SIGTERM, then SIGKILL if it still runs after *grace* seconds; its return code."""
        self.terminate()
        try:
            return self.wait(grace)
        except TimeoutError:
            self.kill()
            return self.wait()


def become_init_if_pid1() -> None:
    """As a container's PID 1, fork: the child returns and does the work; this process stays PID 1 to reap
    every orphan the job leaves (sshd and mpirun's daemons reparent to PID 1, and would stay zombies) and to
    pass signals on, then exits as the child did (128+N for signal N). Elsewhere it returns at once."""
    if os.getpid() != 1:
        return
    child = os.fork()
    if child == 0:
        return
    for signum in INIT_FORWARDED:  # passed on to the launch, which handles them itself
        signal.signal(signum, lambda sig, _frame: _signal_quietly(child, sig))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(shell_code(code))


def _signal_quietly(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
