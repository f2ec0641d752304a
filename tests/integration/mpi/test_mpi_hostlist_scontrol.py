"""Oracle test: bridge.mpi.hostlist agrees with Slurm 22.05's own ``scontrol show hostnames|hostlist``.

scontrol works offline given any slurm.conf. Cases are batched: one interactive scontrol reads many
``show ...`` lines from stdin, each followed by ``show hostnames @@<i>`` as a marker, so the output can be
cut per case; scontrol reports a rejected hostlist as ``Invalid hostlist: <text>`` on stderr, which is
matched back by its text. A missing scontrol fails the test: the project's setup installs slurm-client.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.mpi.hostlist import HostlistError, compress, expand

pytestmark = [pytest.mark.integration, pytest.mark.mpi]

SLURM_SERIES = "22.05"
REJECTED = object()  # scontrol printed "Invalid hostlist"


@dataclass(frozen=True)
class Scontrol:
    """Runs scontrol against a throw-away slurm.conf."""

    exe: str
    env: dict[str, str]

    def batch(self, kind: str, cases: Sequence[str]) -> list[list[str] | object]:
        """``show <kind> <case>`` for every case in one process: each case's stdout lines, or REJECTED."""
        for case in cases:
            # The interactive reader splits on whitespace and keeps quotes; "!!" repeats; "/" means a file.
            assert (
                case and not any(c.isspace() or c in "'\"" for c in case) and case[0] != "/" and case != "!!"
            )
        script = "".join(f"show {kind} {case}\nshow hostnames @@{i}\n" for i, case in enumerate(cases))
        # readline echoes each command; a screen wider than the longest line keeps it from wrapping and
        # redrawing (it allocates per column, so not wider than needed).
        columns = max(len(case) for case in cases) + 64
        proc = subprocess.run(
            [self.exe],
            input=script,
            capture_output=True,
            text=True,
            env={**self.env, "COLUMNS": str(columns)},
            timeout=120,
            check=False,
        )
        assert "\r" not in proc.stdout and "\x1b" not in proc.stdout, (
            "readline redrew lines; is COLUMNS honoured?"
        )
        rejected = {
            line.removeprefix("Invalid hostlist: ")
            for line in proc.stderr.splitlines()
            if line.startswith("Invalid hostlist: ")
        }
        results: list[list[str] | object] = []
        lines: list[str] = []
        for line in proc.stdout.split("\n"):
            if line.startswith("scontrol: "):
                continue  # the prompt and readline's echo of each command
            if line == f"@@{len(results)}":
                results.append(REJECTED if cases[len(results)] in rejected else lines)
                lines = []
            else:
                lines.append(line)
        assert len(results) == len(cases), f"scontrol stopped early: {proc.stderr[-500:]}"
        return results

    def argv(self, kind: str, case: str) -> list[str] | object:
        """One ``scontrol show <kind> <case>`` process: for text the interactive reader cannot carry."""
        proc = subprocess.run(
            [self.exe, "show", kind, case],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )
        if "Invalid hostlist" in proc.stderr:
            return REJECTED
        return proc.stdout.split("\n")[:-1]


@pytest.fixture(scope="session")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> Scontrol:
    exe = shutil.which("scontrol")
    if exe is None:
        pytest.fail(
            "scontrol is not on PATH: this oracle test needs Slurm 22.05's slurm-client package "
            "(apt-get install slurm-client); the project's setup installs it, "
            "so this test fails rather than skips"
        )
    conf = Path(tmp_path_factory.mktemp("slurm-oracle")) / "slurm.conf"
    conf.write_text("ClusterName=oracle\nSlurmctldHost=localhost\n", encoding="utf-8")
    # INPUTRC: no user readline settings (vi mode, ...) between us and the interactive prompt.
    env = {**os.environ, "SLURM_CONF": str(conf), "TERM": "dumb", "INPUTRC": "/dev/null"}
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, env=env, check=False).stdout
    if SLURM_SERIES not in version:
        pytest.fail(f"bridge.mpi.hostlist follows Slurm {SLURM_SERIES}, but scontrol is {version.strip()!r}")
    return Scontrol(exe, env)


def ours(text: str) -> list[str] | object:
    try:
        return expand(text)
    except HostlistError:
        return REJECTED


# ---------------------------------------------------------------------------------------------------
# fixed cases (tests/unit/test_hostlist.py pins the same forms, without scontrol)


ACCEPTED = [
    "n[1-3],n[2-5]",
    "node[001-004,010]",
    "a,b[1-2],c",
    "rack[1-2]n[01-16]",
    "a[1-2]b[1-2]c[1-2]",
    "a[1-2]b[1-2]c[1-2]d[1-2]",
    "a[1-2][3-4]",
    "n[1-2]-[3]",
    "[1-3,7,09-11]",
    "x1[2-3]",
    "n[1-]",
    "n[001-3]",
    "n[1-010]",
    "n[998-1003]",
    "n[0998-1003]",
    "n[00-1500]",
    "n[5-2000]",
    "n[99998-100002]",
    "n[1,3,5-7,2]",
    ",n[1-2],,m,",
    "n[1-65536]",
    "n[0-65535]",
    "a[1-40000,40001-65536]b[1]",
    "a[1-2]b[1-40000,1-40000]",
    "a{1}[1-2]x%d[3]",
    "n[1-2].ib[0]",
    "n18446744073709551614",
    "n[18446744073709551614]",
]

SLURM_REJECTS = [
    "gpu-[1-3]-ib",  # text after the last ']'
    "n[1-2].ib",
    "a[1-2]b",
    "a[1-2]b[1-3]c",
    "n[]",  # empty group / empty item
    "n[1,,2]",
    "n[1,]",
    "n[,1]",
    "n[a]",  # not a number
    "n[1x2]",
    "n[0x1]",
    "n[-1]",  # no lower bound
    "n[1--2]",
    "n[3-1]",  # descending
    "n[1-65537]",  # more than 65536 hosts in one range
    "n[0-65536]",
    "node[000001-100000]",
    "a[1-40000,40001-65537]b[1]",  # more than 65536 hosts in a group followed by more name
    "a[1-2]x[1-70000]y[1-2]",
    "a[[1-2]]",  # brackets around a group
    "a[1-2]]",
    "a[1]b]",
    "n[1-2]x]y[3]",
    "a[]b[1]",
    "a[1-2]b[x]c[1-2]",  # an error in the second-to-last group still counts
]

# Slurm accepts these but prints hosts the text does not say; expand() rejects them instead.
MANGLED = [
    ("node[1-3", ["node]"]),
    ("[1-3", ["1-3"]),
    ("a[1[2]", ["a[12"]),
    ("a[1-2]x[3-4", ["a[1-2]x]"]),
    ("a]b", ["a]b"]),
    ("a]b[1-2]", ["a]b1", "a]b2"]),
    ("n[+2]", ["n02"]),
    ("n[1-+3]", ["n1", "n2", "n3"]),
    ("a[x]b[1-2]c[1-2]", []),  # errors in groups before the second-to-last are swallowed
    ("a[1-70000]x[1-2]y[1-2]", []),
    ("n99999999999999999999", ["n18446744073709551615"]),  # strtoul clamps
    ("n[99999999999999999999]", ["n18446744073709551615"]),
]
# These need argv: the interactive reader would split them.
MANGLED_ARGV = [
    ("n[1, 2]", ["n1", "n02"]),  # strtoul skips the blank but the width counts it
    ("a\nb", ["a", "b"]),
]


def test_accepted_forms_match_scontrol(scontrol: Scontrol) -> None:
    for case, slurm in zip(ACCEPTED, scontrol.batch("hostnames", ACCEPTED), strict=True):
        assert slurm is not REJECTED, case
        assert expand(case) == slurm, case


def test_rejected_forms_are_rejected_by_scontrol_too(scontrol: Scontrol) -> None:
    for case, slurm in zip(SLURM_REJECTS, scontrol.batch("hostnames", SLURM_REJECTS), strict=True):
        assert slurm is REJECTED, f"scontrol accepts {case!r}: {slurm}"
        with pytest.raises(HostlistError):
            expand(case)


def test_forms_slurm_mangles_are_rejected_here(scontrol: Scontrol) -> None:
    """The documented deviation: scontrol really prints these hosts, and expand() refuses the text."""
    cases = [case for case, _ in MANGLED]
    for (case, printed), slurm in zip(MANGLED, scontrol.batch("hostnames", cases), strict=True):
        assert slurm == printed, case
        with pytest.raises(HostlistError):
            expand(case)
    for case, printed in MANGLED_ARGV:
        assert scontrol.argv("hostnames", case) == printed, case
        with pytest.raises(HostlistError):
            expand(case)


def test_blank_and_tab_separate_hosts_as_in_scontrol(scontrol: Scontrol) -> None:
    for case in ("a b\tc,d", " n[1-2]  m ", "\tx,\t,y"):
        assert expand(case) == scontrol.argv("hostnames", case), repr(case)


def test_scontrol_rejects_a_range_of_more_than_65536_hosts_that_it_prints_itself(scontrol: Scontrol) -> None:
    """Slurm's own round trip breaks past MAX_RANGE; expand/compress reproduce both halves."""
    hosts = [f"n{i}" for i in range(1, 70001)]
    (printed,) = scontrol.batch("hostlist", [",".join(hosts)])
    assert printed == ["n[1-70000]"] == [compress(hosts)]
    assert scontrol.batch("hostnames", ["n[1-70000]"]) == [REJECTED]
    with pytest.raises(HostlistError, match="65536"):
        expand("n[1-70000]")


COMPRESS_CASES = [
    ["n1", "n02", "n3"],
    ["n9", "n10", "n11"],
    ["n09", "n10", "n011"],
    ["n1", "n2", "n", "n3"],
    ["1", "2", "3", "05"],
    ["n1", "n1"],
    ["n3", "n2", "n1"],
    ["a1", "b1", "a2", "a3"],
    ["n99", "n100"],
    ["n099", "n100", "n101"],
    ["a-1", "a-2", "a"],
    ["n001", "n002", "n1", "n2"],
    ["n1-2"],
    ["x", "x", "x"],
    ["n0", "n1", "n00"],
    ["a1b1", "a1b2", "a2b1"],
    ["n3", "n1", "n2", "n1"],
    ["a%d1", "a%d2", "a{0}3"],
    ["n1.ib", "n2.ib"],
    ["a.b1", "a.b2"],
]


def test_compress_cases_match_scontrol(scontrol: Scontrol) -> None:
    printed = scontrol.batch("hostlist", [",".join(hosts) for hosts in COMPRESS_CASES])
    for hosts, slurm in zip(COMPRESS_CASES, printed, strict=True):
        assert [compress(hosts)] == slurm, hosts


def test_100k_hosts_match_scontrol(scontrol: Scontrol) -> None:
    runs = [(start, start + (start * 7919) % 23) for start in range(1, 400_000, 29)]
    hosts = [f"node{n:06d}" for lo, hi in runs for n in range(lo, hi + 1)][:100_000]
    text = compress(hosts)
    assert scontrol.batch("hostlist", [",".join(hosts)]) == [[text]]
    assert scontrol.batch("hostnames", [text]) == [hosts] == [expand(text)]


# ---------------------------------------------------------------------------------------------------
# generated cases

LETTERS = "abcnxz-9"
literal = st.text(LETTERS, max_size=3)
padded = st.builds(lambda n, w: f"{n:0{w}d}", st.integers(0, 1200), st.integers(0, 5))


@st.composite
def item(draw: st.DrawFn, longest: int) -> str:
    lo = draw(st.integers(0, 1200))
    width = draw(st.integers(0, 5))
    kind = draw(st.sampled_from(["single", "range", "range", "open"]))
    if kind == "single":
        return f"{lo:0{width}d}"
    if kind == "open":
        return f"{lo:0{width}d}-"
    hi = lo + draw(st.integers(0, longest))
    return f"{lo:0{width}d}-{draw(st.sampled_from([str(hi), f'{hi:0{width}d}', f'{hi:06d}']))}"


def group(longest: int, items: int) -> st.SearchStrategy[str]:
    return st.lists(item(longest), min_size=1, max_size=items).map(lambda xs: "[" + ",".join(xs) + "]")


@st.composite
def name(draw: st.DrawFn) -> str:
    """One name: plain, or literals and bracket groups ending with a group."""
    shape = draw(st.sampled_from(["plain", "one", "one", "one-long", "several"]))
    if shape == "plain":
        text = (
            draw(literal)
            + draw(st.sampled_from(["", "1", "007", "a1b"]))
            + draw(st.sampled_from(["", "42", "0"]))
        )
        return text or "z"
    if shape == "one":
        return draw(literal) + draw(group(30, 4))
    if shape == "one-long":
        return draw(literal) + draw(group(1500, 2))
    count = draw(st.integers(2, 3))
    return "".join(draw(literal) + draw(group(3, 2)) for _ in range(count))


@st.composite
def valid_hostlist(draw: st.DrawFn) -> str:
    names = draw(st.lists(name(), min_size=1, max_size=4))
    glue = draw(st.sampled_from([",", ",", ",,"]))
    return draw(st.sampled_from(["", ","])) + glue.join(names) + draw(st.sampled_from(["", ","]))


BAD_GROUPS = ["[]", "[1,,2]", "[1,]", "[,3]", "[5-3]", "[1a]", "[x]", "[1--2]", "[-4]", "[1-65537]", "[0x1]"]


@st.composite
def rejected_hostlist(draw: st.DrawFn) -> str:
    """A valid hostlist with one name that Slurm 22.05 rejects (never one that it silently mangles)."""
    bad_group = st.sampled_from(BAD_GROUPS)
    shape = draw(
        st.sampled_from(["suffix", "last", "second-to-last", "big-prefix", "double-close", "nested"])
    )
    good = draw(group(5, 2))
    if shape == "suffix":
        bad = draw(literal) + good + draw(st.text(LETTERS, min_size=1, max_size=3))
    elif shape == "last":
        bad = draw(literal) + draw(st.sampled_from(["", good + "y"])) + draw(bad_group)
    elif shape == "second-to-last":
        bad = draw(literal) + draw(bad_group) + draw(literal) + good
    elif shape == "big-prefix":
        bad = draw(literal) + "[1-40000,40001-65537]" + draw(literal) + good
    elif shape == "double-close":
        bad = draw(literal) + good + "]"
    else:
        bad = draw(literal) + "[" + good + "]"
    names = draw(st.lists(name(), max_size=2))
    names.insert(draw(st.integers(0, len(names))), bad)
    return ",".join(names)


HOST_PREFIXES = ["n", "n", "node-", "", "a1b", "x", "gpu-"]


@st.composite
def host_list(draw: st.DrawFn) -> list[str]:
    """Hosts as a scheduler or a user might list them: runs, duplicates, mixed padding, shuffles."""
    hosts: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        prefix = draw(st.sampled_from(HOST_PREFIXES))
        kind = draw(st.sampled_from(["run", "run", "single", "bare"]))
        if kind == "bare":
            hosts.append(prefix or "y")
            continue
        start = draw(st.sampled_from([0, 1, 7, 95, 998, draw(st.integers(0, 2000))]))
        width = draw(st.integers(0, 4))
        length = 1 if kind == "single" else draw(st.integers(1, 40))
        hosts += [f"{prefix}{n:0{width}d}" for n in range(start, start + length)]
    if draw(st.booleans()):
        hosts = draw(st.permutations(hosts))
    if hosts and draw(st.booleans()):
        hosts.insert(draw(st.integers(0, len(hosts))), draw(st.sampled_from(hosts)))
    return hosts


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(cases=st.lists(valid_hostlist(), min_size=10, max_size=40))
def test_generated_hostlists_expand_like_scontrol(scontrol: Scontrol, cases: list[str]) -> None:
    for case, slurm in zip(cases, scontrol.batch("hostnames", cases), strict=True):
        assert ours(case) == slurm, case


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(rejected_hostlist(), min_size=10, max_size=40))
def test_generated_bad_hostlists_are_rejected_by_both(scontrol: Scontrol, cases: list[str]) -> None:
    for case, slurm in zip(cases, scontrol.batch("hostnames", cases), strict=True):
        assert slurm is REJECTED, f"scontrol accepts {case!r}"
        assert ours(case) is REJECTED, f"expand accepts {case!r}"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=st.lists(host_list(), min_size=10, max_size=40))
def test_generated_host_lists_compress_like_scontrol(scontrol: Scontrol, lists: list[list[str]]) -> None:
    printed = scontrol.batch("hostlist", [",".join(hosts) for hosts in lists])
    for hosts, slurm in zip(lists, printed, strict=True):
        text = compress(hosts)
        assert [text] == slurm, hosts
        assert expand(text) == hosts, hosts  # and scontrol's text expands back to the very same list
