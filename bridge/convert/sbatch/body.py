"""A batch script's body ⇄ the TrainJob command that runs it the way sbatch runs the script."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from bridge.errors import InvalidSpec

#: shells that take ``-c BODY NAME`` and run BODY as a script named NAME, as the kernel runs ``#!`` scripts
_SHELLS = {"sh", "bash", "dash", "ksh", "mksh", "zsh"}
#: any other interpreter reads the body from a pipe the way the kernel would run the script file: ``#!`` line
#: split into interpreter and one optional argument, then the script path (bash here-string on fd 3)
_EXEC_WRAPPER = 'body=$1; shift; exec "$@" /dev/fd/3 3<<<"$body"'
#: what shlex.quote produces: safe characters, or '…' pieces joined by "'" (values may span lines)
_QUOTED = r"""(?:[\w@%+=:,./-]+|'[^']*'(?:"'"'[^']*')*)"""
_EXPORT = re.compile(rf"export ([A-Za-z_][A-Za-z0-9_]*)=({_QUOTED})\n", re.ASCII)
_EXEC_FORM = re.compile(rf"\A#!/bin/bash\n((?:export [A-Za-z_][A-Za-z0-9_]*={_QUOTED}\n)*)exec (.+)\n\Z",
                        re.DOTALL | re.ASCII)


def _shebang(body: str) -> tuple[str, str | None]:
    """The interpreter and its one optional argument, split as Linux splits a ``#!`` line."""
    line = body.split("\n", 1)[0][2:].strip(" \t")
    interpreter, _, argument = line.replace("\t", " ").partition(" ")
    argument = argument.strip(" ")
    return interpreter, argument or None


def script_command(body: str, name: str) -> list[str]:
    """The trainer command that runs *body* like sbatch runs a script: through its ``#!`` interpreter.

    Shell scripts (the usual case) become ``[interpreter, (argument,) "-c", body, name]``, e.g.
    ``["/bin/bash", "-c", body, name]`` — the shell runs exactly the text sbatch would, with ``$0`` = name.
    Other interpreters (``#!/usr/bin/env python3``) get the body on a file descriptor, so the kernel-style
    ``interpreter [argument] script`` call is kept.
    """
    interpreter, argument = _shebang(body)
    if not interpreter.startswith("/"):
        raise InvalidSpec("line 1", body.split("\n", 1)[0], "the #! line must name an interpreter by absolute path")
    words = [interpreter, *([argument] if argument else [])]
    basename = interpreter.rsplit("/", 1)[-1]
    if basename in _SHELLS:
        return [*words, "-c", body, name]
    return ["/bin/bash", "-c", _EXEC_WRAPPER, name, body, *words]


def command_body(command: Sequence[str]) -> str | None:
    """The script body when *command* has one of the shapes ``script_command`` produces, else None."""
    argv = list(command)
    if len(argv) >= 6 and argv[:3] == ["/bin/bash", "-c", _EXEC_WRAPPER] and argv[4].startswith("#!"):
        body = argv[4]
        if script_command(body, argv[3]) == argv:
            return body
        return None
    for cut in (1, 2):
        if len(argv) == cut + 3 and argv[cut] == "-c" and argv[cut + 1].startswith("#!"):
            body = argv[cut + 1]
            try:
                if script_command(body, argv[-1]) == argv:
                    return body
            except InvalidSpec:
                return None
    return None


def exec_body(argv: Sequence[str], env: Sequence[tuple[str, str]] = ()) -> str:
    """A bash script that runs *argv* with no shell interpretation (``exec`` + ``shlex.join``)."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env)
    # "--" only where needed: bash's exec would read a leading "-l", "-a NAME" or "-c" as its own options
    ends = "-- " if argv[0].startswith("-") else ""
    return f"#!/bin/bash\n{exports}exec {ends}{shlex.join(argv)}\n"


def parse_exec_body(body: str) -> tuple[list[str], list[tuple[str, str]]] | None:
    """Invert ``exec_body``: (argv, env) when *body* is exactly that shape, else None."""
    match = _EXEC_FORM.match(body)
    if not match:
        return None
    try:
        words = shlex.split(match.group(2))
    except ValueError:
        return None
    argv = words[1:] if words[:1] == ["--"] else words
    # only the exact text exec_body writes: anything else (exec -a NAME …, $VARS, globs) stays a script
    if not argv or exec_body(argv) != f"#!/bin/bash\nexec {match.group(2)}\n":
        return None
    env: list[tuple[str, str]] = []
    for export in _EXPORT.finditer(match.group(1)):
        name, quoted = export.groups()
        try:
            words = shlex.split(quoted)
        except ValueError:
            return None
        if len(words) != 1 or shlex.quote(words[0]) != quoted:
            return None
        env.append((name, words[0]))
    return argv, env

