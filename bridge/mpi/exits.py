"""Signals and exit codes of the processes a launch starts, in one place.

A process a signal ended has no exit code of its own: Python reports it as ``-N`` (Popen.returncode,
os.waitstatus_to_exitcode), a shell and every scheduler as ``128 + N``. Whatever a launch passes upwards (its
own exit, a node group's code, srun's report) uses the shell's form, so a job that SIGTERM ended reads 143
everywhere. Only os and signal are imported: this sits on every node's start-up path.
"""

from __future__ import annotations

import signal

#: what stops a launch: forwarded to its children, and a launch that only waits ends on them
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: passed on to the children: the stop signals, and the ones jobs checkpoint on (cancel --signal USR1, migrate
#: --signal USR1@60), which would otherwise end the parent and orphan the training
FORWARDED = (*STOPPING, signal.SIGUSR1, signal.SIGUSR2)
#: what a container's PID 1 passes on to the process it started; SIGQUIT too, since PID 1 ignores any signal it
#: has no handler for
INIT_FORWARDED = (*FORWARDED, signal.SIGQUIT)

#: codes above this are a signal's
_SIGNAL_BASE = 128


def signal_code(signum: int) -> int:
    """The shell's exit code of a process that signal *signum* ended: 128 + N."""
    return _SIGNAL_BASE + signum


def shell_code(returncode: int) -> int:
    """A Python return code (``-N`` after signal N) as a shell reports it (128 + N); exit codes unchanged."""
    return signal_code(-returncode) if returncode < 0 else returncode


def ending_signal(code: int) -> int | None:
    """The signal that a shell-style exit *code* says ended the process (128 + N → N), else None."""
    return code - _SIGNAL_BASE if code > _SIGNAL_BASE else None
