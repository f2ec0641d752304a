"""Slurm's value grammars, as sbatch 22.05 reads them: time limits, sizes, node counts, GPU counts, GRES lists,
job arrays.

The option checks (``bridge.sbatch.options``), the planner and the conversion to a TrainJob
(``bridge.convert.sbatch.mapping``) read values through these functions, so a value means the same thing to each.
``slurm_time`` writes what ``time_seconds`` reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class BadValue(Exception):
    """A value that does not fit its grammar; whoever reads the value turns it into an InvalidSpec that names
    where the value came from."""


#: Slurm's largest MaxArraySize is 4,000,001, so no array index is above 4,000,000
MAX_ARRAY_INDEX = 4_000_000
_ARRAY_SPEC = re.compile(r"^[0-9]+(-[0-9]+)?(:[0-9]+)?(,[0-9]+(-[0-9]+)?(:[0-9]+)?)*(%[0-9]+)?$")


def array_problem(value: str) -> str | None:
    """What is wrong with a Slurm job array spec (None: nothing): the grammar, and every index, step and
    limit within MAX_ARRAY_INDEX, so no value needs more than a few digits to hold."""
    if len(value) > 1024 or not _ARRAY_SPEC.fullmatch(value):
        return "not a job array spec like 0-15, 1,3,5-7:2 or 0-99%10"
    body, _, limit = value.partition("%")
    numbers = re.findall(r"[0-9]+", value)
    if any(len(n) > 7 or int(n) > MAX_ARRAY_INDEX for n in numbers):
        return f"array indexes, steps and limits are at most {MAX_ARRAY_INDEX} (Slurm's largest MaxArraySize - 1)"
    for item in body.split(","):
        span, _, step = item.partition(":")
        low, _, high = span.partition("-")
        if high and int(high) < int(low):
            return f"range {span} ends before it starts"
        if step and int(step) < 1:
            return "an array step is at least 1"
    if limit and int(limit) < 1:
        return "the limit after % is at least 1"
    return None


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
        raise BadValue("not a Slurm time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, "
                   "days-hours:minutes, days-hours:minutes:seconds or UNLIMITED")
    if "-" in value:
        days_text, _, clock = value.partition("-")
        if not days_text:
            raise BadValue("a time limit cannot be negative")
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
        raise BadValue("time limit too long")
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
        raise BadValue("not a size: a number with an optional K, M, G or T suffix (default M)")
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
            raise BadValue("not a node count: N or min-max")
        number = int(match.group(1))
        return number * (1024 if match.group(2) else 1) * (1024 * 1024 if match.group(3) else 1)

    low_text, dash, high_text = value.partition("-")
    if not dash:
        low = count(low_text)
        if low < 1:
            raise BadValue("a job needs at least one node")
        return low, low
    low = max(count(low_text), 1) if low_text else 1
    if not high_text:
        raise BadValue("a node range needs its maximum: min-max")
    high = count(high_text)
    if high < low:
        raise BadValue(f"maximum node count {high} is less than minimum {low}")
    return low, high


_GPU_ITEM = re.compile(r"^(?:([A-Za-z0-9_.-]+):)?([0-9]+)\Z")


def gpu_counts(value: str) -> list[tuple[str | None, int]]:
    """``[type:]count[,[type:]count…]`` as in --gpus, --gpus-per-node, --gpus-per-task."""
    items = []
    for part in value.split(","):
        match = _GPU_ITEM.match(part)
        if not match:
            raise BadValue("not a GPU count: N or type:N (comma-separated for several types)")
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
            raise BadValue("not a GRES list: name[[:type]:count][,…], e.g. gpu:2 or gpu:a100:4")
        name, kind, count = pieces[0], None, "1"
        if len(pieces) == 3:
            kind, count = pieces[1], pieces[2]
        elif len(pieces) == 2:
            if _GRES_COUNT.match(pieces[1]):
                count = pieces[1]
            else:
                kind = pieces[1]
        if not _GRES_COUNT.match(count):
            raise BadValue("not a GRES list: name[[:type]:count][,…], e.g. gpu:2 or gpu:a100:4")
        items.append(GresItem(part, name, kind, count))
    return items


def positive_int(value: str) -> int:
    if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
        raise BadValue("must be a positive whole number")
    return int(value)


def non_negative_int(value: str) -> int:
    if not re.fullmatch(r"[0-9]+", value):
        raise BadValue("must be a whole number")
    return int(value)


def slurm_time(seconds: int) -> str:
    """Seconds as Slurm's [D-]HH:MM:SS (Slurm itself rounds up to whole minutes)."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock

