"""sbatch batch scripts and sbatch command-line flags ⇄ TrainJob.

Reading follows Slurm 22.05's sbatch exactly where it matters for what a script means:

* the script must start with ``#!``, contain no NUL byte and no DOS line break (``sbatch.c``);
* directives are lines that start, in column 0, with ``#SBATCH`` (or the deprecated ``#SLURM``); scanning
  stops at the first line whose first non-blank character is not ``#`` (``opt.c: _opt_batch_script``), so a
  ``#SBATCH`` line after the first command is an ordinary comment;
* each directive line is cut into arguments by ``get_argument`` (``opt.c``): blanks separate; ``"`` or ``'``
  group (a quote closes only its own kind); a backslash makes the next character literal, but an escaped blank
  still ends the argument; an unquoted ``#`` ends the line; an argument may not start with ``:``; an
  unmatched quote is an error; an argument that comes out empty (``""``) or a bare ``hetjob``/``packjob`` word
  ends the line (a directive line starting with one separates heterogeneous components: refused here);
* all arguments of all directive lines form one argv parsed by ``getopt_long`` with sbatch's option table
  (``slurm_opt.c``, ``+`` mode): long options by unique prefix, ``--opt=value`` or ``--opt value``, short
  options bundled (``-HkO``) or with attached values (``-N2``); an option's value may be the next argument even
  on the next line; a non-option argument is an error ("Invalid directive"); the last occurrence wins.

Converting maps what a TrainJob has fields for (nodes, tasks per node, CPUs, memory, GPUs, time limit, name,
hold) and the scheduler knobs hpc-bridge has annotations for; every other option travels verbatim as an
``hpcbridge.io/sbatch.<option>`` annotation, which the Slurm renderer writes after its own directives, so sbatch's
last-wins rule makes the verbatim value the one that counts. The script body runs unchanged through its own
interpreter (see ``script_command``).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from typing import Any

from pydantic import ValidationError

from bridge.api.cluster import BridgeCluster, builtin_local_cluster
from bridge.api.loader import invalid_from_validation
from bridge.api.quantity import parse_quantity
from bridge.api.runtime import ClusterTrainingRuntime
from bridge.api.trainjob import API_VERSION, MANAGED_BY_BRIDGE, RFC1035_LABEL, TrainJob
from bridge.errors import InvalidSpec
from bridge.plan import ANNOTATION_PREFIX, SBATCH_PASSTHROUGH_PREFIX, _backend_options

#: the ClusterTrainingRuntime converted scripts reference (see ``sbatch_runtime``)
SBATCH_RUNTIME = "sbatch-script"
GPU_RESOURCE = "nvidia.com/gpu"
_FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
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
#: options with a TrainJob field or an hpc-bridge annotation (everything else is passed through verbatim)
_KNOB_OPTIONS = {"partition": "partition", "account": "account", "qos": "qos", "constraint": "constraint",
                 "array": "array", "dependency": "dependency", "output": "output", "error": "error",
                 "chdir": "workdir"}


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
    return SbatchRequest(options, script_req.source, body, script_req.notes + flag_req.notes)


# --- tokenising #SBATCH lines ------------------------------------------------------------------------------


class _Bad(Exception):
    """A value problem inside this module; always turned into InvalidSpec before it leaves."""


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


def split_script(text: str, source: str = "<script>") -> tuple[list[tuple[int, str]], str, list[str]]:
    """The directive lines (line number, text after the magic word), the body, and notes.

    The body is the script with its directive lines removed: the shebang, comments, blank lines and every
    line from the first command on stay byte for byte.
    """
    _check_script(text, source)
    lines = text.split("\n")
    directives: list[tuple[int, str]] = []
    kept: list[str] = []
    notes: list[str] = []
    reading = True
    for number, line in enumerate(lines, start=1):
        if reading:
            magic = "#SBATCH" if line.startswith("#SBATCH") else "#SLURM" if line.startswith("#SLURM") else None
            if magic:
                rest = line[len(magic):]
                if _hetjob_separator(rest):
                    raise InvalidSpec(f"#SBATCH line {number}", line,
                                      "heterogeneous jobs (hetjob components) cannot become one TrainJob",
                                      source=source)
                if magic == "#SLURM" and not any("#SLURM" in note for note in notes):
                    notes.append(f"line {number}: #SLURM directives are deprecated; sbatch reads them like #SBATCH")
                directives.append((number, rest))
                continue
            if _is_command(line):
                reading = False
        kept.append(line)
    return directives, "\n".join(kept), notes


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
    """Read a batch script's ``#SBATCH`` block as sbatch does; the request carries the body too."""
    lines, body, notes = split_script(text, source)
    args: list[tuple[str, str]] = []
    for number, rest in lines:
        where = f"#SBATCH line {number}"
        args.extend((arg, where) for arg in tokenize_directive(rest, where=where, source=source))
    return _request(_getopt(args, source), source, body, notes)


def parse_flags(argv: Sequence[str], source: str | None = None) -> SbatchRequest:
    """Read sbatch command-line flags (each list item one argument, no quoting of its own)."""
    found = _getopt([(arg, _FLAGS_WHERE) for arg in argv], source)
    return _request(found, source or _FLAGS_WHERE, None, ())


# --- values ------------------------------------------------------------------------------------------------

_TIMESPEC = re.compile(r"^[0-9:-]+\Z")


def time_seconds(value: str) -> int | None:
    """Slurm's ``time_str2secs``: every 22.05 time format in seconds; None means no limit.

    ``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``,
    ``days-hours:minutes:seconds``, ``UNLIMITED``/``INFINITE``/``-1``. Slurm rounds up to whole minutes and
    treats 0 as no limit.
    """
    if value.lower() in ("-1", "infinite", "unlimited"):
        return None
    if not value or not _TIMESPEC.match(value) or not _valid_timespec(value):
        raise _Bad("not a Slurm time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, "
                   "days-hours:minutes, days-hours:minutes:seconds or UNLIMITED")
    if "-" in value:
        days_text, _, clock = value.partition("-")
        if not days_text:
            raise _Bad("a time limit cannot be negative")
        parts = [int(p) for p in clock.split(":") if p] if clock else []
        parts += [0] * (3 - len(parts))
        seconds = int(days_text) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    else:
        parts = [int(p) for p in value.split(":")]
        if len(parts) == 3:
            seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
        else:
            seconds = parts[0] * 60 + (parts[1] if len(parts) > 1 else 0)
    if seconds > _MAX_SECONDS:
        # Slurm computes in a C int and would silently overflow
        raise _Bad("time limit too long")
    return seconds or None


_MAX_SECONDS = 2**31 - 1


def _valid_timespec(value: str) -> bool:
    """``_is_valid_timespec`` from parse_time.c: counts digit runs, dashes and colons."""
    digits = dashes = colons = 0
    in_digit = False
    for char in value:
        if char.isdigit():
            if not in_digit:
                digits += 1
                in_digit = True
        elif char == "-":
            in_digit = False
            dashes += 1
            if colons:
                return False
        else:
            in_digit = False
            colons += 1
    if not digits or dashes > 1 or colons > 2:
        return False
    need = {1: 3, 2: 4} if dashes else {1: 2, 2: 3}
    return not (colons and digits < need[colons])


_SIZE = re.compile(r"^([0-9]+)([KkMmGgTt][Bb]?)?\Z")


def size_mb(value: str) -> int:
    """Slurm's ``str_to_mbytes``: a count with optional K/M/G/T suffix, MB by default; K rounds up."""
    match = _SIZE.match(value)
    if not match:
        raise _Bad("not a size: a number with an optional K, M, G or T suffix (default M)")
    number = int(match.group(1))
    unit = (match.group(2) or "M")[0].upper()
    if unit == "K":
        return (number + 1023) // 1024
    return number * {"M": 1, "G": 1024, "T": 1024 * 1024}[unit]


_NODE_COUNT = re.compile(r"^([0-9]+)([kK])?([mM])?\Z")


def node_range(value: str) -> tuple[int, int]:
    """``verify_node_count``: ``N`` or ``min-max`` (k/m multiply by 1024); an empty minimum means 1.

    An empty maximum (``2-``) reads as -1 in Slurm, which then refuses it as less than the minimum.
    """

    def count(text: str) -> int:
        match = _NODE_COUNT.match(text)
        if not match:
            raise _Bad("not a node count: N or min-max")
        number = int(match.group(1))
        return number * (1024 if match.group(2) else 1) * (1024 * 1024 if match.group(3) else 1)

    low_text, dash, high_text = value.partition("-")
    if not dash:
        low = count(low_text)
        if low < 1:
            raise _Bad("a job needs at least one node")
        return low, low
    low = max(count(low_text), 1) if low_text else 1
    if not high_text:
        raise _Bad("a node range needs its maximum: min-max")
    high = count(high_text)
    if high < low:
        raise _Bad(f"maximum node count {high} is less than minimum {low}")
    return low, high


_GPU_ITEM = re.compile(r"^(?:([A-Za-z0-9_.-]+):)?([0-9]+)\Z")


def gpu_counts(value: str) -> list[tuple[str | None, int]]:
    """``[type:]count[,[type:]count…]`` as in --gpus, --gpus-per-node, --gpus-per-task."""
    items = []
    for part in value.split(","):
        match = _GPU_ITEM.match(part)
        if not match:
            raise _Bad("not a GPU count: N or type:N (comma-separated for several types)")
        items.append((match.group(1), int(match.group(2))))
    return items


_GRES_COUNT = re.compile(r"^[0-9]+[kKmMgG]?\Z")
_GRES_WORD = re.compile(r"^[A-Za-z0-9_.-]+\Z")


@dataclass(frozen=True)
class GresItem:
    """One ``name[[:type]:count]`` item of --gres, with its text as given."""

    text: str
    name: str
    kind: str | None
    count: str


def gres_items(value: str) -> list[GresItem]:
    """The items of a --gres value (``none`` is none; count defaults to 1; ``gres:``/``gres/`` prefixes allowed)."""
    if value.lower() == "none":
        return []
    items = []
    for part in value.split(","):
        pieces = part.split(":")
        if pieces[0] == "gres":
            pieces = pieces[1:]
        if pieces and pieces[0].startswith("gres/"):
            pieces[0] = pieces[0][len("gres/"):]
        if not pieces or len(pieces) > 3 or not all(_GRES_WORD.match(p) for p in pieces):
            raise _Bad("not a GRES list: name[[:type]:count][,…], e.g. gpu:2 or gpu:a100:4")
        name, kind, count = pieces[0], None, "1"
        if len(pieces) == 3:
            kind, count = pieces[1], pieces[2]
        elif len(pieces) == 2:
            if _GRES_COUNT.match(pieces[1]):
                count = pieces[1]
            else:
                kind = pieces[1]
        if not _GRES_COUNT.match(count):
            raise _Bad("not a GRES list: name[[:type]:count][,…], e.g. gpu:2 or gpu:a100:4")
        items.append(GresItem(part, name, kind, count))
    return items


def _positive_int(value: str) -> int:
    if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
        raise _Bad("must be a positive whole number")
    return int(value)


def _non_negative_int(value: str) -> int:
    if not re.fullmatch(r"[0-9]+", value):
        raise _Bad("must be a whole number")
    return int(value)


_ARRAY = re.compile(r"^[0-9]+(-[0-9]+)?(:[0-9]+)?(,[0-9]+(-[0-9]+)?(:[0-9]+)?)*(%[0-9]+)?\Z")
_DEP_TYPES = "after|afterany|afterburstbuffer|aftercorr|afternotok|afterok|expand"
_DEP_ITEM = rf"(?:singleton|(?:{_DEP_TYPES})(?::[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?)+)"
_DEPENDENCY = re.compile(rf"^{_DEP_ITEM}(?:[,?]{_DEP_ITEM})*\Z")
_MAIL_TYPES = {"NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
               "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"}
_SIGNAL = re.compile(r"^(?:[RrBb]{1,2}:?)?(?:[0-9]+|(?:SIG)?[A-Za-z][A-Za-z0-9]*)(?:@[0-9]+)?\Z")
_EXPORT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_DISTRIBUTION = re.compile(r"^(?:\*|block|cyclic|arbitrary|plane(?:=[0-9]+)?)(?::(?:\*|block|cyclic|fcyclic)){0,2}"
                           r"(?:,(?:pack|nopack))?\Z", re.IGNORECASE)
_LICENSES = re.compile(r"^[A-Za-z0-9_.@-]+(?::[0-9]+)?(?:[,|][A-Za-z0-9_.@-]+(?::[0-9]+)?)*\Z")
_BEGIN_WORDS = {"now", "today", "tomorrow", "midnight", "noon", "elevenses", "fika", "teatime"}
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
        if not _EXPORT_NAME.match(name):
            raise _Bad("not an export list: ALL, NONE or VAR[=value][,…] (ALL or NONE first)")


def _one_of(*choices: str):
    def check(value: str) -> None:
        if value.lower() not in choices:
            raise _Bad(f"must be one of {', '.join(choices)}")
    return check


def _pattern(regex: re.Pattern[str], what: str):
    def check(value: str) -> None:
        if not regex.match(value):
            raise _Bad(f"not {what}")
    return check


def _check_nice(value: str) -> None:
    if not re.fullmatch(r"[+-]?[0-9]+", value) or abs(int(value)) > 2**31 - 3:
        raise _Bad("must be a whole number between -2147483645 and 2147483645")


def _check_priority(value: str) -> None:
    if value.upper() != "TOP" and (not re.fullmatch(r"[0-9]+", value) or int(value) >= 2**32 - 2):
        raise _Bad("must be TOP or a whole number >= 0")


def _check_mail_type(value: str) -> None:
    for item in value.split(","):
        if item.upper() not in _MAIL_TYPES:
            raise _Bad(f"unknown mail type {item!r}; known: {', '.join(sorted(_MAIL_TYPES))}")


def _check_switches(value: str) -> None:
    count, at, wait = value.partition("@")
    _non_negative_int(count)
    if at:
        time_seconds(wait)


def _check_begin(value: str) -> None:
    if not _BEGIN.match(value):
        raise _Bad("not a Slurm date/time: now[+count[units]], HH:MM[:SS][AM|PM], MMDD[YY], MM/DD[/YY], "
                   "YYYY-MM-DD[THH:MM[:SS]], midnight, noon, teatime, today, tomorrow…")


def _check_gpus(value: str) -> None:
    gpu_counts(value)


def _check_gres(value: str) -> None:
    gres_items(value)


#: value checks for the options whose syntax we know; the rest only have to be non-empty
_CHECKS: dict[str, Any] = {
    "nodes": node_range, "ntasks": _positive_int, "ntasks-per-node": _positive_int,
    "cpus-per-task": _positive_int, "mem": size_mb, "mem-per-cpu": size_mb, "mem-per-gpu": size_mb,
    "tmp": size_mb, "gpus": _check_gpus, "gpus-per-node": _check_gpus, "gpus-per-task": _check_gpus,
    "gpus-per-socket": _check_gpus, "gres": _check_gres, "time": time_seconds, "time-min": time_seconds,
    "delay-boot": time_seconds, "array": _pattern(_ARRAY, "a job array spec like 0-15, 1,3,5-7:2 or 0-99%10"),
    "dependency": _pattern(_DEPENDENCY, "a dependency like afterok:123[:456], afterany:12+30 or singleton"),
    "export": _check_export, "signal": _pattern(_SIGNAL, "a signal spec like [{R|B}:]USR1[@60]"),
    "mail-type": _check_mail_type, "open-mode": _one_of("append", "truncate"), "nice": _check_nice,
    "priority": _check_priority, "switches": _check_switches, "wait-all-nodes": _one_of("0", "1"),
    "begin": _check_begin, "deadline": _check_begin, "distribution": _pattern(_DISTRIBUTION, "a distribution "
                                                                              "like block, cyclic:block or plane=4"),
    "licenses": _pattern(_LICENSES, "a license list like matlab:2,ansys"), "mincpus": _positive_int,
    "sockets-per-node": _positive_int, "cores-per-socket": _positive_int, "threads-per-core": _positive_int,
    "ntasks-per-socket": _positive_int, "ntasks-per-core": _positive_int, "ntasks-per-gpu": _positive_int,
    "cpus-per-gpu": _positive_int, "core-spec": _non_negative_int, "thread-spec": _non_negative_int,
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
    except _Bad as exc:
        raise InvalidSpec(directive.where, value, str(exc), source=source) from None


# --- names -------------------------------------------------------------------------------------------------


def dns_label(name: str) -> str:
    """A TrainJob name from a Slurm job name: RFC 1035 label (lowercase, letters/digits/'-'), at most 63."""
    if len(name) <= 63 and RFC1035_LABEL.fullmatch(name):
        return name
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not label:
        return "sbatch-job"
    if not label[0].isalpha():
        label = f"job-{label}"
    return label[:63].rstrip("-")


def _default_name(source: str) -> str:
    """sbatch names a job after its script file (``sbatch`` when read from stdin)."""
    if not source or source.startswith("<") or source == "-":
        return "sbatch"
    return source.rstrip("/").rsplit("/", 1)[-1]


# --- script body ⇄ command ---------------------------------------------------------------------------------

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


# --- request → TrainJob ------------------------------------------------------------------------------------


@cache
def _check_cluster() -> BridgeCluster:
    return builtin_local_cluster()


def _plan_problem(key: str, value: str) -> str | None:
    """What the planner would say about this annotation (None: accepted); keeps the two from drifting."""
    try:
        _backend_options({key: value}, _check_cluster(), "default")
    except InvalidSpec as exc:
        return exc.problem
    return None


def _quantity_mib(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


class _Conversion:
    """The state of one request → TrainJob conversion: annotations, report, options already accounted for."""

    def __init__(self, request: SbatchRequest) -> None:
        self.request = request
        self.annotations: dict[str, str] = {}
        self.report: list[str] = list(request.notes)
        self.handled: set[str] = set()

    def fail(self, option: str, value: object, problem: str) -> InvalidSpec:
        return InvalidSpec(self.request.where(option), value, problem, source=self.request.source)

    def value(self, option: str, parse):
        """The option's value through *parse*, or None when absent; marks the option handled."""
        self.handled.add(option)
        value = self.request.get(option)
        if value is None:
            return None
        try:
            return parse(value)
        except _Bad as exc:
            raise self.fail(option, value, str(exc)) from None

    def annotate(self, option: str, key: str, value: str) -> None:
        problem = _plan_problem(key, value)
        if problem:
            raise self.fail(option, value, f"cannot be carried to Slurm: {problem}")
        self.annotations[key] = value

    def passthrough(self, option: str, value: str | None, why: str = "no TrainJob field",
                    target: str | None = None) -> None:
        """Carry --option verbatim (flags as "true") in ``hpcbridge.io/sbatch.<target or option>``."""
        target = target or option
        key = f"{SBATCH_PASSTHROUGH_PREFIX}{target}"
        self.annotate(option, key, "true" if value is None else value)
        given = self.request.options.get(option)
        if target != option and given is not None:
            shown = given.text()
        else:
            shown = f"--{option}" if value is None else f"--{option}={value}"
        self.report.append(f"{shown}: {why}; passed through verbatim as {key}")

    def exclusive(self, options: Sequence[str], problem: str) -> None:
        present = [name for name in options if name in self.request]
        if len(present) > 1:
            raise self.fail(present[-1], [self.request.options[n].text() for n in present], problem)


def to_trainjob(request: SbatchRequest, script_body: str | None = None, name: str | None = None,
                runtime: str = SBATCH_RUNTIME) -> tuple[TrainJob, list[str]]:
    """A TrainJob that runs *script_body* (default: the request's body) with the request's options.

    Returns the TrainJob and a report with one line per renamed, derived or passed-through option. Raises
    InvalidSpec naming the directive for anything sbatch or hpc-bridge would refuse.
    """
    body = script_body if script_body is not None else request.body
    if body is None:
        raise InvalidSpec("script", None, "no script body to run", source=request.source)
    conv = _Conversion(request)
    conv.exclusive(("mem", "mem-per-cpu", "mem-per-gpu"), "--mem, --mem-per-cpu and --mem-per-gpu are mutually "
                   "exclusive")
    conv.exclusive(("cpus-per-task", "cpus-per-gpu"), "--cpus-per-gpu is mutually exclusive with --cpus-per-task")
    conv.exclusive(("verbose", "quiet"), "don't specify both --verbose (-v) and --quiet (-Q)")

    name = _name(conv, name)
    trainer: dict[str, Any] = {}
    spec: dict[str, Any] = {}

    nodes_min, nodes_fixed = 1, None
    nodes = conv.value("nodes", node_range)
    if nodes is not None:
        nodes_min = trainer["numNodes"] = nodes[0]
        if nodes[1] == nodes[0]:
            nodes_fixed = nodes[0]
        else:
            conv.passthrough("nodes", request.get("nodes"), f"a node range; numNodes is its minimum {nodes[0]}")

    per_node = conv.value("ntasks-per-node", _positive_int)
    ntasks = conv.value("ntasks", _positive_int)
    tasks = per_node if per_node is not None else (-(-ntasks // nodes_min) if ntasks is not None else None)
    if tasks is not None:
        trainer["numProcPerNode"] = tasks
    if ntasks is not None:
        # kept verbatim: with it Slurm reads --ntasks-per-node as a maximum, so the total stays exact
        conv.passthrough("ntasks", request.get("ntasks"),
                         f"a total task count; numProcPerNode {tasks} per node over {nodes_min} node(s)")

    requests: dict[str, str] = {}
    cpus = conv.value("cpus-per-task", _positive_int)
    if cpus is not None:
        requests["cpu"] = str(cpus * (tasks or 1))
    mem = conv.value("mem", size_mb)
    if mem:
        requests["memory"] = _quantity_mib(mem)
    elif mem == 0:
        conv.passthrough("mem", request.get("mem"), "--mem=0 asks for all of a node's memory, not a quantity")
    gpus = _gpus_per_node(conv, nodes_fixed)
    if gpus:
        requests[GPU_RESOURCE] = str(gpus)
    if requests:
        trainer["resourcesPerNode"] = {"requests": requests}

    if "time" in request:
        seconds = conv.value("time", time_seconds)
        if seconds is None:
            conv.passthrough("time", request.get("time"), "no time limit, which is not a deadline")
        else:
            spec["activeDeadlineSeconds"] = seconds
    conv.handled.add("hold")
    if "hold" in request:
        spec["suspend"] = True
        conv.report.append("--hold: the TrainJob is created suspended (spec.suspend: true)")

    for option, knob in _KNOB_OPTIONS.items():
        conv.handled.add(option)
        value = request.get(option)
        if value is None:
            continue
        key = f"{ANNOTATION_PREFIX}{knob}"
        problem = _plan_problem(key, value)
        if problem is None:
            conv.annotations[key] = value
        else:
            conv.passthrough(option, value, f"not accepted as {key} ({problem})")
    conv.handled.add("exclusive")
    if "exclusive" in request:
        value = request.get("exclusive")
        if value is None or value.lower() == "exclusive":
            conv.annotations[f"{ANNOTATION_PREFIX}exclusive"] = "true"
        else:
            conv.passthrough("exclusive", value, "only whole-node --exclusive has an annotation")

    for option, directive in request.options.items():
        if option not in conv.handled:
            conv.passthrough(option, directive.value)

    exec_form = parse_exec_body(body)
    if exec_form is not None:
        # a script that only execs one command (what to_script writes for a plain TrainJob) is that command
        trainer["command"], env = exec_form
        if env:
            trainer["env"] = [{"name": n, "value": v} for n, v in env]
    else:
        trainer["command"] = script_command(body, name)
    spec.update({"runtimeRef": {"name": runtime}, "managedBy": MANAGED_BY_BRIDGE, "trainer": trainer})
    metadata: dict[str, Any] = {"name": name}
    if conv.annotations:
        metadata["annotations"] = dict(sorted(conv.annotations.items()))
    document = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
    try:
        return TrainJob.model_validate(document), conv.report
    except ValidationError as exc:
        raise invalid_from_validation(exc, source=request.source) from None


def _name(conv: _Conversion, name: str | None) -> str:
    conv.handled.add("job-name")
    job_name = conv.request.get("job-name")
    wanted = job_name if job_name is not None else _default_name(conv.request.source)
    label = name if name is not None else dns_label(wanted)
    if name is None and label != wanted:
        conv.report.append(f"job name {wanted!r} is not an RFC 1035 label; the TrainJob is named {label!r}")
    if job_name is not None and job_name != label:
        conv.passthrough("job-name", job_name, "Slurm keeps the original job name (%x in file patterns)")
    return label


def _gpus_per_node(conv: _Conversion, nodes_fixed: int | None) -> int | None:
    """GPUs per node from --gpus-per-node, --gres=gpu… or --gpus; what a count cannot say goes verbatim."""
    request = conv.request
    per_node: int | None = None
    items = conv.value("gpus-per-node", gpu_counts)
    if items is not None:
        per_node = sum(count for _, count in items)
        if len(items) > 1 or items[0][0] is not None:
            conv.passthrough("gpus-per-node", request.get("gpus-per-node"),
                             f"GPU types have no TrainJob field ({GPU_RESOURCE}: {per_node})")
    gres = conv.value("gres", gres_items)
    if gres is not None:
        gpus = [item for item in gres if item.name == "gpu"]
        others = [item for item in gres if item.name != "gpu"]
        if gpus and items is not None:
            raise conv.fail("gres", [request.options[n].text() for n in ("gpus-per-node", "gres")],
                            "give GPUs per node once: --gres=gpu:… or --gpus-per-node")
        if gpus:
            if not all(item.count.isdigit() for item in gpus):
                raise conv.fail("gres", request.get("gres"), "GPU counts are whole numbers")
            per_node = sum(int(item.count) for item in gpus)
            if len(gpus) > 1 or gpus[0].kind is not None:
                # --gres=gpu:type:N is the same request as --gpus-per-node=type:N, the option the renderer
                # writes itself, so sbatch's last-wins rule keeps the type
                typed = ",".join(f"{item.kind}:{item.count}" if item.kind else item.count for item in gpus)
                conv.passthrough("gres", typed, f"GPU types have no TrainJob field ({GPU_RESOURCE}: {per_node}); "
                                 "Slurm's equivalent --gpus-per-node", target="gpus-per-node")
            else:
                conv.report.append(f"--gres=gpu:{per_node}: {GPU_RESOURCE}: {per_node} (Slurm's --gpus-per-node)")
        if others or not gres:
            rest = ",".join(item.text for item in others) if others else request.get("gres")
            conv.passthrough("gres", rest, "generic resources other than GPUs have no TrainJob field")
    total_items = conv.value("gpus", gpu_counts)
    if total_items is not None:
        total = sum(count for _, count in total_items)
        if per_node is None and nodes_fixed is not None and total % nodes_fixed == 0:
            per_node = total // nodes_fixed
            why = f"a job-wide GPU count; {GPU_RESOURCE}: {per_node} per node over {nodes_fixed} node(s)"
        else:
            why = "a job-wide GPU count with no fixed per-node share (no per-node GPU request)"
        conv.passthrough("gpus", request.get("gpus"), why)
    return per_node


def sbatch_runtime() -> ClusterTrainingRuntime:
    """The runtime converted scripts reference (built in): no ML policy, framework label ``sbatch``, so the
    planner runs the body once on the first node, as sbatch does."""
    from bridge.api.catalog import builtin_runtimes

    return next(r for r in builtin_runtimes() if r.name == SBATCH_RUNTIME and isinstance(r, ClusterTrainingRuntime))


# --- TrainJob → script -------------------------------------------------------------------------------------

_PLAIN_DIRECTIVE = re.compile(r"^[^\s\"'\\#]+\Z")
_KNOBS_FOR_SCRIPT = {*_KNOB_OPTIONS.values(), "exclusive"}
#: where a job runs is not part of the job: a script has no place for these, so they are left out
_ROUTING_KNOBS = {"cluster", "migrate-to"}


def directive_arg(option: str, value: str | None, where: str) -> str:
    """``--option[=value]`` as one #SBATCH argument that ``get_argument`` reads back to exactly *value*."""
    if value is None:
        return f"--{option}"
    if any(ord(char) < 0x20 or char == "\x7f" for char in value):
        raise InvalidSpec(where, value, "a #SBATCH value must be one line without control characters")
    if _PLAIN_DIRECTIVE.match(value):
        return f"--{option}={value}"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'--{option}="{escaped}"'


def slurm_time(seconds: int) -> str:
    """Seconds as Slurm's [D-]HH:MM:SS (Slurm itself rounds up to whole minutes)."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def _mem_text(mib: int) -> str:
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


def to_script(trainjob: TrainJob) -> str:
    """A batch script with #SBATCH directives for *trainjob*; ``parse_script`` + ``to_trainjob`` invert it.

    The body is the original script when the command has the shape ``to_trainjob`` gives scripts, else a
    bash script that ``exec``s the command (``shlex.join``), after ``export`` lines for ``trainer.env``.
    Things a batch script cannot say (an image, initializers, runtime patches, ``valueFrom`` env, resources
    other than cpu, memory and nvidia.com/gpu) are errors. Namespace, labels and annotations outside
    ``hpcbridge.io/`` are not part of a script and are left out.
    """
    spec = trainjob.spec
    trainer = spec.trainer
    if trainer is None or not trainer.command:
        raise InvalidSpec("spec.trainer.command", None, "a batch script needs the command in the TrainJob itself")
    for path, value in (("spec.trainer.image", trainer.image), ("spec.initializer", spec.initializer),
                        ("spec.runtimePatches", spec.runtime_patches)):
        if value:
            raise InvalidSpec(path, value if isinstance(value, str) else "…", "a batch script cannot express this; "
                              "use `hpcbridge render --to slurm`, which resolves the runtime")
    env: list[tuple[str, str]] = []
    for index, entry in enumerate(trainer.env or []):
        if entry.value_from is not None or not _EXPORT_NAME.match(entry.name):
            raise InvalidSpec(f"spec.trainer.env[{index}]", entry.name, "a batch script exports plain NAME=value only")
        env.append((entry.name, entry.value or ""))

    annotations = trainjob.metadata.annotations or {}
    extra: dict[str, str] = {}
    knobs: dict[str, str] = {}
    for key, value in annotations.items():
        if key.startswith(SBATCH_PASSTHROUGH_PREFIX):
            option = key[len(SBATCH_PASSTHROUGH_PREFIX):]
            if option not in OPTIONS or option in _REFUSED:
                raise InvalidSpec(f"metadata.annotations[{key}]", value, "not an sbatch option")
            extra[_canonical(option)] = value
        elif key.startswith(ANNOTATION_PREFIX):
            knob = key[len(ANNOTATION_PREFIX):]
            if knob not in _KNOBS_FOR_SCRIPT and knob not in _ROUTING_KNOBS:
                raise InvalidSpec(f"metadata.annotations[{key}]", value, "unknown hpc-bridge annotation")
            knobs[knob] = value

    directives: list[tuple[str, str | None]] = [("job-name", extra.pop("job-name", trainjob.name))]
    nodes = trainer.num_nodes
    nodes_min = nodes or 1
    if "nodes" in extra:
        where = f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}nodes]"
        low = _checked(node_range, extra["nodes"], where)[0]
        if nodes is not None and low != nodes:
            raise InvalidSpec(where, extra["nodes"], f"its minimum disagrees with spec.trainer.numNodes {nodes}")
        nodes_min = low
        directives.append(("nodes", extra.pop("nodes")))
    elif nodes is not None:
        directives.append(("nodes", str(nodes)))
    tasks = trainer.num_proc_per_node
    if tasks is not None:
        ntasks = extra.get("ntasks")
        derived = ntasks is not None and ntasks.isdigit() and -(-int(ntasks) // nodes_min) == tasks
        if not derived:
            directives.append(("ntasks-per-node", str(tasks)))
    requests = _requests(trainer)
    cpu = requests.pop("cpu", None)
    if cpu is not None:
        directives.append(("cpus-per-task", str(max(1, math.ceil(cpu / (tasks or 1))))))
    memory = requests.pop("memory", None)
    if memory is not None:
        directives.append(("mem", _mem_text(max(1, math.ceil(memory / 2**20)))))
    gpus = requests.pop(GPU_RESOURCE, None)
    if requests:
        name = sorted(requests)[0]
        raise InvalidSpec(f"spec.trainer.resourcesPerNode.requests[{name}]", name,
                          f"a batch script has cpu, memory and {GPU_RESOURCE} only")
    if gpus:
        _gpu_directive(int(gpus), extra, nodes, directives)
    if spec.active_deadline_seconds is not None:
        if "time" in extra:
            raise InvalidSpec(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}time]", extra["time"],
                              "disagrees with spec.activeDeadlineSeconds")
        directives.append(("time", slurm_time(spec.active_deadline_seconds)))
    for option, knob in _KNOB_OPTIONS.items():
        if knob in knobs:
            directives.append((option, knobs[knob]))
    if knobs.get("exclusive") == "true":
        directives.append(("exclusive", None))
    if spec.suspend:
        directives.append(("hold", None))
    for option in sorted(extra):
        flag = extra[option] == "true" and OPTIONS[option].has_arg != 1
        directives.append((option, None if flag else extra[option]))

    command = [*trainer.command, *(trainer.args or [])]
    body = command_body(command) if not trainer.args else None
    if body is None:
        body = exec_body(command, env)
    elif env:
        shebang, _, rest = body.partition("\n")
        body = f"{shebang}\n" + "".join(f"export {n}={shlex.quote(v)}\n" for n, v in env) + rest
    lines, _, _ = split_script(body, "spec.trainer.command")
    if lines:
        raise InvalidSpec("spec.trainer.command", body.split("\n")[lines[0][0] - 1],
                          "the script body has #SBATCH lines before its first command; sbatch would read them")
    shebang, newline, rest = body.partition("\n")
    text = [shebang, *(f"#SBATCH {directive_arg(option, value, f'--{option}')}" for option, value in directives)]
    return "\n".join(text) + (newline + rest if newline else "")


def _checked(parse, value: str, where: str):
    try:
        return parse(value)
    except _Bad as exc:
        raise InvalidSpec(where, value, str(exc)) from None


def _requests(trainer) -> dict[str, Fraction]:
    """Per-node requests with limits as the fallback, as the planner and Kubernetes default them."""
    resources = trainer.resources_per_node
    merged: dict[str, Any] = {}
    if resources is not None:
        merged.update(resources.limits or {})
        merged.update(resources.requests or {})
    out: dict[str, Fraction] = {}
    for name, value in merged.items():
        try:
            out[name] = parse_quantity(value)
        except ValueError as exc:
            raise InvalidSpec(f"spec.trainer.resourcesPerNode.requests[{name}]", value, str(exc)) from None
    return out


def _gpu_directive(gpus: int, extra: dict[str, str], nodes: int | None,
                   directives: list[tuple[str, str | None]]) -> None:
    """--gpus-per-node unless a verbatim GPU option already says the same thing."""
    if "gpus-per-node" in extra:
        where = f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}gpus-per-node]"
        if sum(count for _, count in _checked(gpu_counts, extra["gpus-per-node"], where)) != gpus:
            raise InvalidSpec(where, extra["gpus-per-node"], f"disagrees with {GPU_RESOURCE}: {gpus}")
        return
    if "gpus" in extra and nodes is not None:
        items = _checked(gpu_counts, extra["gpus"], f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}gpus]")
        if sum(count for _, count in items) == gpus * nodes:
            return
    directives.append(("gpus-per-node", str(gpus)))


def apply_flags(trainjob: TrainJob, flags: SbatchRequest) -> tuple[TrainJob, list[str]]:
    """sbatch command-line flags laid over a TrainJob, as ``hpcbridge submit job.yaml -N 4 -t 1:00:00`` wants:
    each flag replaces the field it maps to; the command and the runtime stay the TrainJob's own."""
    fragment, report = to_trainjob(flags, script_body="#!/bin/sh\n", name=trainjob.name)
    doc = trainjob.to_wire()
    frag = fragment.to_wire()
    trainer = doc["spec"].setdefault("trainer", {})
    frag_trainer = frag["spec"].get("trainer", {})
    for key in ("numNodes", "numProcPerNode"):
        if key in frag_trainer:
            trainer[key] = frag_trainer[key]
    if "resourcesPerNode" in frag_trainer:
        resources = trainer.setdefault("resourcesPerNode", {})
        for kind, values in frag_trainer["resourcesPerNode"].items():
            resources.setdefault(kind, {}).update(values)
    for key in ("activeDeadlineSeconds", "suspend"):
        if key in frag["spec"]:
            doc["spec"][key] = frag["spec"][key]
    annotations = doc["metadata"].setdefault("annotations", {})
    annotations.update({k: v for k, v in (frag["metadata"].get("annotations") or {}).items()
                        if k.startswith("hpcbridge.io/")})
    if "job-name" in flags:
        doc["metadata"]["name"] = frag["metadata"]["name"]
    return TrainJob.model_validate(doc), report
