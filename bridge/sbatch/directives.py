"""sbatch options as arguments: reading ``#SBATCH`` lines and command-line flags into a request, and writing
one option back as a ``#SBATCH`` line sbatch reads to exactly the same value.

Reading follows Slurm 22.05's sbatch exactly where it matters for what a script means:

* each directive line is cut into arguments by ``get_argument`` (``opt.c``): blanks separate; ``"`` or ``'``
  group (a quote closes only its own kind); a backslash makes the next character literal, but an escaped blank
  still ends the argument; an unquoted ``#`` ends the line; an argument may not start with ``:``; an
  unmatched quote is an error; an argument that comes out empty (``""``) or a bare ``hetjob``/``packjob`` word
  ends the line (a directive line starting with one separates heterogeneous components, each read alone);
* all arguments of all directive lines form one argv parsed by ``getopt_long`` with sbatch's option table
  (``slurm_opt.c``, ``+`` mode): long options by unique prefix, ``--opt=value`` or ``--opt value``, short
  options bundled (``-HkO``) or with attached values (``-N2``); an option's value may be the next argument even
  on the next line; a non-option argument is an error ("Invalid directive"); the last occurrence wins.

Which lines of a script are directive lines is ``bridge.sbatch.script``'s part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bridge.errors import InvalidSpec
from bridge.sbatch.options import (
    OVERRIDE_GROUPS,
    SHORT_OPTIONS,
    Option,
    canonical,
    check_option,
    long_option,
)

_FLAGS_WHERE = "command line"

# --- requests ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Directive:
    """One sbatch option as given: canonical long name, value (None for a flag) and where it came from."""

    option: str
    value: str | None
    #: names the directive in errors, e.g. ``#SBATCH line 4: --time`` or ``command line: --time``
    where: str

    def text(self) -> str:
        return f"--{self.option}" if self.value is None else f"--{self.option}={self.value}"


@dataclass(frozen=True)
class SbatchRequest:
    """The options of one sbatch submission, after sbatch's last-wins rule, plus the script body if any."""

    options: Mapping[str, Directive] = field(default_factory=dict)
    source: str = "<script>"
    #: the script without its directive lines (shebang, comments and commands kept), None for flags only
    body: str | None = None
    #: things worth telling the user that are not errors (e.g. deprecated ``#SLURM`` directives)
    notes: tuple[str, ...] = ()
    #: a heterogeneous job's later components (``#SBATCH hetjob`` separates them); this request is the first
    components: tuple[SbatchRequest, ...] = ()
    #: the line of the first ``hetjob`` separator, for messages
    hetjob_line: int | None = None

    def get(self, option: str) -> str | None:
        directive = self.options.get(option)
        return directive.value if directive else None

    def __contains__(self, option: object) -> bool:
        return option in self.options

    def where(self, option: str) -> str:
        directive = self.options.get(option)
        return directive.where if directive else f"--{option}"


def _apply(options: dict[str, Directive], directive: Directive) -> None:
    """sbatch semantics: a later option replaces an earlier one and every option that sets the same thing."""
    for group in OVERRIDE_GROUPS:
        if directive.option in group:
            for other in group:
                options.pop(other, None)
    options.pop(directive.option, None)
    options[directive.option] = directive


def merge(script_req: SbatchRequest, flag_req: SbatchRequest) -> SbatchRequest:
    """Command-line flags override the script's directives, as with ``sbatch [flags] script``."""
    options = dict(script_req.options)
    for directive in flag_req.options.values():
        _apply(options, directive)
    body = script_req.body if script_req.body is not None else flag_req.body
    # sbatch applies command-line options to every component of a heterogeneous job
    components = tuple(merge(component, flag_req) for component in script_req.components)
    return SbatchRequest(options, script_req.source, body, script_req.notes + flag_req.notes,
                         components, script_req.hetjob_line)


def request(found: Iterable[Directive], source: str, body: str | None, notes: Iterable[str]) -> SbatchRequest:
    """The request *found* makes, each option replacing what an earlier one set (sbatch's last-wins rule)."""
    options: dict[str, Directive] = {}
    for directive in found:
        _apply(options, directive)
    return SbatchRequest(options, source, body, tuple(notes))


# --- tokenising #SBATCH lines ------------------------------------------------------------------------------


def tokenize_directive(text: str, *, where: str = "#SBATCH", source: str | None = None) -> list[str]:
    """Split what follows ``#SBATCH`` into arguments exactly as sbatch 22.05's ``get_argument`` does."""
    args: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and isspace(text[pos]):
            pos += 1
        if pos >= end:
            return args
        if hetjob_separator(text[pos:]):
            # get_argument blanks a leading "hetjob"/"packjob" word and then finds nothing: the line ends
            return args
        if text[pos] == ":":
            raise InvalidSpec(where, text, "unexpected ':' at the start of an argument (sbatch refuses it)",
                              source=source)
        arg, pos = _argument(text, pos, where, source)
        if not arg:
            # sbatch's loop stops at the first argument that comes out empty: '#…' or a lone "" / ''
            return args
        args.append(arg)


def _argument(text: str, pos: int, where: str, source: str | None) -> tuple[str, int]:
    """The argument that starts at *pos* (quotes and escapes resolved) and the position after it."""
    out: list[str] = []
    quote = ""
    escape = False
    while pos < len(text) and (quote or not isspace(text[pos])):
        char = text[pos]
        pos += 1
        if escape:
            escape = False
        elif char == "\\":
            escape = True
            continue
        elif quote:
            if char == quote:
                quote = ""
                continue
        elif char in "\"'":
            quote = char
            continue
        elif char == "#":
            return "".join(out), pos - 1
        out.append(char)
    if quote:
        raise InvalidSpec(where, text, f"unmatched {quote} (sbatch refuses the script)", source=source)
    return "".join(out), pos


def isspace(char: str) -> bool:
    """C ``isspace()`` in the C locale: exactly these six."""
    return char in " \t\n\v\f\r"


def hetjob_separator(rest: str) -> bool:
    """Whether a directive line (what follows the magic word) starts with sbatch's component separator."""
    word = rest.lstrip(" \t\n\v\f\r")
    for sep in ("hetjob", "packjob"):
        if word[: len(sep)].lower() == sep and (len(word) == len(sep) or isspace(word[len(sep)])):
            return True
    return False


# --- getopt_long -------------------------------------------------------------------------------------------


def getopt(args: Sequence[tuple[str, str]], source: str | None) -> list[Directive]:
    """``getopt_long`` in ``+`` mode over (argument, location) pairs; the location names the directive.

    Every option found is checked (``check_option``) once all are read.
    """
    found: list[Directive] = []
    index = 0
    while index < len(args):
        arg, loc = args[index]
        index += 1
        if arg == "--":
            if index < len(args):
                raise InvalidSpec(loc, args[index][0], "not an sbatch option (after --)", source=source)
            break
        if arg.startswith("--"):
            index = _long(arg, loc, args, index, source, found)
        elif arg.startswith("-") and len(arg) > 1:
            index = _shorts(arg, loc, args, index, source, found)
        else:
            raise InvalidSpec(loc, arg, "not an sbatch option (sbatch calls this an invalid directive)",
                              source=source)
    for directive in found:
        check_option(directive.option, directive.value, directive.where, source)
    return found


def _long(arg: str, loc: str, args: Sequence[tuple[str, str]], index: int, source: str | None,
          found: list[Directive]) -> int:
    """Read the long option *arg* into *found*; the index of the next argument (past a value it took)."""
    name, eq, value = arg[2:].partition("=")
    opt = long_option(name, f"{loc}: --{name}", source)
    where = f"{loc}: --{opt.name}"
    if opt.has_arg == 0:
        if eq:
            raise InvalidSpec(where, arg, "this option takes no value", source=source)
        found.append(Directive(canonical(opt.name), None, where))
    elif opt.has_arg == 2:
        found.append(Directive(canonical(opt.name), value if eq else None, where))
    else:
        if not eq:
            if index >= len(args):
                raise InvalidSpec(where, arg, "this option needs a value", source=source)
            value = args[index][0]
            index += 1
        found.append(Directive(canonical(opt.name), value, where))
    return index


def _shorts(arg: str, loc: str, args: Sequence[tuple[str, str]], index: int, source: str | None,
            found: list[Directive]) -> int:
    """Read the bundle of short options *arg* (``-HkO``, ``-N2``) into *found*; the index of the next argument."""
    pos = 1
    while pos < len(arg):
        letter = arg[pos]
        pos += 1
        short: Option | None = SHORT_OPTIONS.get(letter)
        if short is None:
            raise InvalidSpec(f"{loc}: -{letter}", arg, "unknown sbatch option", source=source)
        where = f"{loc}: -{letter}"
        if short.has_arg == 0:
            found.append(Directive(canonical(short.name), None, where))
            continue
        rest = arg[pos:]
        if short.has_arg == 2:
            found.append(Directive(canonical(short.name), rest or None, where))
        elif rest:
            found.append(Directive(canonical(short.name), rest, where))
        elif index < len(args):
            found.append(Directive(canonical(short.name), args[index][0], where))
            index += 1
        else:
            raise InvalidSpec(where, arg, "this option needs a value", source=source)
        break
    return index


def parse_flags(argv: Sequence[str], source: str | None = None) -> SbatchRequest:
    """Read sbatch command-line flags (each list item one argument, no quoting of its own)."""
    found = getopt([(arg, _FLAGS_WHERE) for arg in argv], source)
    return request(found, source or _FLAGS_WHERE, None, ())


# --- writing a directive -----------------------------------------------------------------------------------

_OPTION_NAME = re.compile(r"[a-z][a-z0-9-]*")
#: what would end or split a ``#SBATCH`` line, for sbatch or for an editor that shows the script
_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: what ``get_argument`` treats specially: such a value is quoted and escaped
_SPECIAL = re.compile(r"[\s#\"'\\]")


def directive_arg(option: str, value: str | None, where: str | None = None) -> str:
    """``--option[=value]`` as one ``#SBATCH`` argument that ``get_argument`` reads back to exactly *value*.

    A control character or line separator in *value* is refused (it would end or split the line; *where* names
    the value in the error, ``#SBATCH --option`` by default); a blank, ``#``, quote or backslash is quoted.
    """
    if not _OPTION_NAME.fullmatch(option):
        raise InvalidSpec("#SBATCH", option, "not an sbatch long option name")
    if value is None:
        return f"--{option}"
    if _LINE_BREAKING.search(value):
        raise InvalidSpec(where or f"#SBATCH --{option}", value,
                          "a #SBATCH value must be one line without control characters")
    if not _SPECIAL.search(value):
        return f"--{option}={value}"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'--{option}="{escaped}"'


def directive_line(option: str, value: str | None) -> str:
    """The ``#SBATCH`` line that gives sbatch ``--option`` (a flag) or ``--option=value``, read back exactly."""
    return f"#SBATCH {directive_arg(option, value)}"
