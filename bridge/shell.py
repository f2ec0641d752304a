"""Quoting for values that reach a shell script or a command line.

``shlex.quote`` is right for one-line values. A value with a newline or another control character is
written in bash's ``$'…'`` form instead, so every generated line stays one physical line: a value that
contains ``\\n#SBATCH --x`` can never become a directive.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def quote(value: str) -> str:
    if value and value.isprintable():
        return shlex.quote(value)
    if not value:
        return "''"
    if all(ch.isprintable() or ch == " " for ch in value):
        return shlex.quote(value)
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "$'" + "".join(out) + "'"


def join(argv: Iterable[str]) -> str:
    return " ".join(quote(arg) for arg in argv)
