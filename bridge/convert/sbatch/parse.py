"""Reading sbatch options: ``#SBATCH`` lines of a batch script and sbatch command-line flags.

Reading follows Slurm 22.05's sbatch exactly where it matters for what a script means:

* the script must start with ``#!``, contain no NUL byte and no DOS line break (``sbatch.c``);
* directives are lines that start, in column 0, with ``#SBATCH`` (or the deprecated ``#SLURM``); scanning
  stops at the first line whose first non-blank character is not ``#`` (``opt.c: _opt_batch_script``), so a
  ``#SBATCH`` line after the first command is an ordinary comment;
* each directive line is cut into arguments by ``get_argument`` (``opt.c``): blanks separate; ``"`` or ``'``
  group (a quote closes only its own kind); a backslash makes the next character literal, but an escaped blank
  still ends the argument; an unquoted ``#`` ends the line; an argument may not start with ``:``; an
  unmatched quote is an error; an argument that comes out empty (``""``) or a bare ``hetjob``/``packjob`` word
  ends the line (a directive line starting with one separates heterogeneous components, each read alone);
* all arguments of all directive lines form one argv parsed by ``getopt_long`` with sbatch's option table
  (``slurm_opt.c``, ``+`` mode): long options by unique prefix, ``--opt=value`` or ``--opt value``, short
  options bundled (``-HkO``) or with attached values (``-N2``); an option's value may be the next argument even
  on the next line; a non-option argument is an error ("Invalid directive"); the last occurrence wins.

Every value is checked as sbatch would check it (``_CHECKS``), so a request that parses is one sbatch accepts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bridge.convert.sbatch.values import (
    BadValue,
    array_problem,
    gpu_counts,
    gres_items,
    node_range,
    non_negative_int,
    positive_int,
    size_mb,
    time_seconds,
)
from bridge.errors import InvalidSpec
from bridge.shell import SHELL_ENV_NAME

_FLAGS_WHERE = "command line"

# --- sbatch 22.05's option table ---------------------------------------------------------------------------
# From src/common/slurm_opt.c (common_options[] entries with an sbatch setter): long name, argument
# (0 none, 1 required, 2 optional), short letter. getopt_long needs the whole table, not only the options we
# map: an abbreviation is accepted only when it is unique among all of them.
_TABLE = """
account 1 A|acctg-freq 1|array 1 a|batch 1|begin 1 b|bb 1|bbf 1|cluster-constraint 1|chdir 1 D|cluster 1|
clusters 1 M|comment 1|container 1|context 1|contiguous 0|constraint 1 C|core-spec 1 S|cores-per-socket 1|
cpu-freq 1|cpus-per-gpu 1|cpus-per-task 1 c|deadline 1|delay-boot 1|dependency 1 d|distribution 1 m|
error 1 e|exclude 1 x|exclusive 2|export 1|export-file 1|extra-node-info 1 B|get-user-env 2|gid 1|gpu-bind 1|
gpu-freq 1|gpus 1 G|gpus-per-node 1|gpus-per-socket 1|gpus-per-task 1|gres 1|gres-flags 1|help 0 h|hint 1|
hold 0 H|ignore-pbs 0|input 1 i|job-name 1 J|kill-on-invalid-dep 1|licenses 1 L|mail-type 1|mail-user 1|
mcs-label 1|mem 1|mem-bind 1|mem-per-cpu 1|mem-per-gpu 1|mincpus 1|network 1|nice 2|no-kill 2 k|no-requeue 0|
nodefile 1 F|nodelist 1 w|nodes 1 N|ntasks 1 n|ntasks-per-core 1|ntasks-per-gpu 1|ntasks-per-node 1|
ntasks-per-socket 1|ntasks-per-tres 1|open-mode 1|output 1 o|overcommit 0 O|oversubscribe 0 s|parsable 0|
partition 1 p|power 1|prefer 1|priority 1|profile 1|propagate 2|qos 1 q|quiet 0 Q|reboot 0|requeue 0|
reservation 1|signal 1|sockets-per-node 1|spread-job 0|switches 1|tasks-per-node 1|test-only 0|thread-spec 1|
threads-per-core 1|time 1 t|time-min 1|tmp 1|uid 1|use-min-nodes 0|verbose 0 v|version 0 V|usage 0|wait 0 W|
wait-all-nodes 1|wckey 1|wrap 1
"""


@dataclass(frozen=True)
class _Option:
    name: str
    has_arg: int
    short: str | None


def _load_table(text: str) -> dict[str, _Option]:
    table: dict[str, _Option] = {}
    for entry in text.replace("\n", "").split("|"):
        parts = entry.split()
        table[parts[0]] = _Option(parts[0], int(parts[1]), parts[2] if len(parts) > 2 else None)
    return table


OPTIONS: Mapping[str, _Option] = _load_table(_TABLE)
_SHORT = {opt.short: opt for opt in OPTIONS.values() if opt.short}
#: getopt entries that share one option value in Slurm (same setter): an abbreviation matching both is fine
_ALIASES = {"tasks-per-node": "ntasks-per-node"}
#: options that set the same thing in Slurm; the last one given wins, so only it is kept
_OVERRIDE_GROUPS = ({"requeue", "no-requeue"}, {"exclusive", "oversubscribe"}, {"nodelist", "nodefile"},
                    {"cluster", "clusters"})
#: options that make no sense in a job hpc-bridge submits (they change what sbatch itself does or prints)
_REFUSED = {
    "help": "prints sbatch's help instead of submitting",
    "usage": "prints sbatch's usage instead of submitting",
    "version": "prints sbatch's version instead of submitting",
    "test-only": "makes sbatch only estimate a start time, never submit",
    "wrap": "replaces the script with a command; give the command as the script body instead",
    "parsable": "changes the output of sbatch that hpc-bridge reads",
}


def _canonical(name: str) -> str:
    return _ALIASES.get(name, name)


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
    for group in _OVERRIDE_GROUPS:
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


# --- tokenising #SBATCH lines ------------------------------------------------------------------------------


def tokenize_directive(text: str, *, where: str = "#SBATCH", source: str | None = None) -> list[str]:
    """Split what follows ``#SBATCH`` into arguments exactly as sbatch 22.05's ``get_argument`` does."""
    args: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and _isspace(text[pos]):
            pos += 1
        if pos >= end:
            return args
        if _hetjob_separator(text[pos:]):
            # get_argument blanks a leading "hetjob"/"packjob" word and then finds nothing: the line ends
            return args
        if text[pos] == ":":
            raise InvalidSpec(where, text, "unexpected ':' at the start of an argument (sbatch refuses it)",
                              source=source)
        out: list[str] = []
        quote = ""
        escape = False
        while pos < end and (quote or not _isspace(text[pos])):
            char = text[pos]
            if escape:
                escape = False
            elif char == "\\":
                escape = True
                pos += 1
                continue
            elif quote:
                if char == quote:
                    quote = ""
                    pos += 1
                    continue
            elif char in "\"'":
                quote = char
                pos += 1
                continue
            elif char == "#":
                break
            out.append(char)
            pos += 1
        if quote:
            raise InvalidSpec(where, text, f"unmatched {quote} (sbatch refuses the script)", source=source)
        if not out:
            # sbatch's loop stops at the first argument that comes out empty: '#…' or a lone "" / ''
            return args
        args.append("".join(out))


def _isspace(char: str) -> bool:
    # C isspace() in the C locale: exactly these six
    return char in " \t\n\v\f\r"


def _is_command(line: str) -> bool:
    """sbatch stops reading directives at the first line whose first non-blank character is not '#'."""
    stripped = line.lstrip(" \t\n\v\f\r")
    return bool(stripped) and not stripped.startswith("#")


#: hpc-bridge's own directives in a batch script (sbatch reads them as comments), and what each may say
BRIDGE_MAGIC = "#HPCBRIDGE"
BRIDGE_OPTIONS = ("image",)


def bridge_directives(body: str, source: str | None = None) -> dict[str, str]:
    """``#HPCBRIDGE --image=IMAGE`` lines of the directive block (before the first command), last one wins.

    They say what sbatch has no word for: the container image the script runs in where the cluster runs
    containers (Kubernetes). Anything else on such a line is an error naming the line.
    """
    found: dict[str, str] = {}
    for line in body.split("\n"):
        if _is_command(line):
            break
        if not line.startswith(BRIDGE_MAGIC):
            continue
        where = line[:80]  # the body has no #SBATCH lines left, so its line numbers are not the file's
        args = tokenize_directive(line[len(BRIDGE_MAGIC):], where=where, source=source)
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


def _hetjob_separator(rest: str) -> bool:
    word = rest.lstrip(" \t\n\v\f\r")
    for sep in ("hetjob", "packjob"):
        if word[: len(sep)].lower() == sep and (len(word) == len(sep) or _isspace(word[len(sep)])):
            return True
    return False


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
    lines = text.split("\n")
    directives: list[tuple[int, str, int]] = []
    kept: list[str] = []
    notes: list[str] = []
    separators: list[int] = []
    reading = True
    component = 0
    for number, line in enumerate(lines, start=1):
        if reading:
            magic = "#SBATCH" if line.startswith("#SBATCH") else "#SLURM" if line.startswith("#SLURM") else None
            if magic:
                rest = line[len(magic):]
                if _hetjob_separator(rest):
                    # sbatch 22.05: the line's first word separates components; the rest of the line is ignored
                    component += 1
                    separators.append(number)
                    if rest.lstrip(" \t\n\v\f\r")[:7].lower() == "packjob":
                        notes.append(f"line {number}: the packjob separator is deprecated; sbatch reads it as hetjob")
                    continue
                if magic == "#SLURM" and not any("#SLURM" in note for note in notes):
                    notes.append(f"line {number}: #SLURM directives are deprecated; sbatch reads them like #SBATCH")
                directives.append((number, rest, component))
                continue
            if _is_command(line):
                reading = False
        kept.append(line)
    return ScriptParts(directives, "\n".join(kept), notes, separators)


# --- getopt_long -------------------------------------------------------------------------------------------


def _lookup_long(name: str, where: str, source: str | None) -> _Option:
    if name in OPTIONS:
        return OPTIONS[name]
    matches = [opt for opt in OPTIONS.values() if opt.name.startswith(name)]
    if not matches:
        raise InvalidSpec(where, f"--{name}", "unknown sbatch option", source=source)
    distinct = {(_canonical(opt.name), opt.has_arg) for opt in matches}
    if len(distinct) > 1:
        names = ", ".join(f"--{opt.name}" for opt in matches[:6])
        raise InvalidSpec(where, f"--{name}", f"ambiguous abbreviation ({names})", source=source)
    return matches[0]


def _getopt(args: Sequence[tuple[str, str]], source: str | None) -> list[Directive]:
    """``getopt_long`` in ``+`` mode over (argument, location) pairs; the location names the directive."""
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
            name, eq, value = arg[2:].partition("=")
            opt = _lookup_long(name, f"{loc}: --{name}", source)
            where = f"{loc}: --{opt.name}"
            if opt.has_arg == 0:
                if eq:
                    raise InvalidSpec(where, arg, "this option takes no value", source=source)
                found.append(Directive(_canonical(opt.name), None, where))
            elif opt.has_arg == 2:
                found.append(Directive(_canonical(opt.name), value if eq else None, where))
            else:
                if not eq:
                    if index >= len(args):
                        raise InvalidSpec(where, arg, "this option needs a value", source=source)
                    value = args[index][0]
                    index += 1
                found.append(Directive(_canonical(opt.name), value, where))
            continue
        if arg.startswith("-") and len(arg) > 1:
            pos = 1
            while pos < len(arg):
                letter = arg[pos]
                pos += 1
                short = _SHORT.get(letter)
                if short is None:
                    raise InvalidSpec(f"{loc}: -{letter}", arg, "unknown sbatch option", source=source)
                where = f"{loc}: -{letter}"
                if short.has_arg == 0:
                    found.append(Directive(_canonical(short.name), None, where))
                    continue
                rest = arg[pos:]
                if short.has_arg == 2:
                    found.append(Directive(_canonical(short.name), rest or None, where))
                elif rest:
                    found.append(Directive(_canonical(short.name), rest, where))
                elif index < len(args):
                    found.append(Directive(_canonical(short.name), args[index][0], where))
                    index += 1
                else:
                    raise InvalidSpec(where, arg, "this option needs a value", source=source)
                break
            continue
        raise InvalidSpec(loc, arg, "not an sbatch option (sbatch calls this an invalid directive)", source=source)
    for directive in found:
        _validate(directive, source)
    return found


def _request(found: Iterable[Directive], source: str, body: str | None, notes: Iterable[str]) -> SbatchRequest:
    options: dict[str, Directive] = {}
    for directive in found:
        _apply(options, directive)
    return SbatchRequest(options, source, body, tuple(notes))


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
        requests.append(_request(_getopt(args, source), source, body if index == 0 else None,
                                 notes if index == 0 else ()))
    first = requests[0]
    if len(requests) == 1:
        return first
    return SbatchRequest(first.options, source, body, first.notes, tuple(requests[1:]), separators[0])


def parse_flags(argv: Sequence[str], source: str | None = None) -> SbatchRequest:
    """Read sbatch command-line flags (each list item one argument, no quoting of its own)."""
    found = _getopt([(arg, _FLAGS_WHERE) for arg in argv], source)
    return _request(found, source or _FLAGS_WHERE, None, ())


# --- option values ---------------------------------------------------------------------------------------

_DEP_TYPES = "after|afterany|afterburstbuffer|aftercorr|afternotok|afterok|expand"
_DEP_ITEM = rf"(?:singleton|(?:{_DEP_TYPES})(?::[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?)+)"
_DEPENDENCY = re.compile(rf"^{_DEP_ITEM}(?:[,?]{_DEP_ITEM})*\Z")
_MAIL_TYPES = {"NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
               "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"}
_SIGNAL = re.compile(r"^(?:[RrBb]{1,2}:?)?(?:[0-9]+|(?:SIG)?[A-Za-z][A-Za-z0-9]*)(?:@[0-9]+)?\Z")
_DISTRIBUTION = re.compile(r"^(?:\*|block|cyclic|arbitrary|plane(?:=[0-9]+)?)(?::(?:\*|block|cyclic|fcyclic)){0,2}"
                           r"(?:,(?:pack|nopack))?\Z", re.IGNORECASE)
_LICENSES = re.compile(r"^[A-Za-z0-9_.@-]+(?::[0-9]+)?(?:[,|][A-Za-z0-9_.@-]+(?::[0-9]+)?)*\Z")
_BEGIN = re.compile(
    r"^(?:now(?:\+[0-9]+(?:seconds|second|sec|s|minutes|minute|min|m|hours|hour|h|days|day|d|weeks|week|w)?)?"
    r"|(?:midnight|noon|elevenses|fika|teatime|today|tomorrow)"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}(?:T[0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?)?"
    r"|[0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?(?:AM|PM|am|pm)?"
    r"|[0-9]{2}/[0-9]{2}(?:/[0-9]{2})?|[0-9]{4}(?:[0-9]{2})?)\Z", re.IGNORECASE)


def _check_export(value: str) -> None:
    for index, item in enumerate(value.split(",")):
        name = item.partition("=")[0]
        if index == 0 and item.upper() in ("ALL", "NONE", "NIL"):
            continue
        if not SHELL_ENV_NAME.fullmatch(name):
            raise BadValue("not an export list: ALL, NONE or VAR[=value][,…] (ALL or NONE first)")


def _one_of(*choices: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value.lower() not in choices:
            raise BadValue(f"must be one of {', '.join(choices)}")
    return check


def _pattern(regex: re.Pattern[str], what: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if not regex.fullmatch(value):
            raise BadValue(f"not {what}")
    return check


def _check_nice(value: str) -> None:
    if not re.fullmatch(r"[+-]?[0-9]+", value) or abs(int(value)) > 2**31 - 3:
        raise BadValue("must be a whole number between -2147483645 and 2147483645")


def _check_priority(value: str) -> None:
    if value.upper() != "TOP" and (not re.fullmatch(r"[0-9]+", value) or int(value) >= 2**32 - 2):
        raise BadValue("must be TOP or a whole number >= 0")


def _check_mail_type(value: str) -> None:
    for item in value.split(","):
        if item.upper() not in _MAIL_TYPES:
            raise BadValue(f"unknown mail type {item!r}; known: {', '.join(sorted(_MAIL_TYPES))}")


def _check_switches(value: str) -> None:
    count, at, wait = value.partition("@")
    non_negative_int(count)
    if at:
        time_seconds(wait)


def _check_begin(value: str) -> None:
    if not _BEGIN.match(value):
        raise BadValue("not a Slurm date/time: now[+count[units]], HH:MM[:SS][AM|PM], MMDD[YY], MM/DD[/YY], "
                   "YYYY-MM-DD[THH:MM[:SS]], midnight, noon, teatime, today, tomorrow…")


def _check_array(value: str) -> None:
    problem = array_problem(value)
    if problem:
        raise BadValue(problem)


def _check_gpus(value: str) -> None:
    gpu_counts(value)


def _check_gres(value: str) -> None:
    gres_items(value)


#: value checks for the options whose syntax we know; the rest only have to be non-empty
_CHECKS: dict[str, Any] = {
    "nodes": node_range, "ntasks": positive_int, "ntasks-per-node": positive_int,
    "cpus-per-task": positive_int, "mem": size_mb, "mem-per-cpu": size_mb, "mem-per-gpu": size_mb,
    "tmp": size_mb, "gpus": _check_gpus, "gpus-per-node": _check_gpus, "gpus-per-task": _check_gpus,
    "gpus-per-socket": _check_gpus, "gres": _check_gres, "time": time_seconds, "time-min": time_seconds,
    "delay-boot": time_seconds, "array": _check_array,
    "dependency": _pattern(_DEPENDENCY, "a dependency like afterok:123[:456], afterany:12+30 or singleton"),
    "export": _check_export, "signal": _pattern(_SIGNAL, "a signal spec like [{R|B}:]USR1[@60]"),
    "mail-type": _check_mail_type, "open-mode": _one_of("append", "truncate"), "nice": _check_nice,
    "priority": _check_priority, "switches": _check_switches, "wait-all-nodes": _one_of("0", "1"),
    "begin": _check_begin, "deadline": _check_begin, "distribution": _pattern(_DISTRIBUTION, "a distribution "
                                                                              "like block, cyclic:block or plane=4"),
    "licenses": _pattern(_LICENSES, "a license list like matlab:2,ansys"), "mincpus": positive_int,
    "sockets-per-node": positive_int, "cores-per-socket": positive_int, "threads-per-core": positive_int,
    "ntasks-per-socket": positive_int, "ntasks-per-core": positive_int, "ntasks-per-gpu": positive_int,
    "cpus-per-gpu": positive_int, "core-spec": non_negative_int, "thread-spec": non_negative_int,
    "exclusive": _one_of("exclusive", "oversubscribe", "user", "mcs"), "no-kill": _one_of("set", "off", "no"),
}


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _validate(directive: Directive, source: str | None) -> None:
    option, value = directive.option, directive.value
    if option in _REFUSED:
        raise InvalidSpec(directive.where, directive.text(), _REFUSED[option], source=source)
    if value is None:
        return
    if value == "" or not value.strip():
        raise InvalidSpec(directive.where, value, "empty value", source=source)
    if _CONTROL.search(value):
        # hpc-bridge writes every value back into a one-line #SBATCH directive
        raise InvalidSpec(directive.where, value, "control characters (newline, tab, …) are not allowed in a value",
                          source=source)
    check = _CHECKS.get(option)
    if check is None:
        return
    try:
        check(value)
    except BadValue as exc:
        raise InvalidSpec(directive.where, value, str(exc), source=source) from None


# --- writing a directive back ------------------------------------------------------------------------------

_PLAIN_DIRECTIVE = re.compile(r"^[^\s\"'\\#]+\Z")


def directive_arg(option: str, value: str | None, where: str) -> str:
    """``--option[=value]`` as one #SBATCH argument that ``get_argument`` reads back to exactly *value*."""
    if value is None:
        return f"--{option}"
    if _CONTROL.search(value):
        raise InvalidSpec(where, value, "a #SBATCH value must be one line without control characters")
    if _PLAIN_DIRECTIVE.match(value):
        return f"--{option}={value}"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'--{option}="{escaped}"'


def check_passthrough(option: str, value: str, where: str) -> None:
    """Refuse what an ``hpcbridge.io/sbatch.<option>: value`` annotation may not say: an option sbatch does not
    have (by its full name: ``getopt_long`` would read an abbreviation such as ``ui`` as ``--uid``), one that
    changes what sbatch itself does (``--wrap``, ``--test-only``…), a value on a flag, or a value sbatch would
    refuse. Privileged options (``--uid``…) are the planner's to refuse, against the target cluster."""
    known = OPTIONS.get(option)
    if known is None:
        raise InvalidSpec(where, option, "not an sbatch option (give its full long name, e.g. sbatch.requeue)")
    if option in _REFUSED:
        raise InvalidSpec(where, option, _REFUSED[option])
    if known.has_arg == 0 and value != "true":
        raise InvalidSpec(where, value, f"--{option} takes no value; write \"true\" to pass the flag")
    written = passthrough_value(option, value)
    _validate(Directive(option, written, where), None)


def passthrough_value(option: str, value: str) -> str | None:
    """What to write for a verbatim ``hpcbridge.io/sbatch.<option>: value`` annotation: *value*, or None (a bare
    ``--option``) for the ``"true"`` that stands for a flag, on an option that takes no value or an optional one."""
    known = OPTIONS.get(option)
    return None if value == "true" and known is not None and known.has_arg != 1 else value
