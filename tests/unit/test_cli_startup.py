"""What a command's start-up loads: only what the command uses (bench/cli_startup.py measures the time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"


def modules_loaded(argv: list[str]) -> set[str]:
    """The modules a fresh interpreter has loaded after ``hpcbridge *argv``."""
    # launch ends with os._exit, which skips a finally: here it raises SystemExit instead
    code = ("import os, sys\ndef leave(code): raise SystemExit(code)\nos._exit = leave\n"
            "from bridge.cli import main\ntry:\n    main(" + repr(argv) + ")\nfinally:\n"
            "    sys.stdout.flush(); sys.stderr.write('\\n'.join(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return set(result.stderr.split("\n"))


def test_launch_loads_neither_pydantic_nor_yaml_nor_sbatchs_option_table() -> None:
    # every node of an allocation starts `hpcbridge launch` at once: it reads no TrainJob and no sbatch flag
    loaded = modules_loaded(
        ["launch", "--launcher", "plain", "--discovery", "local", "--", sys.executable, "-c", "pass"])
    assert "bridge.mpi.bootstrap" in loaded  # it did launch
    assert not {"pydantic", "yaml", "bridge.api", "bridge.sbatch.options"} & loaded


@pytest.mark.parametrize("argv", [
    ["render", "job.yaml", "--to", "slurm", "-o", "json"],
    ["submit", "job.sbatch", "-c", "hpc", "--dry-run", "-N", "2"],
    ["status", "1", "2", "-o", "wide"],
    ["launch", "--launcher", "openmpi", "--procs-per-node", "4", "--", "./a.out"],
    ["convert", "job.sbatch", "--to", "trainjob"],
])
def test_the_parser_of_one_command_reads_its_arguments_as_the_whole_parser_does(argv: list[str]) -> None:
    whole, only = build_parser().parse_known_args(argv), build_parser(argv[0]).parse_known_args(argv)
    assert vars(whole[0]) | {"func": None} == vars(only[0]) | {"func": None} and whole[1] == only[1]
    assert whole[0].func is only[0].func


def test_a_word_that_is_no_command_gets_the_whole_parser() -> None:
    assert set(build_parser("rendr").commands) == set(build_parser().commands)
    assert "render" in build_parser("rendr").commands
    assert list(build_parser("render").commands) == ["render"]


def test_completion_is_written_from_every_command() -> None:
    parser = build_parser("completion")
    assert set(parser.commands) == set(build_parser().commands)


def run_as_entry_point(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``hpcbridge *argv`` as the console script runs it, with an exit handler that says whether it ran."""
    code = ("import atexit, sys\natexit.register(lambda: sys.stderr.write('teardown ran\\n'))\n"
            "sys.argv = ['hpcbridge', *" + repr(argv) + "]\nfrom bridge.cli import main\nsys.exit(main())")
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


@pytest.mark.parametrize("argv", [
    ["render", str(EXAMPLE), "--to", "slurm", "-o", "yaml"],
    ["convert", str(EXAMPLE), "--to", "jobset"],
    ["validate", str(EXAMPLE)],
])
def test_a_command_that_only_prints_ends_without_the_teardown_and_prints_all(argv: list[str]) -> None:
    ended = run_as_entry_point(argv)
    assert ended.returncode == 0 and ended.stderr == "", ended.stderr
    in_process = subprocess.run([sys.executable, "-c", f"import sys; from bridge.cli import main; "
                                 f"sys.exit(main({argv!r}))"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert ended.stdout == in_process.stdout and ended.stdout


def test_an_error_keeps_its_exit_code_and_line_and_other_commands_keep_the_teardown() -> None:
    bad = run_as_entry_point(["render", "/no/such/file.yaml"])
    assert bad.returncode == 2 and "no such file" in bad.stderr and "teardown ran" not in bad.stderr
    other = run_as_entry_point(["clusters"])
    assert other.returncode == 0 and other.stderr == "teardown ran\n"


@pytest.mark.parametrize("reader", ["true", "head -c 10"])
def test_a_reader_that_goes_away_ends_it_quietly(reader: str) -> None:
    # `true` is gone before the render's few lines are flushed at the end; `head` leaves in the middle of
    # far more than a pipe holds
    many = " ".join([str(EXAMPLE)] * (300 if reader.startswith("head") else 1))
    shell = f"{sys.executable} -m bridge validate {many} -o yaml | {reader}"
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout as a user's: buffered
    piped = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=ROOT, env=buffered,
                           timeout=120)
    assert piped.stderr == "" and len(piped.stdout) == (10 if reader.startswith("head") else 0)
