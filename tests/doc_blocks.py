"""The shell blocks of README.md and docs/: found, classified and checked as the reader would run them.

A fenced block in ``console``, ``sh``, ``bash`` or ``shell`` is a shell block. ``console`` blocks hold commands
(``$ `` lines, continued by a trailing ``\\``) each followed by the output it prints; ``sh``/``bash``/``shell``
blocks hold commands only. Every block runs from the repository root (a ``cd`` in a block moves the rest of it),
with this checkout's ``hpcbridge`` first on PATH and no clusters configured but the built-in ``local`` one.

An HTML comment right before a block says what it needs beyond that: ``<!-- needs: slurm -->`` (a Slurm
cluster configured as ``hpc``; also ``flux``, ``kubernetes``, ``clusters`` for the clusters of
examples/clusters.yaml, ``root``, ``pypi`` for an install from PyPI into the reader's home, ``setup`` for a
fresh machine's setup (root; run from a fresh clone in a home of its own), or a Python module a job imports
such as ``torch``); beside ``kubernetes``,
``helm`` (the block installs with Helm, not kubectl) and ``trainer`` (Kubeflow Trainer's CRDs are there). A ``slurm`` block runs
against the suite's Slurm cluster (tests/integration/test_docs_commands.py), ``1234`` in it standing for the id
the block's last ``submit`` printed; a ``kubernetes`` block runs with kubectl against a control plane of that
test's own, in document order, one install path (kubectl or Helm, with or without Trainer) on a control plane
of its own, unless it needs more than that (its list says what); every block needing a
daemon is also checked without it: bash parses it
and every ``hpcbridge`` command in it goes through the CLI's parser. A block needing only Python modules runs
when they import.

A shown output line is found in some line the command printed (stdout or stderr), ``…`` standing for any text;
a command exits 0 unless its line ends with ``# exits N``.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL_LANGUAGES = ("console", "sh", "bash", "shell")
DAEMONS = ("slurm", "flux", "kubernetes", "clusters", "root", "pypi", "setup")
#: what a ``kubernetes`` block may need that its test sets up on the control plane: the install path it is on
KUBERNETES_PATHS = ("helm", "trainer")
_FENCE = re.compile(r"^```(\w*)\s*$")
_NEEDS = re.compile(r"^<!--\s*needs:\s*([\w, -]+?)\s*-->\s*$")
_EXITS = re.compile(r"#\s*exits\s+(\d+)\s*$")
#: the job id a documented command stands for, replaced by the one the block's last submit printed
PLACEHOLDER_ID = re.compile(r"\b1234\b")


@dataclass
class Command:
    text: str
    output: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        match = _EXITS.search(self.text)
        return int(match.group(1)) if match else 0


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: list[str]
    needs: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def daemons(self) -> tuple[str, ...]:
        return tuple(need for need in self.needs if need in DAEMONS)

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(need for need in self.needs if need not in DAEMONS + KUBERNETES_PATHS)

    @property
    def install_path(self) -> tuple[str, ...]:
        """The install a ``kubernetes`` block belongs to: () for kubectl's, else some of KUBERNETES_PATHS."""
        return tuple(need for need in KUBERNETES_PATHS if need in self.needs)

    def runs_on(self, daemon: str) -> bool:
        """Needs *daemon* alone (and modules that import): runs where the suite starts that daemon."""
        return (self.daemons == (daemon,) and (daemon == "kubernetes" or not self.install_path)
                and all(importlib.util.find_spec(m) is not None for m in self.modules))

    def runnable(self) -> bool:
        return not self.daemons and all(importlib.util.find_spec(m) is not None for m in self.modules)

    def commands(self) -> list[Command]:
        """The commands in order, a console block's with the output each shows."""
        if self.language != "console":
            return [Command(text) for text in _joined(self.body)] if self.body else []
        commands: list[Command] = []
        pending = ""
        for line in self.body:
            if pending:
                pending += "\n" + line
            elif line.startswith("$ "):
                pending = line[2:]
            else:
                if commands and line.strip():
                    commands[-1].output.append(line)
                continue
            if not pending.endswith("\\"):
                commands.append(Command(pending))
                pending = ""
        return commands

    def script(self) -> str:
        return "\n".join(command.text for command in self.commands()) + "\n"


def _joined(lines: list[str]) -> list[str]:
    """A sh block as one command (a script): heredocs and continuations stay whole."""
    return ["\n".join(lines)]


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        start = index
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            index += 1
        language = match.group(1)
        if language in SHELL_LANGUAGES:
            marker = _NEEDS.match(lines[start - 1]) if start else None
            needs = tuple(n.strip() for n in marker.group(1).split(",")) if marker else ()
            found.append(Block(path, start + 1, language, lines[start + 1:index], needs))
        index += 1
    return found


def shell_blocks() -> list[Block]:
    return [block for path in documents() for block in blocks(path)]


def hpcbridge_argvs(script: str) -> list[list[str]]:
    """Every ``hpcbridge …`` command line of a script, as argv without the program name."""
    argvs: list[list[str]] = []
    for line in script.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a line inside a quoted heredoc or string: bash -n judges the script
            continue
        command: list[str] = []
        for word in [*words, ";"]:
            if word in ("|", ";", "&&", "||", "&") or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    command.append(word[:-1])
                if command and Path(command[0]).name == "hpcbridge":
                    argvs.append(command[1:])
                command = []
            else:
                command.append(word)
    return argvs


def shown_line_found(shown: str, printed: list[str]) -> bool:
    pattern = re.compile(".*".join(re.escape(part) for part in shown.strip().split("…")))
    return any(pattern.search(line) for line in printed)
