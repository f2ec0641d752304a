"""How ``hpcbridge`` reads its arguments: one-line errors with a did-you-mean, and the split between its own
options and sbatch's on the commands that take both.

The rule for short options: hpcbridge's own mean the same on every subcommand (``-c`` is ``--cluster``, ``-o``
is ``--output``, ``-f`` is ``--follow``). ``submit`` and ``convert`` also take sbatch's options after the file;
those whose letter or name hpcbridge uses itself (``-c``/``--cpus-per-task``'s letter, ``-o``/``--output``,
``--cluster``, ``--wait``) go after ``--``: ``hpcbridge submit job.sbatch -c hpc -- -c 4 -o out.log``.
Everything after ``--`` is sbatch's.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from bridge.errors import InvalidSpec, closest

#: the subcommands that take sbatch's options after the file
SBATCH_COMMANDS = ("submit", "convert")
#: sbatch's own options whose names hpcbridge uses too: given before ``--`` they are hpcbridge's
AFTER_SEPARATOR = "sbatch's -c/--cpus-per-task, -o/--output, --cluster and --wait go after --"


def did_you_mean(word: str, known: Sequence[str]) -> str:
    """`` (did you mean --wait?)`` for the one of *known* closest to *word* (``bridge.errors.closest``, which
    loads difflib only when an error needs it); empty when none is close."""
    close = closest(word, known)
    return f" (did you mean {close}?)" if close else ""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2, like every other input error, with the options
    it declares kept for suggestions and shell completion."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.declared: list[argparse.Action] = []  # before argparse's own __init__ declares --help
        self.commands: dict[str, Parser] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.declared.append(action)
        return action

    def option_strings(self) -> list[str]:
        return [option for action in self.declared if action.help != argparse.SUPPRESS
                for option in action.option_strings]

    def error(self, message: str) -> NoReturn:
        raise InvalidSpec("", " ".join(sys.argv[1:])[:60], f"{self.prog}: {self._with_suggestion(message)}")

    def _with_suggestion(self, message: str) -> str:
        """argparse's "invalid choice" (a subcommand, a --to) with a did-you-mean; an unknown subcommand in
        one short line."""
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if not match:
            return message
        choices = [choice.strip(" '") for choice in match.group(2).split(",")]
        hint = did_you_mean(match.group(1), choices)
        if self.commands and message.startswith("argument command_name:"):
            return f"unknown command {match.group(1)!r}{hint or ' (`hpcbridge --help` lists them)'}"
        return message + hint


def split_at_separator(argv: list[str]) -> tuple[list[str], list[str]]:
    """For ``submit`` and ``convert``: the arguments before ``--`` and sbatch's, after it."""
    if argv[:1] and argv[0] in SBATCH_COMMANDS and "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


def check_leftovers(parser: Parser, args: argparse.Namespace, extra: list[str]) -> None:
    """Arguments argparse did not take: sbatch's on ``submit``/``convert``, else an error. A long option
    neither hpcbridge's nor sbatch's is an unknown option with the nearest of both (``--wiat``: ``--wait``)."""
    if not extra:
        return
    command = parser.commands.get(getattr(args, "command_name", "") or "")
    parser = command or parser  # its errors name the subcommand
    own = command.option_strings() if command else []
    sbatch_options = []
    if getattr(args, "sbatch_flags_allowed", False):
        from bridge.sbatch.options import OPTIONS  # sbatch's table, only for the commands that take its flags

        sbatch_options = [f"--{name}" for name in OPTIONS]
    for arg in extra:
        name = arg.partition("=")[0]
        if not name.startswith("--") or name == "--":
            continue
        if sbatch_options and any(option.startswith(name) for option in sbatch_options):
            continue  # sbatch's, by its full name or an abbreviation getopt_long takes
        parser.error(f"unknown option {name}{did_you_mean(name, own + sbatch_options)}")
    if extra and not sbatch_options:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")


def output_format(choices: Sequence[str], *, sbatch: bool = False) -> Any:
    """The type of ``-o/--output``: one of *choices*; with *sbatch* (``submit``) the hint says where sbatch's
    own ``-o FILE`` goes."""

    def checked(text: str) -> str:
        if text in choices:
            return text
        hint = did_you_mean(text, choices) or (f"; {AFTER_SEPARATOR}" if sbatch else "")
        raise argparse.ArgumentTypeError(f"not an output format: {text!r} (use {', '.join(choices)}){hint}")

    return checked


def cluster_name(text: str) -> str:
    """The type of ``-c/--cluster`` on ``submit``: a number is sbatch's ``-c`` (CPUs per task) mistaken."""
    if text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a cluster name; {AFTER_SEPARATOR} "
                                         f"(hpcbridge submit FILE -- -c {text})")
    return text


def duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 12h, 7d)")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
