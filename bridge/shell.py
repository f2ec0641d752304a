"""Quoting for values that reach a shell script or a command line.

``shlex.quote`` is right for values of printable characters. A value with a newline or another control or
invisible character is written in bash's ``$'…'`` form instead, so every generated line stays one physical
line of printable text: a value that contains ``\\n#SBATCH --x`` can never become a directive, and a CR, a
line separator or a bidi control can't make the script look different from what bash runs. Characters
outside ASCII that need escaping are written as their UTF-8 bytes (``\\xHH``), which bash decodes the same
way in every locale (``\\uHHHH`` depends on the job's locale).

NUL is the one byte bash cannot carry (``$'\\x00'`` ends the string): the planner refuses it with the field
that holds it, and ``quote`` raises rather than let a value be cut short.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

#: a name a shell can export (``export NAME=…``): what an env entry needs off Kubernetes, and sbatch --export
SHELL_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _plain(value: str) -> bool:
    return value.isprintable()


def quote(value: str) -> str:
    if not value:
        return "''"
    if "\x00" in value:
        raise ValueError("a NUL character cannot be carried in a shell word")
    if _plain(value):
        return shlex.quote(value)
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append("".join(f"\\x{byte:02x}" for byte in ch.encode("utf-8")))
    return "$'" + "".join(out) + "'"


def join(argv: Iterable[str]) -> str:
    return " ".join(quote(arg) for arg in argv)


def comment(text: str) -> str:
    """*text* made safe for the rest of a ``#`` comment line: every character that is not printable (a line
    break, CR, NUL, a line separator) is shown escaped, so nothing after the ``#`` can start a new line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
