"""bridge.cli.progress: the live status line of a long wait, on a terminal only, never glued to a line."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from bridge.cli.progress import ERASE, StatusLine, elapsed_text

ROOT = Path(__file__).resolve().parents[2]


def test_elapsed_reads_as_a_person_would_say_it() -> None:
    assert [elapsed_text(s) for s in (0, 42.9, 65, 3600 + 61)] == ["0s", "42s", "1m05s", "1h01m"]


def test_off_unless_on_a_terminal(capsys) -> None:
    with StatusLine("default/train") as line:  # pytest's captured streams are no terminal
        line.update("Running")
        print("a job line")
    assert capsys.readouterr() == ("a job line\n", "")


def test_every_write_erases_the_line_first_and_the_end_erases_it(capsys) -> None:
    now = [100.0]
    with StatusLine("default/train", enabled=True, interval=60, clock=lambda: now[0]) as line:
        now[0] += 65
        line.update("Running")
        print("a job line")
        print("a warning", file=sys.stderr)
    out, err = capsys.readouterr()
    assert out == "a job line\n"
    assert err == f"{ERASE}default/train Running 1m05s{ERASE}a warning\n"  # shown, erased before the lines


def _run_on_a_pty(code: str) -> bytes:
    """*code* with stdout and stderr on a pseudo-terminal, as a user's shell runs it."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=child, stderr=child, cwd=ROOT)
    os.close(child)
    output = b""
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        output += data
    proc.wait(timeout=30)
    os.close(main)
    return output


def test_a_terminal_sees_the_line_and_the_output_around_it() -> None:
    shown = _run_on_a_pty("import time\nfrom bridge.cli.progress import StatusLine\n"
                          "with StatusLine('default/train', interval=0.05) as line:\n"
                          "    line.update('Running'); time.sleep(0.2); print('job line', flush=True)\n"
                          "    time.sleep(0.2)\n"
                          "print('after')\n")
    assert b"default/train Running 0s" in shown
    assert b"\x1b[Kjob line\r\n" in shown  # erased first: not glued to the status line
    assert shown.endswith(b"\x1b[Kafter\r\n")  # the line is gone when the wait ends
