"""bridge.mpi.hostlist: Slurm 22.05 hostlist semantics, pinned case by case (no scontrol needed).

The expected values are what scontrol 22.05.8 printed for these inputs (or, for MANGLED, what it should
have refused); tests/integration/mpi/test_mpi_hostlist_scontrol.py checks such forms against the real
scontrol and fuzzes beyond them.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.errors import BridgeError, InvalidSpec
from bridge.mpi.hostlist import MAX_RANGE, HostlistError, compress, expand

# ---------------------------------------------------------------------------------------------------
# expand

EXPAND = [
    ("n[1-3],n[2-5]", ["n1", "n2", "n3", "n2", "n3", "n4", "n5"]),  # duplicates kept, order kept
    ("node[001-004,010]", ["node001", "node002", "node003", "node004", "node010"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("[1-3,7,09-11]", ["1", "2", "3", "7", "09", "10", "11"]),
    ("n[1,3,5-7,2]", ["n1", "n3", "n5", "n6", "n7", "n2"]),
    ("n[001-3]", ["n001", "n002", "n003"]),  # the lower bound's width pads the whole range
    ("n[1-010]", ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"]),
    ("n[98-101]", ["n98", "n99", "n100", "n101"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[1-]", ["n1"]),  # Slurm reads "lo-" as "lo"
    ("n[1-1]", ["n1"]),
    ("n[00]", ["n00"]),
    ("x1[2-3]", ["x12", "x13"]),
    ("n[1-2]-[3]", ["n1-3", "n2-3"]),  # text between groups is fine
    ("a[1-2][3-4]", ["a13", "a14", "a23", "a24"]),
    (",n[1-2],,m,", ["n1", "n2", "m"]),
    ("a b\tc", ["a", "b", "c"]),  # blank and tab separate like ','
    ("n[1,2]", ["n1", "n2"]),
    ("n007,n7", ["n007", "n7"]),
    ("a{1}[1-2]x%d[3]", ["a{1}1x%d3", "a{1}2x%d3"]),
    ("n18446744073709551614", ["n18446744073709551614"]),
    ("", []),
    (" , ,", []),
]


@pytest.mark.parametrize(("text", "hosts"), EXPAND)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


def test_several_groups_are_a_product_in_slurms_order() -> None:
    # Fastest the last group, then the first, the second, ...; slowest the second-to-last.
    assert expand("rack[1-2]n[01-03]") == [f"rack{r}n0{n}" for r in (1, 2) for n in (1, 2, 3)]
    assert expand("a[1-2]b[1-2]c[1-2]") == [
        "a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2",
    ]  # fmt: skip
    four = expand("a[1-2]b[1-2]c[1-2]d[1-2]")
    assert four[:4] == ["a1b1c1d1", "a1b1c1d2", "a2b1c1d1", "a2b1c1d2"]
    assert four[4:8] == ["a1b2c1d1", "a1b2c1d2", "a2b2c1d1", "a2b2c1d2"]
    assert four[8] == "a1b1c2d1" and len(four) == 16


def test_expand_long_ranges_render_across_thousands_and_widths() -> None:
    assert expand("n[5-2000]") == [f"n{i}" for i in range(5, 2001)]
    assert expand("n[0005-2000]") == [f"n{i:04d}" for i in range(5, 2001)]
    assert expand("n[00-1500]") == [f"n{i:02d}" for i in range(0, 1501)]
    assert expand("n[99998-100002]") == ["n99998", "n99999", "n100000", "n100001", "n100002"]
    assert expand("n%[0990-1010,7]") == [f"n%{i:04d}" for i in range(990, 1011)] + ["n%7"]
    mixed = expand("n[1-100,0200-0299,7,08]")
    assert mixed == [f"n{i}" for i in range(1, 101)] + [f"n{i:04d}" for i in range(200, 300)] + ["n7", "n08"]


def test_expand_limits_are_slurms() -> None:
    assert len(expand(f"n[1-{MAX_RANGE}]")) == MAX_RANGE
    assert len(expand("a[1-40000,40001-65536]b[1]")) == 65536
    assert len(expand("a[1-2]b[1-40000,1-40000]")) == 160000  # only groups followed by more name are capped


def test_expand_100k_hosts() -> None:
    hosts = expand("node[000001-050000,050001-100000]")
    assert hosts == [f"node{i:06d}" for i in range(1, 100001)]
    fragmented = [f"node{i:06d}" for i in range(1, 150001) if i % 3]
    text = "node[" + ",".join(f"{i:06d}-{i + 1:06d}" for i in range(1, 150001, 3)) + "]"
    assert expand(text) == fragmented
    assert expand(",".join(fragmented)) == fragmented
    assert expand("node[" + ",".join(f"{i:06d}" for i in range(0, 200000, 2)) + "]") == [
        f"node{i:06d}" for i in range(0, 200000, 2)
    ]


# (text, position, what the message says): Slurm 22.05 rejects all of these as well
REJECTED = [
    ("gpu-[1-3]-ib", 9, "text after ']'"),
    ("n[1-2].ib", 6, "text after ']'"),
    ("a[1-2]b[1-3]c", 12, "text after ']'"),
    ("n[]", 2, "empty range in brackets"),
    ("n[1,,2]", 4, "empty range in brackets"),
    ("n[1,]", 4, "empty range in brackets"),
    ("n[a]", 2, "invalid character 'a' in a range"),
    ("n[1x2]", 3, "invalid character 'x' in a range"),
    ("n[-1]", 2, "range without a lower bound"),
    ("n[1--2]", 4, "invalid character '-' in a range"),
    ("ok,n[3-1]", 5, "descending range '3-1'"),
    ("n[1-65537]", 2, "too many hosts (65537) in range '1-65537'"),
    ("node[000001-100000]", 5, "too many hosts (100000) in range '000001-100000'"),
    ("a[1-40000,40001-65537]b[1]", 1, "too many hosts (65537) in a bracket group followed by more name"),
    ("a[[1-2]]", 1, "unbalanced '['"),
    ("a[1-2]]", 6, "unbalanced ']'"),
    ("a[1-2]b[x]c[1-2]", 8, "invalid character 'x' in a range"),
]

# Slurm accepts these but prints other hosts than the text says (e.g. "node[1-3" -> "node]"): rejected here.
MANGLED = [
    ("node[1-3", 4, "unbalanced '['"),
    ("[1-3", 0, "unbalanced '['"),
    ("a[1[2]", 1, "unbalanced '['"),
    ("a[1-2]x[3-4", 7, "unbalanced '['"),
    ("a]b", 1, "unbalanced ']'"),
    ("n[+2]", 2, "invalid character '+' in a range"),
    ("n[1, 2]", 4, "invalid character ' ' in a range"),
    ("a[x]b[1-2]c[1-2]", 2, "invalid character 'x' in a range"),
    ("a\nb", 1, "invalid character '\\n'"),
    ("a\x00b[1]", 1, "invalid character '\\x00'"),
    ("n99999999999999999999", 1, "number too large"),
    ("n[18446744073709551614-18446744073709551615]", 2, "number too large"),
]


@pytest.mark.parametrize(("text", "position", "reason"), REJECTED + MANGLED)
def test_expand_rejects_with_the_position(text: str, position: int, reason: str) -> None:
    with pytest.raises(HostlistError) as caught:
        expand(text)
    error = caught.value
    assert (error.position, error.reason) == (position, reason)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"hostlist: {reason} at position {position}")
    assert message.endswith(f"(got {text!r})") or len(repr(text)) > 80


def test_error_is_an_invalid_spec_with_one_line() -> None:
    with pytest.raises(HostlistError) as caught:
        expand("node[1-3")
    error = caught.value
    assert isinstance(error, InvalidSpec) and isinstance(error, BridgeError)
    assert (error.exit_code, error.retryable, error.field, error.value) == (2, False, "hostlist", "node[1-3")
    assert str(error) == "hostlist: unbalanced '[' at position 4 (got 'node[1-3')"
    long = "x" * 200 + "[1-2]y"
    with pytest.raises(HostlistError) as caught:
        expand(long)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 250


def test_expand_checks_its_argument_type() -> None:
    with pytest.raises(TypeError):
        expand(["n1"])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------
# compress

COMPRESS = [
    (["n1", "n2", "n3"], "n[1-3]"),
    (["n3", "n2", "n1"], "n[3,2,1]"),  # never sorted
    (["n3", "n1", "n2", "n1"], "n[3,1-2,1]"),  # never de-duplicated
    (["n1", "n1"], "n[1,1]"),
    (["n1", "n02", "n3"], "n[1,02,3]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n09", "n10", "n011"], "n[09-10,011]"),  # joins only if the host renders the same at the range's width
    (["n99", "n100"], "n[99-100]"),
    (["n099", "n100", "n101"], "n[099-101]"),
    (["n001", "n002", "n1", "n2"], "n[001-002,1-2]"),
    (["n0", "n1", "n00"], "n[0-1,00]"),
    (["n1", "n2", "n", "n3"], "n[1-2],n,n3"),  # a name without a number stands alone
    (["a1", "b1", "a2", "a3"], "a1,b1,a[2-3]"),  # only neighbours share a bracket
    (["1", "2", "3", "05"], "[1-3,05]"),
    (["a-1", "a-2", "a"], "a-[1-2],a"),
    (["a1b1", "a1b2", "a2b1"], "a1b[1-2],a2b1"),
    (["n1-2"], "n1-2"),
    (["x", "x", "x"], "x,x,x"),
    (["n007"], "n007"),
    (["a%d1", "a%d2", "a{0}3"], "a%d[1-2],a{0}3"),
    (["n1.ib", "n2.ib"], "n1.ib,n2.ib"),  # the number must be trailing
    (["a.b1", "a.b2"], "a.b[1-2]"),
    ([], ""),
]


@pytest.mark.parametrize(("hosts", "text"), COMPRESS)
def test_compress(hosts: list[str], text: str) -> None:
    assert compress(hosts) == text
    assert compress(iter(hosts)) == text
    assert expand(text) == hosts


def test_compress_100k_hosts() -> None:
    hosts = [f"node{i:06d}" for i in range(1, 100001)]
    assert compress(hosts) == "node[000001-100000]"
    with pytest.raises(HostlistError, match="65536"):
        expand(compress(hosts))  # like scontrol: a run longer than 65,536 hosts does not expand again
    fragmented = [f"node{i:06d}" for i in range(1, 150001) if i % 3]
    text = compress(fragmented)
    assert text == "node[" + ",".join(f"{i:06d}-{i + 1:06d}" for i in range(1, 150001, 3)) + "]"
    assert expand(text) == fragmented
    racks = [f"r{r:02d}n{n:04d}" for r in range(1, 101) for n in range(1, 1001)]
    assert compress(racks) == ",".join(f"r{r:02d}n[0001-1000]" for r in range(1, 101))
    broken = hosts[:60000]
    broken[1234] = "other"
    broken[40000] = "node040000"  # where node040001 belongs: the range stops and restarts
    assert compress(broken) == "node[000001-001234],other,node[001236-040000,040000,040002-060000]"


BAD_HOSTS = [
    (["a", "b,c"], 1, 1, "invalid character ','"),
    (["n[1]"], 0, 1, "invalid character '['"),
    (["a b"], 0, 1, "invalid character ' '"),
    (["ok", "x\ny"], 1, 1, "invalid character '\\n'"),
    (["n1", ""], 1, 0, "empty host name"),
    (["n99999999999999999999"], 0, 1, "number too large"),
]


@pytest.mark.parametrize(("hosts", "index", "position", "reason"), BAD_HOSTS)
def test_compress_rejects_names_that_cannot_round_trip(
    hosts: list[str], index: int, position: int, reason: str
) -> None:
    with pytest.raises(HostlistError) as caught:
        compress(hosts)
    assert (caught.value.position, caught.value.reason) == (position, reason)
    assert f"of host #{index}" in str(caught.value) and "\n" not in str(caught.value)


def test_compress_checks_its_argument_type() -> None:
    with pytest.raises(TypeError):
        compress("n1,n2")
    with pytest.raises(TypeError):
        compress(["n1", 2])  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------------------
# properties

prefixes = st.sampled_from(["n", "node-", "", "a1b", "gpu", "x-y"])
widths = st.integers(0, 5)


@st.composite
def hosts(draw: st.DrawFn) -> list[str]:
    """Runs, singles and bare names with random padding, then maybe shuffled and with duplicates."""
    out: list[str] = []
    for _ in range(draw(st.integers(0, 8))):
        prefix = draw(prefixes)
        if draw(st.integers(0, 5)) == 0:
            out.append(prefix or "z")
            continue
        start = draw(st.integers(0, 1100))
        width = draw(widths)
        out += [f"{prefix}{n:0{width}d}" for n in range(start, start + draw(st.integers(1, 120)))]
    if draw(st.booleans()):
        out = draw(st.permutations(out))
    for _ in range(draw(st.integers(0, 3))):
        if out:
            out.insert(draw(st.integers(0, len(out))), draw(st.sampled_from(out)))
    return out


@settings(max_examples=300, deadline=None)
@given(hosts())
def test_round_trip_keeps_order_and_duplicates(names: list[str]) -> None:
    """What holds: expand(compress(h)) == h exactly (no run here exceeds 65,536 hosts), and compress is
    canonical: compressing the expansion of any compressed text gives that text again."""
    text = compress(names)
    assert expand(text) == names
    assert compress(expand(text)) == text


def reference_expand(text: str) -> list[str]:
    """The documented semantics, written plainly (no fast paths) for valid input without blanks."""
    out: list[str] = []
    for name in re.findall(r"(?:[^,\[\]]|\[[^\]]*\])+", text):
        parts = re.split(r"\[([^\]]*)\]", name)
        literals, groups = parts[0::2], parts[1::2]
        if not groups:
            out.append(name)
            continue
        numbers = []
        for group in groups:
            found = []
            for item in group.split(","):
                lo, _, hi = item.partition("-")
                found += [f"{n:0{len(lo)}d}" for n in range(int(lo), int(hi or lo) + 1)]
            numbers.append(found)
        # Fastest the last group, then the first, the second, ...; slowest the second-to-last.
        order = list(range(len(groups) - 2, -1, -1))
        for chosen in itertools.product(*(numbers[i] for i in order)):
            picked = dict(zip(order, chosen, strict=True))
            head = "".join(literal + picked.get(i, "") for i, literal in enumerate(literals[:-1]))
            out += [head + last for last in numbers[-1]]
    return out


item = st.builds(
    lambda lo, span, width, form: form.format(lo=f"{lo:0{width}d}", hi=lo + span),
    st.integers(0, 3000),
    st.sampled_from([0, 1, 2, 5, 70, 999, 1500]),
    widths,
    st.sampled_from(["{lo}", "{lo}-{hi}", "{lo}-{hi}", "{lo}-"]),
)
group = st.lists(item, min_size=1, max_size=5).map(lambda items: "[" + ",".join(items) + "]")
small_group = st.lists(st.sampled_from(["1", "2-3", "07", "9-11"]), min_size=1, max_size=2).map(
    lambda items: "[" + ",".join(items) + "]"
)
literal = st.text("ab-z%{7", max_size=3)
name = st.one_of(
    st.builds(lambda a, g: a + g, literal, group),
    st.builds(lambda a, g, b, h: a + g + b + h, literal, small_group, literal, small_group),
    st.builds(lambda *p: "".join(p), literal, small_group, literal, small_group, literal, small_group),
    st.builds(lambda *p: "".join(p), *[literal, small_group] * 4),
    st.text("abn-1", min_size=1, max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(name, min_size=1, max_size=4).map(",".join))
def test_expand_matches_the_plain_reference(text: str) -> None:
    assert expand(text) == reference_expand(text)
