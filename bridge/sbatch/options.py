"""sbatch 22.05's options: the option table ``getopt_long`` reads with, the options that share a setting, the
ones hpc-bridge refuses, and what each option's value may be.

Every value is checked as sbatch would check it (``check_option``), so a request that parses is one sbatch
accepts; an ``hpcbridge.io/sbatch.<option>`` annotation is held to the same checks (``check_passthrough``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.errors import InvalidSpec
from bridge.sbatch.values import (
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
from bridge.shell import SHELL_ENV_NAME

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
class Option:
    """One entry of sbatch's option table: long name, argument (0 none, 1 required, 2 optional), short letter."""

    name: str
    has_arg: int
    short: str | None


def _load_table(text: str) -> dict[str, Option]:
    table: dict[str, Option] = {}
    for entry in text.replace("\n", "").split("|"):
        parts = entry.split()
        table[parts[0]] = Option(parts[0], int(parts[1]), parts[2] if len(parts) > 2 else None)
    return table


OPTIONS: Mapping[str, Option] = _load_table(_TABLE)
SHORT_OPTIONS: Mapping[str, Option] = {opt.short: opt for opt in OPTIONS.values() if opt.short}
#: getopt entries that share one option value in Slurm (same setter): an abbreviation matching both is fine
_ALIASES = {"tasks-per-node": "ntasks-per-node"}
#: options that set the same thing in Slurm; the last one given wins, so only it is kept
OVERRIDE_GROUPS = ({"requeue", "no-requeue"}, {"exclusive", "oversubscribe"}, {"nodelist", "nodefile"},
                   {"cluster", "clusters"})
#: options that make no sense in a job hpc-bridge submits (they change what sbatch itself does or prints)
REFUSED: Mapping[str, str] = {
    "help": "prints sbatch's help instead of submitting",
    "usage": "prints sbatch's usage instead of submitting",
    "version": "prints sbatch's version instead of submitting",
    "test-only": "makes sbatch only estimate a start time, never submit",
    "wrap": "replaces the script with a command; give the command as the script body instead",
    "parsable": "changes the output of sbatch that hpc-bridge reads",
}


def canonical(name: str) -> str:
    """The name an option is kept under: getopt aliases (``--tasks-per-node``) become the option they set."""
    return _ALIASES.get(name, name)


def long_option(name: str, where: str, source: str | None) -> Option:
    """The option ``--name`` stands for, by its full name or a unique abbreviation, as ``getopt_long`` finds it."""
    if name in OPTIONS:
        return OPTIONS[name]
    matches = [opt for opt in OPTIONS.values() if opt.name.startswith(name)]
    if not matches:
        raise InvalidSpec(where, f"--{name}", "unknown sbatch option", source=source)
    distinct = {(canonical(opt.name), opt.has_arg) for opt in matches}
    if len(distinct) > 1:
        names = ", ".join(f"--{opt.name}" for opt in matches[:6])
        raise InvalidSpec(where, f"--{name}", f"ambiguous abbreviation ({names})", source=source)
    return matches[0]


# --- option values ------------------------------------------------------------------------------------

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


def check_option(option: str, value: str | None, where: str, source: str | None) -> None:
    """Refuse an option hpc-bridge does not submit (``REFUSED``) or a value sbatch would not take."""
    if option in REFUSED:
        text = f"--{option}" if value is None else f"--{option}={value}"
        raise InvalidSpec(where, text, REFUSED[option], source=source)
    if value is None:
        return
    if value == "" or not value.strip():
        raise InvalidSpec(where, value, "empty value", source=source)
    if _CONTROL.search(value):
        # hpc-bridge writes every value back into a one-line #SBATCH directive
        raise InvalidSpec(where, value, "control characters (newline, tab, …) are not allowed in a value",
                          source=source)
    check = _CHECKS.get(option)
    if check is None:
        return
    try:
        check(value)
    except BadValue as exc:
        raise InvalidSpec(where, value, str(exc), source=source) from None


def check_passthrough(option: str, value: str, where: str) -> None:
    """Refuse what an ``hpcbridge.io/sbatch.<option>: value`` annotation may not say: an option sbatch does not
    have (by its full name: ``getopt_long`` would read an abbreviation such as ``ui`` as ``--uid``), one that
    changes what sbatch itself does (``--wrap``, ``--test-only``…), a value on a flag, or a value sbatch would
    refuse. Privileged options (``--uid``…) are the planner's to refuse, against the target cluster."""
    known = OPTIONS.get(option)
    if known is None:
        raise InvalidSpec(where, option, "not an sbatch option (give its full long name, e.g. sbatch.requeue)")
    if option in REFUSED:
        raise InvalidSpec(where, option, REFUSED[option])
    if known.has_arg == 0 and value != "true":
        raise InvalidSpec(where, value, f"--{option} takes no value; write \"true\" to pass the flag")
    check_option(option, passthrough_value(option, value), where, None)


def passthrough_value(option: str, value: str) -> str | None:
    """What to write for a verbatim ``hpcbridge.io/sbatch.<option>: value`` annotation: *value*, or None (a bare
    ``--option``) for the ``"true"`` that stands for a flag, on an option that takes no value or an optional one."""
    known = OPTIONS.get(option)
    return None if value == "true" and known is not None and known.has_arg != 1 else value
