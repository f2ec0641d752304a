"""A batch script as sbatch 22.05 reads it: the checks it makes first, its directive block, its body.

* the script must start with ``#!``, contain no NUL byte and no DOS line break (``sbatch.c``);
* directives are lines that start, in column 0, with ``#SBATCH`` (or the deprecated ``#SLURM``); scanning
  stops at the first line whose first non-blank character is not ``#`` (``opt.c: _opt_batch_script``), so a
  ``#SBATCH`` line after the first command is an ordinary comment;
* the arguments of all directive lines of one heterogeneous component are read as one argv
  (``bridge.sbatch.directives``).

hpc-bridge's own ``#HPCBRIDGE`` lines (``bridge_directives``) sit in the same block; sbatch reads them as comments.
"""

from __future__ import annotations

from typing import NamedTuple

from bridge.errors import InvalidSpec
from bridge.sbatch.directives import (
    SbatchRequest,
    getopt,
    hetjob_separator,
    request,
    tokenize_directive,
)

#: hpc-bridge's own directives in a batch script (sbatch reads them as comments), and what each may say
BRIDGE_MAGIC = "#HPCBRIDGE"
BRIDGE_OPTIONS = ("image",)


def is_command(line: str) -> bool:
    """sbatch stops reading directives at the first line whose first non-blank character is not '#'."""
    stripped = line.lstrip(" \t\n\v\f\r")
    return bool(stripped) and not stripped.startswith("#")


def bridge_directives(body: str, source: str | None = None) -> dict[str, str]:
    """``#HPCBRIDGE --image=IMAGE`` lines of the directive block (before the first command), last one wins.

    They say what sbatch has no word for: the container image the script runs in where the cluster runs
    containers (Kubernetes). Anything else on such a line is an error naming the line.
    """
    found: dict[str, str] = {}
    for line in body.split("\n"):
        if is_command(line):
            break
        if not line.startswith(BRIDGE_MAGIC):
            continue
        where = line[:80]  # the body has no #SBATCH lines left, so its line numbers are not the file's
        found.update(_bridge_options(tokenize_directive(line[len(BRIDGE_MAGIC):], where=where, source=source),
                                     where, source))
    return found


def _bridge_options(args: list[str], where: str, source: str | None) -> dict[str, str]:
    """The ``--name=value`` (or ``--name value``) pairs of one ``#HPCBRIDGE`` line, in order."""
    found: dict[str, str] = {}
    index = 0
    while index < len(args):
        name, eq, value = args[index].removeprefix("--").partition("=")
        if not args[index].startswith("--") or name not in BRIDGE_OPTIONS:
            raise InvalidSpec(where, args[index], "takes only "
                              + ", ".join(f"--{option}=VALUE" for option in BRIDGE_OPTIONS), source=source)
        if not eq:
            index += 1
            if index >= len(args):
                raise InvalidSpec(where, args[index - 1], "needs a value", source=source)
            value = args[index]
        if not value or any(ch.isspace() for ch in value):
            raise InvalidSpec(where, value, f"--{name} must be one word", source=source)
        found[name] = value
        index += 1
    return found


def _check_script(text: str, source: str) -> None:
    """The sanity checks sbatch makes before reading a script."""
    if not text:
        raise InvalidSpec("script", text, "batch script is empty", source=source)
    if not text.strip(" \t\n\v\f\r"):
        raise InvalidSpec("script", text, "batch script contains only whitespace", source=source)
    if not text.startswith("#!"):
        first = text.split("\n", 1)[0]
        raise InvalidSpec("line 1", first, "a batch script must start with #! and an interpreter, e.g. #!/bin/bash",
                          source=source)
    if "\x00" in text:
        raise InvalidSpec("script", "\\0", "contains a NUL character, which Slurm refuses", source=source)
    if "\r\n" in text:
        line = text[: text.index("\r\n")].count("\n") + 1
        raise InvalidSpec(f"line {line}", "\\r\\n", "DOS line break; sbatch wants UNIX line breaks", source=source)
    if "\r" in text:
        # sbatch reads a lone CR in a #SBATCH line as a blank, bash as part of a word, an editor or a terminal
        # as a line break: three readings of one script, so none is chosen
        line = text[: text.index("\r")].count("\n") + 1
        raise InvalidSpec(f"line {line}", "\\r", "a carriage return without a line feed: sbatch, bash and an editor "
                          "would each read this line differently", source=source)


class ScriptParts(NamedTuple):
    #: (line number, text after the magic word, component)
    directives: list[tuple[int, str, int]]
    body: str
    notes: list[str]
    #: line numbers of ``#SBATCH hetjob`` separators
    separators: list[int]


def split_script(text: str, source: str = "<script>") -> ScriptParts:
    """The directive lines (line number, text after the magic word, component), the body, notes, separators.

    The component counts ``#SBATCH hetjob`` separators (0 for an ordinary job). The body is the script with
    its directive lines removed: the shebang, comments, blank lines and every line from the first command on
    stay byte for byte.
    """
    _check_script(text, source)
    parts = ScriptParts([], "", [], [])
    kept: list[str] = []
    reading = True
    for number, line in enumerate(text.split("\n"), start=1):
        if reading:
            magic = "#SBATCH" if line.startswith("#SBATCH") else "#SLURM" if line.startswith("#SLURM") else None
            if magic:
                _directive_line(parts, number, magic, line[len(magic):])
                continue
            if is_command(line):
                reading = False
        kept.append(line)
    return parts._replace(body="\n".join(kept))


def _directive_line(parts: ScriptParts, number: int, magic: str, rest: str) -> None:
    """Record directive line *number* (*rest* follows its magic word) in *parts*: a separator or a directive."""
    if hetjob_separator(rest):
        # sbatch 22.05: the line's first word separates components; the rest of the line is ignored
        parts.separators.append(number)
        if rest.lstrip(" \t\n\v\f\r")[:7].lower() == "packjob":
            parts.notes.append(f"line {number}: the packjob separator is deprecated; sbatch reads it as hetjob")
        return
    if magic == "#SLURM" and not any("#SLURM" in note for note in parts.notes):
        parts.notes.append(f"line {number}: #SLURM directives are deprecated; sbatch reads them like #SBATCH")
    parts.directives.append((number, rest, len(parts.separators)))


def parse_script(text: str, source: str = "<script>") -> SbatchRequest:
    """Read a batch script's ``#SBATCH`` block as sbatch does; the request carries the body too.

    A heterogeneous job's components are read each on its own, as sbatch does, and are all checked.
    """
    lines, body, notes, separators = split_script(text, source)
    requests = []
    for index in range(1 + len(separators)):
        args: list[tuple[str, str]] = []
        for number, rest, component in lines:
            if component != index:
                continue
            where = f"#SBATCH line {number}"
            args.extend((arg, where) for arg in tokenize_directive(rest, where=where, source=source))
        requests.append(request(getopt(args, source), source, body if index == 0 else None,
                                notes if index == 0 else ()))
    first = requests[0]
    if len(requests) == 1:
        return first
    return SbatchRequest(first.options, source, body, first.notes, tuple(requests[1:]), separators[0])
