"""Slurm hostlist expressions (``node[001-004,010]``): expand and compress exactly as Slurm 22.05 does.

``expand(text)`` returns what ``scontrol show hostnames TEXT`` prints and ``compress(hosts)`` returns what
``scontrol show hostlist h1,h2,...`` prints; ``tests/integration/mpi/test_mpi_hostlist_scontrol.py`` checks
both against the real ``scontrol``. The semantics, read from ``src/common/hostlist.c`` (22.05.8) and
confirmed by experiment:

* Separators are ``,``, space and tab; empty items are skipped. Order is kept and duplicates are kept
  (``n[1-3],n[2-5]`` is 7 hosts); nothing is ever sorted.
* In ``[...]`` each item is ``lo``, ``lo-hi`` or ``lo-`` (= ``lo``); every number is printed zero-padded to
  the width of the *lower* bound as written (``[01-10]`` -> 01..10, ``[1-010]`` -> 1..10).
* Several groups in one name are a cartesian product in Slurm's peculiar order: fastest varies the last
  group, then the first, the second, ...; slowest the second-to-last
  (``a[1-2]b[1-2]c[1-2]`` -> a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ...).
* Rejected by Slurm, and so here: text after the last ``]`` of a name (``gpu-[1-3]-ib``; text *between*
  groups is fine), an empty group or empty item (``[]``, ``[1,,2]``, ``[1,]``), anything but digits and one
  ``-`` in an item (``[a]``, ``[1x2]``, ``[-1]``, ``[1--2]``), a descending range (``[3-1]``), a range of
  more than 65,536 hosts (``[1-65537]``; Slurm's MAX_RANGE - so ``node[1-100000]`` is rejected), more than
  65,536 hosts in a group that is followed by more of the name, ``]]`` or ``[[`` around a group.
* ``compress`` never sorts or de-duplicates: it appends each host to the previous range when it has the
  same prefix, the next number and the same rendering at that range's width (``n9,n10`` -> ``n[9-10]``,
  ``n09,n10,n011`` -> ``n[09-10,011]``, ``n1,n02`` -> ``n[1,02]``, ``n3,n1,n2,n1`` -> ``n[3,1-2,1]``); hosts
  with the same prefix that follow each other share one bracket; hosts without a trailing number stand
  alone (``n1,n2,n,n3`` -> ``n[1-2],n,n3``).

Deliberate deviations: where Slurm *accepts* text but prints hosts that the text does not say, we raise
instead - an unclosed ``[`` (Slurm turns ``node[1-3`` into the host ``node]``), a ``]`` outside a group
(``a]b``), whitespace or a sign inside brackets (``[+2]`` and ``[ 2]`` become ``02``), the control
characters ``\\n \\r \\v \\f \\0`` (Slurm's natural compare skips whitespace and merges ``a\\n1,a2``),
errors in a group before the second-to-last (Slurm silently drops those names), numbers of 2**64-1 and above
(clamped by ``strtoul``; a range ending at 2**64-1 crashes scontrol), more than 262,144 items in one group
(scontrol aborts) and more than 2**31-1 hosts in total (Slurm's int counter overflows).

Round trip: ``expand(compress(hosts)) == list(hosts)`` - same order, same duplicates - whenever no run of
consecutive hosts in ``hosts`` is longer than 65,536 (compress, like scontrol, prints longer runs as one
range that expand, like scontrol, then rejects).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import chain, product, repeat, starmap
from operator import add, eq, gt, itemgetter, sub
from typing import NamedTuple

from bridge.errors import InvalidSpec

__all__ = ["MAX_RANGE", "HostlistError", "compress", "expand"]

#: hosts in one ``lo-hi`` range (hostlist.c MAX_RANGE)
MAX_RANGE = 64 * 1024
#: hosts in a bracket group that more of the name follows (hostlist.h MAX_PREFIX_CNT)
MAX_PREFIX_HOSTS = 64 * 1024
#: items between one pair of brackets (hostlist.c MAX_RANGES; scontrol aborts beyond it)
MAX_ITEMS = 256 * 1024
#: hosts in one hostlist (Slurm counts them in an int)
MAX_HOSTS = 2**31 - 1
#: largest number in a name; Slurm keeps numbers in an unsigned long and ULONG_MAX ends its iteration
MAX_NUMBER = 2**64 - 2

_DIGITS = "0123456789"
# "\n" never occurs in a valid name, so it can separate hosts in one big string that is split once at
# the end: creating the 100k result strings in C is what keeps expand within its time budget.
_SEP = "\n"
# What Slurm's tokenizer splits on; any other whitespace or NUL is rejected (see module docstring).
_SEPARATORS = ", \t"
_BAD_NAME_CHARS = ",\t\n\r\v\f\x00 []"
# A name is a run of name characters and complete [...] groups; what lies between names must be separators.
_TOKEN_RE = re.compile(r"(?:[^,\t\n\r\v\f\x00 \[\]]+|\[[^\[\]]*\])+")
_GAP_RE = re.compile(r"[, \t]*")
_GROUP_RE = re.compile(r"\[([^\[\]]*)\]")
_ITEMS_RE = re.compile(r"[0-9]+(?:-[0-9]*)?(?:,[0-9]+(?:-[0-9]*)?)*")
_ITEM_RE = re.compile(r"([0-9]+)(?:-([0-9]*))?")
_BAD_PLAIN_CHARS = "\n\r\v\f\x00[]"
_BAD_PLAIN_RE = re.compile(r"[\n\r\v\f\x00\[\]]")
_SPLIT_RE = re.compile(r"[, \t]+")
# Trailing numbers long enough to possibly exceed MAX_NUMBER (20 digits); checked exactly when seen.
_LONG_NUMBER_RE = re.compile(r"[0-9]{20,}(?=[, \t\n]|\Z)")
_BAD_HOST_CHARS = ", \t\r\v\f\x00[]"
# Three-digit tails: a range renders as head + tail per block of 1000 without formatting every number.
_TAILS = tuple(f"{i:03d}" for i in range(1000))
# Ranges shorter than this are formatted number by number in one %-operation; longer ones block-wise.
_BLOCKWISE_MIN = 64
# compress looks ahead for a long range once this many hosts in a row have joined it one by one ...
_LOOKAHEAD_AFTER = 32
# ... comparing this many hosts at first, twice as many each time the whole window matched.
_LOOKAHEAD_WINDOW = 128


class HostlistError(InvalidSpec):
    """A hostlist Slurm rejects (or silently mangles): one line naming the 0-based position and the fault."""

    def __init__(self, value: object, position: int, reason: str, note: str = "") -> None:
        #: 0-based character offset of the fault (in the host name, for compress)
        self.position = position
        #: what is wrong, without the position: stable enough for callers and tests to match on
        self.reason = reason
        InvalidSpec.__init__(self, "hostlist", value, f"{reason} at position {position}{note}")


# ---------------------------------------------------------------------------------------------------
# expand


class _Group(NamedTuple):
    """One ``[...]``: its host count and either the item texts (all single numbers) or its ranges."""

    hosts: int
    texts: list[str] | None  # every item a single number: the hosts' digits are the items as written
    los: list[int]
    his: list[int]
    widths: list[int]  # zero-pad width of each range: the length of its lower bound as written
    longest: int  # hosts in the longest range, minus one


def expand(hostlist: str) -> list[str]:
    """The hosts of a Slurm hostlist expression, in ``scontrol show hostnames`` order, duplicates kept."""
    if not isinstance(hostlist, str):
        raise TypeError(f"expand() takes a str, not {type(hostlist).__name__}")
    if "[" not in hostlist and "]" not in hostlist:
        return _expand_plain(hostlist)
    chunks: list[str] = []
    total = 0
    pos = 0
    for match in _TOKEN_RE.finditer(hostlist):
        start = match.start()
        if start != pos and _GAP_RE.fullmatch(hostlist, pos, start) is None:
            _gap_error(hostlist, pos, start)
        pos = match.end()
        if pos < len(hostlist) and hostlist[pos] not in _SEPARATORS:
            _gap_error(hostlist, pos, pos + 1)  # an unclosed '[' (or a stray ']') right after the name
        token = match.group()
        if "[" not in token:
            _check_plain_number(hostlist, start, token)
            chunks.append(token)
            total += 1
        else:
            total += _expand_bracketed(hostlist, start, token, chunks)
        if total > MAX_HOSTS:
            raise HostlistError(
                hostlist, start, f"more than {MAX_HOSTS} hosts", "; Slurm counts them in an int"
            )
    if pos != len(hostlist) and _GAP_RE.fullmatch(hostlist, pos) is None:
        _gap_error(hostlist, pos, len(hostlist))
    if not chunks:
        return []
    return _SEP.join(chunks).split(_SEP)


def _expand_plain(hostlist: str) -> list[str]:
    """Names without brackets: the common ``a,b,c`` case, split in C."""
    if any(char in hostlist for char in _BAD_PLAIN_CHARS):
        bad = _BAD_PLAIN_RE.search(hostlist)
        assert bad is not None
        _gap_error(hostlist, bad.start(), bad.start() + 1)
    if " " in hostlist or "\t" in hostlist:
        names = _SPLIT_RE.split(hostlist)
    else:
        names = hostlist.split(",")
    if "" in names:
        names = [name for name in names if name]
    if names and max(map(len, names)) >= 20 and any(map(_number_too_large, names)):
        for long_number in _LONG_NUMBER_RE.finditer(hostlist):
            if int(long_number.group()) > MAX_NUMBER:
                raise HostlistError(hostlist, long_number.start(), "number too large", f"; max {MAX_NUMBER}")
    return names


def _number_too_large(name: str) -> bool:
    """Whether the name's trailing number exceeds MAX_NUMBER (only names of 20+ characters can)."""
    if len(name) < 20:
        return False
    digits = len(name) - len(name.rstrip(_DIGITS))
    return digits >= 20 and int(name[-digits:]) > MAX_NUMBER


def _gap_error(hostlist: str, start: int, end: int) -> None:
    """Explain the first character between names that is not a separator."""
    for position in range(start, end):
        char = hostlist[position]
        if char in _SEPARATORS:
            continue
        if char == "[":
            raise HostlistError(hostlist, position, "unbalanced '['")
        if char == "]":
            raise HostlistError(hostlist, position, "unbalanced ']'")
        raise HostlistError(hostlist, position, f"invalid character {char!r}")
    raise AssertionError("no fault in the gap")  # pragma: no cover - callers only pass faulty gaps


def _check_plain_number(hostlist: str, start: int, name: str) -> None:
    if _number_too_large(name):
        position = start + len(name.rstrip(_DIGITS))
        raise HostlistError(hostlist, position, "number too large", f"; max {MAX_NUMBER}")


def _expand_bracketed(hostlist: str, start: int, token: str, chunks: list[str]) -> int:
    """Append the hosts of one name with bracket groups to ``chunks``; return how many."""
    matches = list(_GROUP_RE.finditer(token))
    last = matches[-1]
    if last.end() != len(token):
        raise HostlistError(
            hostlist,
            start + last.end(),
            "text after ']'",
            "; Slurm 22.05 allows text only between bracket groups",
        )
    literals = [token[: matches[0].start()]]
    literals += [token[a.end() : b.start()] for a, b in zip(matches, matches[1:], strict=False)]
    groups = [_parse_group(hostlist, start + m.start(1), m.group(1)) for m in matches]
    count = 1
    for index, group in enumerate(groups[:-1]):
        if group.hosts > MAX_PREFIX_HOSTS:
            raise HostlistError(
                hostlist,
                start + matches[index].start(),
                f"too many hosts ({group.hosts}) in a bracket group followed by more name",
                f"; Slurm allows {MAX_PREFIX_HOSTS}",
            )
        count *= group.hosts
    count *= groups[-1].hosts
    if count > MAX_HOSTS:
        raise HostlistError(hostlist, start, f"more than {MAX_HOSTS} hosts", "; Slurm counts them in an int")
    if len(groups) == 1:
        chunks.append(_render(literals[0], groups[0]))
        return count
    # Slurm recurses from the second-to-last group leftwards: fastest varies the last group, then the
    # first, the second, ...; slowest the second-to-last (checked against scontrol).
    numbers = [_numbers(group) for group in groups[:-1]]
    escaped = [literal.replace("{", "{{").replace("}", "}}") for literal in literals]
    template = "".join(
        f"{literal}{{{len(numbers) - 1 - index}}}" for index, literal in enumerate(escaped[:-1])
    )
    template += escaped[-1]
    tails = _render("", groups[-1]).split(_SEP)
    for prefix in starmap(template.format, product(*reversed(numbers))):
        chunks.append(prefix + (_SEP + prefix).join(tails))
    return count


def _parse_group(hostlist: str, offset: int, content: str) -> _Group:
    """Check and parse the items between one pair of brackets (``content`` starts at ``offset``)."""
    if _ITEMS_RE.fullmatch(content) is None:
        _item_syntax_error(hostlist, offset, content)
    if "-" not in content:
        # Only single numbers: each host's digits are the item exactly as written.
        texts = content.split(",")
        _check_item_count(hostlist, offset, len(texts))
        if max(map(len, texts)) >= 20 and max(map(int, texts)) > MAX_NUMBER:
            _item_value_error(hostlist, offset, content)
        return _Group(len(texts), texts, [], [], [], 0)
    if content[-1] == "-" or "-," in content:
        # Some item is "lo-" (Slurm reads it as "lo"): the general, slower parse.
        pairs = _ITEM_RE.findall(content)
        lo_texts = [lo for lo, _ in pairs]
        hi_texts = [hi or lo for lo, hi in pairs]
    else:
        # Split in C: an item's lower bound is before its '-', its upper bound after it (or the item).
        items = content.split(",")
        lo_texts = list(map(itemgetter(0), map(str.partition, items, repeat("-"))))
        hi_texts = list(map(itemgetter(2), map(str.rpartition, items, repeat("-"))))
    _check_item_count(hostlist, offset, len(lo_texts))
    los = list(map(int, lo_texts))
    his = list(map(int, hi_texts))
    longest = max(map(sub, his, los))
    if longest >= MAX_RANGE or any(map(gt, los, his)) or max(his) > MAX_NUMBER:
        _item_value_error(hostlist, offset, content)
    return _Group(sum(his) - sum(los) + len(los), None, los, his, list(map(len, lo_texts)), longest)


def _check_item_count(hostlist: str, offset: int, items: int) -> None:
    if items > MAX_ITEMS:
        raise HostlistError(
            hostlist,
            offset - 1,
            f"too many items ({items}) in one bracket group",
            f"; Slurm allows {MAX_ITEMS}",
        )


def _item_syntax_error(hostlist: str, offset: int, content: str) -> None:
    position = offset
    for item in content.split(","):
        if not item:
            raise HostlistError(hostlist, position, "empty range in brackets")
        if item[0] == "-":
            raise HostlistError(hostlist, position, "range without a lower bound")
        dash_seen = False
        for index, char in enumerate(item):
            if char == "-" and not dash_seen:
                dash_seen = True
            elif char not in _DIGITS:
                raise HostlistError(hostlist, position + index, f"invalid character {char!r} in a range")
        position += len(item) + 1
    raise AssertionError("no fault in the group")  # pragma: no cover


def _item_value_error(hostlist: str, offset: int, content: str) -> None:
    for item in _ITEM_RE.finditer(content):
        lo = int(item.group(1))
        hi = int(item.group(2)) if item.group(2) else lo
        where = offset + item.start()
        if max(lo, hi) > MAX_NUMBER:
            raise HostlistError(hostlist, where, "number too large", f"; max {MAX_NUMBER}")
        if lo > hi:
            raise HostlistError(hostlist, where, f"descending range '{item.group()}'")
        if hi - lo + 1 > MAX_RANGE:
            raise HostlistError(
                hostlist,
                where,
                f"too many hosts ({hi - lo + 1}) in range '{item.group()}'",
                f"; Slurm allows {MAX_RANGE}",
            )
    raise AssertionError("no faulty range")  # pragma: no cover


def _numbers(group: _Group) -> list[str]:
    """The zero-padded numbers of a group that more of the name follows (at most 65,536 of them)."""
    if group.texts is not None:
        return group.texts
    return [
        f"{n:0{w}d}"
        for lo, hi, w in zip(group.los, group.his, group.widths, strict=True)
        for n in range(lo, hi + 1)
    ]


def _render(prefix: str, group: _Group) -> str:
    """``prefix`` + every number of a group, joined by _SEP."""
    if group.texts is not None:
        return prefix + (_SEP + prefix).join(group.texts)
    los, his, widths = group.los, group.his, group.widths
    if group.longest < _BLOCKWISE_MIN and len(set(widths)) == 1:
        # Many short ranges (the fragmented case): one %-format over all numbers, no per-range work.
        return _format_numbers(
            prefix, widths[0], tuple(chain.from_iterable(map(range, los, map(add, his, repeat(1)))))
        )
    parts: list[str] = []
    short: list[int] = []
    short_width = 0
    for lo, hi, width in zip(los, his, widths, strict=True):
        if hi - lo < _BLOCKWISE_MIN:
            if short and width != short_width:
                parts.append(_format_numbers(prefix, short_width, tuple(short)))
                short = []
            short.extend(range(lo, hi + 1))
            short_width = width
            continue
        if short:
            parts.append(_format_numbers(prefix, short_width, tuple(short)))
            short = []
        parts.append(_render_run(prefix, lo, hi, width))
    if short:
        parts.append(_format_numbers(prefix, short_width, tuple(short)))
    return _SEP.join(parts)


def _format_numbers(prefix: str, width: int, numbers: tuple[int, ...]) -> str:
    template = _SEP + prefix.replace("%", "%%") + f"%0{width}d"
    return (template * len(numbers) % numbers)[1:]


def _render_run(prefix: str, lo: int, hi: int, width: int) -> str:
    """A long range as blocks of 1000: ``head + tail`` joined in C instead of formatting every number."""
    parts: list[str] = []
    if lo < 1000 and width < 4:
        # Below 1000 a narrow number is not "head + 3-digit tail" ("7", not "0007"); format those few.
        top = min(hi, 999)
        parts.append(_format_numbers(prefix, width, tuple(range(lo, top + 1))))
        if top == hi:
            return parts[0]
        lo = top + 1
    head_width = max(width - 3, 1)
    first_block, first_tail = divmod(lo, 1000)
    last_block, last_tail = divmod(hi, 1000)
    for block in range(first_block, last_block + 1):
        head = f"{prefix}{block:0{head_width}d}"
        tails = _TAILS[
            (first_tail if block == first_block else 0) : (last_tail + 1 if block == last_block else 1000)
        ]
        parts.append(head + (_SEP + head).join(tails))
    return _SEP.join(parts)


# ---------------------------------------------------------------------------------------------------
# compress


def compress(hosts: Iterable[str]) -> str:
    """The hostlist expression ``scontrol show hostlist`` prints for these hosts (order, duplicates kept)."""
    if isinstance(hosts, str):
        raise TypeError("compress() takes an iterable of host names, not one str")
    names = hosts if isinstance(hosts, list) else list(hosts)
    if not names:
        return ""
    _check_names(names)
    digits = _DIGITS
    out: list[str] = []
    texts: list[str] = []  # finished ranges of the open bracket group
    group: str | None = None  # prefix of the open group; None when no group is open
    first = ""  # digits of the open range's first host
    last = ""  # the open range's last host, if it has more than one
    previous = width = 0  # the open range's last number and zero-pad width
    # The name that would extend the open range ("" while it has one host): most hosts are checked with
    # one comparison instead of being parsed. It is head + _TAILS[tail] when tail >= 0.
    expected = ""
    head = ""
    tail = -1
    streak = 0  # hosts that extended the open range one by one since the last look-ahead
    index = 0
    count = len(names)
    while index < count:
        name = names[index]
        index += 1
        if name == expected:
            previous += 1
            last = name
            streak += 1
            if streak == _LOOKAHEAD_AFTER:
                # Probably a long range: compare the next hosts in C rather than one by one.
                streak = 0
                assert group is not None
                taken = _run_length(names, index, group, previous + 1, width)
                if taken:
                    index += taken
                    previous += taken
                    last = names[index - 1]
                expected, head, tail = _next_name(group, previous + 1, width)
            elif 0 <= tail < 999:
                tail += 1
                expected = head + _TAILS[tail]
            else:
                assert group is not None  # a name matched *expected*: a group is open
                expected, head, tail = _next_name(group, previous + 1, width)
            continue
        prefix = name.rstrip(digits)
        cut = len(prefix)
        if cut == len(name):
            # No trailing number: Slurm keeps the name as a host of its own, never bracketed.
            if group is not None:
                out.append(_close_group(group, texts, first, last))
                group, expected = None, ""
            out.append(name)
            continue
        number_text = name[cut:]
        number = int(number_text)
        if prefix == group:
            # Slurm joins the host to the range if it is the next number and renders the same at the
            # range's width: n9,n10 -> n[9-10] but n09,n010 -> n[09,010]. (Past the second host of a
            # range, such a host equals `expected` and never gets here.)
            if number == previous + 1 and (
                (size := len(number_text)) == width or (size > width and number_text[0] != "0")
            ):
                previous = number
                last = name
                streak = 1
                tail = (number + 1) % 1000
                if size >= 4 and tail:
                    head = name[:-3]  # the next name differs in the last three digits only
                    expected = head + _TAILS[tail]
                else:
                    expected, head, tail = _next_name(prefix, number + 1, width)
                continue
            texts.append(f"{first}-{last[cut:]}" if last else first)
        else:
            if group is not None:
                out.append(_close_group(group, texts, first, last))
            group = prefix
            texts = []
        first, last, previous, width, expected = number_text, "", number, len(number_text), ""
    if group is not None:
        out.append(_close_group(group, texts, first, last))
    return ",".join(out)


def _next_name(prefix: str, number: int, width: int) -> tuple[str, str, int]:
    """The host ``number`` of a range as (name, head, tail) with name == head + _TAILS[tail], or tail -1."""
    if number < 1000 and width < 4:
        return f"{prefix}{number:0{width}d}", "", -1  # "7" is not head + 3-digit tail
    block, tail = divmod(number, 1000)
    head = f"{prefix}{block:0{max(width - 3, 1)}d}"
    return head + _TAILS[tail], head, tail


def _range_text(prefix: str, first: str, last: str) -> str:
    return f"{first}-{last[len(prefix) :]}" if last else first


def _run_length(names: list[str], start: int, prefix: str, number: int, width: int) -> int:
    """How many of ``names[start:]`` continue a range at ``number`` (the host-by-host loop's fast path).

    Probing single hosts (is the k-th one the expected name?) finds the likely end cheaply; the hosts up to
    it are then compared in C, in doubling windows so that a break found late costs no more than the run.
    """
    available = min(len(names) - start, MAX_NUMBER + 1 - number)  # names were checked: none beyond

    def fits(k: int) -> bool:  # is the k-th host (1-based) the one the range expects there?
        return names[start + k - 1] == f"{prefix}{number + k - 1:0{width}d}"

    good, bad = 0, _LOOKAHEAD_WINDOW
    while bad <= available and fits(bad):
        good, bad = bad, bad * 2
    bad = min(bad, available + 1)
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    checked = 0
    window = _LOOKAHEAD_WINDOW
    while checked < good:
        stop = min(checked + window, good)
        expected = _render_run(prefix, number + checked, number + stop - 1, width)
        if _SEP.join(names[start + checked : start + stop]) != expected:
            # A host in between breaks the range although a later one fits: stop at that host.
            matches = list(map(eq, names[start + checked : start + stop], expected.split(_SEP)))
            return checked + matches.index(False)
        checked = stop
        window *= 2
    return good


def _close_group(prefix: str, texts: list[str], first: str, last: str) -> str:
    if not texts and not last:
        return prefix + first  # a single host: no brackets
    texts.append(_range_text(prefix, first, last))
    return f"{prefix}[{','.join(texts)}]"


def _check_names(names: list[str]) -> None:
    """Reject names that cannot round-trip through a hostlist (checked in bulk, explained one by one)."""
    joined = _SEP.join(names)  # TypeError names the first non-str item
    if joined.count(_SEP) != len(names) - 1 or "" in names or any(char in joined for char in _BAD_HOST_CHARS):
        for index, name in enumerate(names):
            if not name:
                raise HostlistError(name, 0, "empty host name", f" of host #{index}")
            for position, char in enumerate(name):
                if char in _BAD_NAME_CHARS:
                    raise HostlistError(name, position, f"invalid character {char!r}", f" of host #{index}")
    if max(map(len, names)) >= 20 and any(map(_number_too_large, names)):
        index = next(index for index, name in enumerate(names) if _number_too_large(name))
        name = names[index]
        position = len(name.rstrip(_DIGITS))
        raise HostlistError(name, position, "number too large", f" of host #{index}; max {MAX_NUMBER}")
