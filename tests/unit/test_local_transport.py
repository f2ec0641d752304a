"""LocalTransport: commands on this machine, with their status and output, a deadline, and nothing left behind."""

from __future__ import annotations

import os
import signal

import pytest

from bridge.adapters.transport import LocalTransport
from bridge.errors import BackendUnavailable


def test_status_output_and_input_come_back() -> None:
    result = LocalTransport({"GREETING": "hi"}).run(
        ["sh", "-c", 'cat; echo "$GREETING"; echo oops >&2; exit 3'], stdin="from stdin\n")
    assert (result.returncode, result.stdout, result.stderr) == (3, "from stdin\nhi\n", "oops\n")


def test_without_input_the_command_reads_nothing_rather_than_our_terminal() -> None:
    assert LocalTransport().run(["cat"], timeout=30).stdout == ""


def test_a_command_past_its_deadline_is_killed_and_reported_retryable(tmp_path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(BackendUnavailable, match="did not answer within 1.5s") as caught:
        LocalTransport().run(["sh", "-c", f'echo $$ > "{pid_file}"; exec sleep 60'], timeout=1.5)
    assert caught.value.retryable
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_missing_command_is_backend_trouble_not_a_traceback() -> None:
    with pytest.raises(BackendUnavailable, match="no-such-command-here: command not found"):
        LocalTransport().run(["no-such-command-here"])


def test_an_interrupted_run_leaves_no_command_behind(tmp_path) -> None:
    pid_file = tmp_path / "pid"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.5)
        with pytest.raises(KeyboardInterrupt):
            LocalTransport().run(["sh", "-c", f'echo $$ > "{pid_file}"; exec sleep 60'], timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
