"""bridge.mpi.exits: one signal table and one exit-code convention for every process the MPI side starts."""

from __future__ import annotations

import signal
import subprocess
import sys

from bridge.mpi import exits
from bridge.mpi.group import LineRelay, wait_all
from bridge.mpi.spawn import Process


def test_signal_codes_read_as_a_shell_reads_them() -> None:
    assert exits.shell_code(-signal.SIGTERM) == 143 and exits.shell_code(-signal.SIGKILL) == 137
    assert exits.shell_code(0) == 0 and exits.shell_code(3) == 3
    assert exits.signal_code(signal.SIGINT) == 130
    assert exits.ending_signal(143) == signal.SIGTERM and exits.ending_signal(3) is None
    assert exits.ending_signal(128) is None  # exit 128 is a plain exit code: no signal 0 ends a process


def test_the_forwarded_signals_are_the_stop_signals_and_the_checkpoint_ones() -> None:
    assert exits.STOPPING == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    assert exits.FORWARDED == (*exits.STOPPING, signal.SIGUSR1, signal.SIGUSR2)
    assert exits.INIT_FORWARDED == (*exits.FORWARDED, signal.SIGQUIT)


class _Member:
    def __init__(self, proc) -> None:
        self.proc = proc
        self.code: int | None = None


def test_a_group_member_a_signal_ended_counts_as_128_plus_the_signal() -> None:
    members = [_Member(Process(["sh", "-c", "kill -KILL $$"], new_session=True)),
               _Member(Process(["sh", "-c", "exit 3"], new_session=True))]
    assert wait_all(members) == 137
    assert [member.code for member in members] == [137, 3]


def test_the_line_relay_puts_its_prefix_before_every_whole_line(capfd) -> None:
    relay = LineRelay(b"7: ")
    out, err = relay.pipe()
    proc = subprocess.Popen(["sh", "-c", "printf 'a\\nb'; echo c >&2"], stdout=out, stderr=err)
    relay.started()
    assert proc.wait() == 0
    relay.finish(timeout=None)
    captured = capfd.readouterr()
    assert captured.out == "7: a\n7: b\n" and captured.err == "7: c\n"


def test_a_task_that_exits_128_is_reported_as_an_exit_code(tmp_path) -> None:
    """128 is not 128 + a signal: srun's report says "Exited with exit code 128" (signal 0 raised ValueError)."""
    import os

    from bridge.mpi import step

    env = {**os.environ, step.TRANSPORT_ENV: "local", step.HOSTS_ENV: "localhost", step.STATE_ENV: str(tmp_path),
           step.PYTHON_ENV: sys.executable, "SLURM_NTASKS": "1"}
    env.pop(step.TASK_ENV, None)
    ran = subprocess.run([sys.executable, "-m", "bridge.mpi.step", "srun", "sh", "-c", "exit 128"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 128, ran.stderr
    assert ran.stderr.splitlines() == ["srun: error: localhost: task 0: Exited with exit code 128"]
