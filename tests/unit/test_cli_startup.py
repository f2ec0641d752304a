"""What a command's start-up loads: only what the command uses (bench/cli_startup.py measures the time)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bridge.cli import build_parser


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
