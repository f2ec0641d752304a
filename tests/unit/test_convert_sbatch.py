"""sbatch scripts and flags ⇄ TrainJob: sbatch 22.05's reading rules, every option family, round trips.

TrainJob → script goes through the one sbatch writer, the Slurm renderer, on the resolved plan."""

from __future__ import annotations

import re
import string
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bridge.adapters.slurm.render import DEFAULT_OUTPUT, render_script
from bridge.adapters.slurm.render import directives as slurm_directives
from bridge.annotations import SLURM_LAYOUT_ANNOTATION
from bridge.api.catalog import builtin_runtimes
from bridge.api.cluster import builtin_local_cluster
from bridge.api.trainjob import TrainJob
from bridge.convert.sbatch import (
    SBATCH_RUNTIME,
    command_body,
    default_job_name,
    dns_label,
    exec_body,
    parse_exec_body,
    sbatch_runtime,
    script_command,
    to_trainjob,
)
from bridge.errors import InvalidSpec
from bridge.plan import Launcher, derive_uid, find_runtime, resolve
from bridge.sbatch.directives import (
    SbatchRequest,
    directive_arg,
    directive_line,
    merge,
    parse_flags,
    tokenize_directive,
)
from bridge.sbatch.options import OPTIONS, passthrough_value
from bridge.sbatch.script import parse_script
from bridge.sbatch.values import gpu_counts, gres_items, node_range, size_mb, time_seconds
from bridge.shell import join
from tests import builders
from tests.builders import trainjob_doc

CASES = Path(__file__).resolve().parent.parent / "cases" / "sbatch"
SHEBANG = "#!/bin/bash\n"


SLURM = builders.cluster("slurm", "hpc")


def script(*directives: str, body: str = "srun hostname\n") -> str:
    return SHEBANG + "".join(f"#SBATCH {d}\n" for d in directives) + body


def opts(*directives: str) -> dict[str, str | None]:
    return {name: d.value for name, d in parse_script(script(*directives)).options.items()}


def convert(*directives: str, body: str = "srun hostname\n") -> tuple[TrainJob, list[str]]:
    # a file whose name is a label: sbatch's default job name is the TrainJob's name (no slurm-job-name)
    return to_trainjob(parse_script(script(*directives, body=body), "job"))


def plan_of(job: TrainJob):
    return resolve(job, find_runtime(job, builtin_runtimes(job.spec.runtime_ref.name)), SLURM)


def render(job: TrainJob) -> str:
    """The batch script the Slurm backend submits for *job*: the one sbatch writer, on the resolved plan."""
    return render_script(plan_of(job))


def exec_line(text: str) -> str:
    return text.rstrip("\n").rsplit("\n", 1)[-1]


def directive_block(job: TrainJob) -> list[tuple[str, str | None]]:
    """The #SBATCH options the renderer writes for *job*, without the uid comment (it names the TrainJob)."""
    return [(name, value) for name, value in slurm_directives(plan_of(job)) if name != "comment"]


def annotations(job: TrainJob) -> dict[str, str]:
    """The annotations a conversion wrote, but the layout one every converted script has (its own tests:
    test_round_trip.py)."""
    return {k: v for k, v in (job.metadata.annotations or {}).items() if k != SLURM_LAYOUT_ANNOTATION}


def requests(job: TrainJob) -> dict[str, str]:
    resources = job.spec.trainer.resources_per_node
    return dict(resources.requests or {}) if resources else {}


def one_line_error(excinfo: pytest.ExceptionInfo[InvalidSpec], field: str, value: str) -> None:
    text = str(excinfo.value)
    assert "\n" not in text
    assert field in excinfo.value.field, (field, excinfo.value.field)
    assert value in text, (value, text)


# --- tokenising #SBATCH lines (opt.c get_argument) ---------------------------------------------------------


@pytest.mark.parametrize(("line", "args"), [
    (" -N 2 --time=5", ["-N", "2", "--time=5"]),
    ("\t--job-name \"my job\"", ["--job-name", "my job"]),
    (" --job-name='my job'", ["--job-name=my job"]),
    (' --comment="it\'s here"', ["--comment=it's here"]),           # a quote closes only its own kind
    (" --comment='say \"hi\"'", ['--comment=say "hi"']),
    (' --comment="a\\"b"', ['--comment=a"b']),                       # backslash escapes a quote
    (" --comment=a\\\\b", ["--comment=a\\b"]),
    (" --comment=a\\ b", ["--comment=a", "b"]),                      # an escaped blank still ends the argument
    (" --time=5 # a comment -N 3", ["--time=5"]),
    (" --output=x#y -N 3", ["--output=x"]),                          # unquoted # ends the line, even mid-word
    (' --output="x#y" -N 3', ["--output=x#y", "-N", "3"]),
    (" --output=x\\#y", ["--output=x#y"]),
    (' -J "" -N 3', ["-J"]),                                         # an empty argument ends the line
    (" -N 2 hetjob -n 4", ["-N", "2"]),                              # so does a bare hetjob word
    (" --job-name=hetjobs", ["--job-name=hetjobs"]),
    ("", []),
    ("   ", []),
    ("# only a comment", []),
    (" a'b c'd", ["ab cd"]),
    (" --x=\"\t\v\"", ["--x=\t\v"]),
])
def test_tokenize_directive(line: str, args: list[str]) -> None:
    assert tokenize_directive(line) == args


@pytest.mark.parametrize(("line", "problem"), [
    (' --job-name="open', "unmatched \""),
    (" --job-name='open", "unmatched '"),
    (" :bad", "unexpected ':'"),
])
def test_tokenize_errors(line: str, problem: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        tokenize_directive(line, where="#SBATCH line 2")
    assert problem in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


_DIRECTIVE_TEXT = st.text(alphabet=st.characters(blacklist_characters="\n\x00", blacklist_categories=("Cs",)),
                          max_size=40)


@given(_DIRECTIVE_TEXT)
def test_tokenize_never_fails_otherwise(text: str) -> None:
    # any line either tokenises or is refused with InvalidSpec, never another exception
    try:
        args = tokenize_directive(text)
    except InvalidSpec as exc:
        assert "\n" not in str(exc)
        return
    assert all(args)


#: a value that fits on one line: no control characters, no line or paragraph separator
_VALUE = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=0, max_size=30)


@given(st.lists(st.tuples(st.sampled_from(sorted(OPTIONS)), _VALUE), max_size=6))
def test_directive_arg_reads_back_exactly(pairs: list[tuple[str, str]]) -> None:
    line = " " + " ".join(directive_arg(option, value, "x") for option, value in pairs)
    assert tokenize_directive(line) == [f"--{option}={value}" for option, value in pairs]


@pytest.mark.parametrize("value", ["a\nb", "a\x85b", "a\u2028b"])
def test_directive_arg_refuses_what_would_break_the_line(value: str) -> None:
    with pytest.raises(InvalidSpec, match=r"metadata.annotations\[x\]"):
        directive_arg("comment", value, "metadata.annotations[x]")


#: what plan.py lets into a #SBATCH value: one line, no quotes, no backslashes
_PLAN_VALUE = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\"'\\"),
                      min_size=1, max_size=30)


@given(st.lists(st.tuples(st.sampled_from(sorted(OPTIONS)), _PLAN_VALUE), max_size=6))
def test_renderer_lines_read_back_exactly(pairs: list[tuple[str, str]]) -> None:
    # the renderer's #SBATCH lines, on every value the planner lets through: sbatch reads each back exactly
    for option, value in pairs:
        line = directive_line(option, value)
        assert line.startswith("#SBATCH ")
        assert tokenize_directive(line[len("#SBATCH"):]) == [f"--{option}={value}"]


def test_passthrough_value_writes_flags_bare() -> None:
    assert passthrough_value("requeue", "true") is None       # takes no value
    assert passthrough_value("nice", "true") is None          # optional value
    assert passthrough_value("comment", "true") == "true"     # required value
    assert passthrough_value("nice", "5") == "5"
    assert passthrough_value("not-an-option", "true") == "true"


# --- the directive block -----------------------------------------------------------------------------------


def test_directives_stop_at_first_command() -> None:
    text = ("#!/bin/bash\n\n# comment\n   # indented comment\n#SBATCH -N 2\n"
            "echo hi\n#SBATCH -N 5\n#SBATCH --bogus-option\n")
    request = parse_script(text)
    assert request.get("nodes") == "2"
    assert request.body == "#!/bin/bash\n\n# comment\n   # indented comment\necho hi\n#SBATCH -N 5\n#SBATCH --bogus-option\n"


def test_directive_must_start_in_column_zero() -> None:
    request = parse_script("#!/bin/bash\n  #SBATCH -N 9\n#SBATCH -N 2\nhostname\n")
    assert request.get("nodes") == "2"
    assert "  #SBATCH -N 9" in request.body


def test_value_on_the_next_directive_line() -> None:
    # sbatch builds one argv from all directive lines, so getopt takes the value from the next line
    assert opts("--job-name", "myname") == {"job-name": "myname"}


def test_magic_word_glued_to_option() -> None:
    assert parse_script("#!/bin/sh\n#SBATCH--time=5\ntrue\n").get("time") == "5"


def test_slurm_magic_word_is_read_with_a_note() -> None:
    request = parse_script("#!/bin/sh\n#SLURM --time=5\ntrue\n")
    assert request.get("time") == "5"
    assert any("deprecated" in note for note in request.notes)


def test_last_occurrence_wins() -> None:
    assert opts("-N 2", "--nodes=3") == {"nodes": "3"}
    assert opts("--requeue", "--no-requeue") == {"no-requeue": None}
    assert opts("--no-requeue --requeue") == {"requeue": None}
    assert opts("--exclusive", "-s") == {"oversubscribe": None}
    assert opts("--tasks-per-node=3", "--ntasks-per-node=4") == {"ntasks-per-node": "4"}


def test_heterogeneous_job_components_are_read_one_by_one() -> None:
    text = ("#!/bin/bash\n#SBATCH -J het -t 10\n#SBATCH hetjob -N 9\n#SBATCH -N 2 --gres=gpu:1\n"
            "#SBATCH  PACKJOB\n#SBATCH -c 4\nsrun --het-group=1 hostname\n")
    request = parse_script(text, "het.sbatch")
    # the separator's own line is otherwise ignored (sbatch 22.05 reads no option after the word)
    assert {n: d.value for n, d in request.options.items()} == {"job-name": "het", "time": "10"}
    assert [{n: d.value for n, d in c.options.items()} for c in request.components] == [
        {"nodes": "2", "gres": "gpu:1"}, {"cpus-per-task": "4"}]
    assert request.hetjob_line == 3 and request.body == "#!/bin/bash\nsrun --het-group=1 hostname\n"
    assert any("packjob" in note for note in request.notes)
    # command-line flags apply to every component, as sbatch applies them
    merged = merge(request, parse_flags(["-t", "5"]))
    assert [c.get("time") for c in (merged, *merged.components)] == ["5", "5", "5"]
    with pytest.raises(InvalidSpec) as excinfo:
        to_trainjob(request)
    assert excinfo.value.field == "#SBATCH line 3" and "only on a Slurm cluster" in excinfo.value.problem
    # every component is checked as sbatch checks it
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script("#!/bin/bash\n#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH --bogus\ntrue\n")
    assert "#SBATCH line 4" in excinfo.value.field


@pytest.mark.parametrize(("text", "field", "problem"), [
    ("", "script", "empty"),
    ("   \n\t\n", "script", "whitespace"),
    ("echo hi\n", "line 1", "#!"),
    ("#!/bin/bash\r\n#SBATCH -N 2\r\n", "line 1", "DOS"),
    ("#!/bin/bash\necho \x00\n", "script", "NUL"),
])
def test_script_sanity_checks(text: str, field: str, problem: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script(text, "job.sbatch")
    assert excinfo.value.field == field
    assert problem in str(excinfo.value)
    assert str(excinfo.value).startswith("job.sbatch: ")
    assert "\n" not in str(excinfo.value)


# --- getopt_long -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("directives", "expected"), [
    (["-N2 -n8"], {"nodes": "2", "ntasks": "8"}),
    (["-N 2 -n 8"], {"nodes": "2", "ntasks": "8"}),
    (["--nodes 2", "--ntasks=8"], {"nodes": "2", "ntasks": "8"}),
    (["-HOk"], {"hold": None, "overcommit": None, "no-kill": None}),
    (["-HOt10"], {"hold": None, "overcommit": None, "time": "10"}),
    (["-koff"], {"no-kill": "off"}),
    (["--part=debug"], {"partition": "debug"}),                        # unique abbreviation
    (["--exclusive=user"], {"exclusive": "user"}),
    (["--exclusive"], {"exclusive": None}),
    (["--nice"], {"nice": None}),
    (["-J -dash-name"], {"job-name": "-dash-name"}),                  # a value may start with '-'
    (["--comment=a=b"], {"comment": "a=b"}),
    (["--comment="], None),                                          # empty: refused below
])
def test_getopt(directives: list[str], expected: dict[str, str | None] | None) -> None:
    if expected is None:
        with pytest.raises(InvalidSpec, match="empty value"):
            opts(*directives)
    else:
        assert opts(*directives) == expected


@pytest.mark.parametrize(("directive", "field", "value", "problem"), [
    ("--bogus=1", "#SBATCH line 2: --bogus", "--bogus", "unknown sbatch option"),
    ("-Z", "#SBATCH line 2: -Z", "-Z", "unknown sbatch option"),
    ("--mem-per=4G", "#SBATCH line 2: --mem-per", "--mem-per", "ambiguous"),
    ("--hold=yes", "#SBATCH line 2: --hold", "--hold=yes", "takes no value"),
    ("--time", "#SBATCH line 2: --time", "--time", "needs a value"),
    ("-t", "#SBATCH line 2: -t", "-t", "needs a value"),
    ("stray", "#SBATCH line 2", "stray", "not an sbatch option"),
    ("-N 2 extra", "#SBATCH line 2", "extra", "not an sbatch option"),
    ("--exclusive user", "#SBATCH line 2", "user", "not an sbatch option"),   # optional values need '='
    ("-- -N 2", "#SBATCH line 2", "-N", "after --"),
    ("--help", "#SBATCH line 2: --help", "--help", "help"),
    ("--wrap=hostname", "#SBATCH line 2: --wrap", "hostname", "replaces the script"),
    ("--test-only", "#SBATCH line 2: --test-only", "--test-only", "never submit"),
    ("--parsable", "#SBATCH line 2: --parsable", "--parsable", "output"),
])
def test_getopt_errors(directive: str, field: str, value: str, problem: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script(script(directive))
    one_line_error(excinfo, field, value)
    assert problem in str(excinfo.value)


def test_error_names_the_line_of_the_option() -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script(script("-N 2", "-p debug", "--time=soon"), "job.sbatch")
    assert str(excinfo.value).startswith("job.sbatch: #SBATCH line 4: --time: ")
    assert "'soon'" in str(excinfo.value)


# --- values ------------------------------------------------------------------------------------------------

TIME_TABLE = [
    ("90", 90 * 60),                     # minutes
    ("0:30", 30),                        # minutes:seconds
    ("5:30", 5 * 60 + 30),
    ("1:00:00", 3600),                   # hours:minutes:seconds
    ("36:00:00", 36 * 3600),
    ("2-0", 2 * 86400),                  # days-hours
    ("2-12", 2 * 86400 + 12 * 3600),
    ("1-", 86400),                       # sscanf reads the days alone
    ("1-2:30", 86400 + 2 * 3600 + 30 * 60),        # days-hours:minutes
    ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),  # days-hours:minutes:seconds
    ("0-0:0:1", 1),
    ("UNLIMITED", None),
    ("unlimited", None),
    ("INFINITE", None),
    ("-1", None),
    ("0", None),                         # Slurm: zero means no limit
    ("00:00:00", None),
]


@pytest.mark.parametrize(("text", "seconds"), TIME_TABLE)
def test_time_formats(text: str, seconds: int | None) -> None:
    job, report = convert(f"--time={text}")
    if seconds is None:
        assert job.spec.active_deadline_seconds is None
        assert annotations(job)["hpcbridge.io/sbatch.time"] == text
    else:
        assert job.spec.active_deadline_seconds == seconds


@pytest.mark.parametrize("text", ["", "1:", ":5", "1::2", "1:2:3:4", "1-2-3", "1-:5", "1-2:", "5m", "1h", "1.5",
                                  "-5", "1:-2", "99999999999"])
def test_time_malformed(text: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script(script(f"--time={text}") if text else script("--time=''"))
    assert "\n" not in str(excinfo.value)


_SMALL = st.integers(min_value=0, max_value=400)


@given(d=st.integers(0, 365), h=st.integers(0, 99), m=_SMALL, s=_SMALL)
def test_time_formats_property(d: int, h: int, m: int, s: int) -> None:
    cases = {
        f"{m}": m * 60,
        f"{m}:{s}": m * 60 + s,
        f"{h}:{m}:{s}": h * 3600 + m * 60 + s,
        f"{d}-{h}": d * 86400 + h * 3600,
        f"{d}-{h}:{m}": d * 86400 + h * 3600 + m * 60,
        f"{d}-{h}:{m}:{s}": d * 86400 + h * 3600 + m * 60 + s,
        f"{d:02d}-{h:02d}:{m:02d}:{s:02d}": d * 86400 + h * 3600 + m * 60 + s,
    }
    for text, seconds in cases.items():
        job, _ = convert(f"-t {text}")
        assert job.spec.active_deadline_seconds == (seconds or None), text


@given(st.integers(min_value=1, max_value=10**7))
def test_time_seconds_survive_a_round_trip(seconds: int) -> None:
    job, _ = convert(f"--time=0:{seconds}")
    again, _ = to_trainjob(parse_script(render(job)))
    assert again.spec.active_deadline_seconds == seconds


@pytest.mark.parametrize(("text", "mb"), [("4096", 4096), ("4G", 4096), ("4g", 4096), ("4GB", 4096),
                                          ("1T", 1024 * 1024), ("512M", 512), ("1025K", 2), ("1K", 1), ("0", 0)])
def test_sizes(text: str, mb: int) -> None:
    assert size_mb(text) == mb


@pytest.mark.parametrize("text", ["4Gi", "4.5G", "-1", "G", "4X", "4GBB"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script(script(f"--mem={text}"))
    one_line_error(excinfo, "--mem", text)


@pytest.mark.parametrize(("text", "expected"), [("2", (2, 2)), ("2-4", (2, 4)), ("-4", (1, 4)), ("0-2", (1, 2)),
                                                ("1k", (1024, 1024)), ("3-3", (3, 3))])
def test_node_ranges(text: str, expected: tuple[int, int]) -> None:
    assert node_range(text) == expected


@pytest.mark.parametrize("text", ["0", "4-2", "two", "2.5", "-", "2-"])
def test_bad_node_counts(text: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script(script(f"--nodes={text}"))
    one_line_error(excinfo, "--nodes", text)


def test_gpu_and_gres_grammar() -> None:
    assert gpu_counts("4") == [(None, 4)]
    assert gpu_counts("a100:2,v100:1") == [("a100", 2), ("v100", 1)]
    items = gres_items("gpu:a100:2,nvme:1,gres/shard,gres:mps:50")
    assert [(i.name, i.kind, i.count) for i in items] == [("gpu", "a100", "2"), ("nvme", None, "1"),
                                                          ("shard", None, "1"), ("mps", None, "50")]


@pytest.mark.parametrize(("directive", "field", "value"), [
    ("--ntasks=0", "--ntasks", "0"),
    ("-c two", "-c", "two"),
    ("--gpus-per-node=a100:", "--gpus-per-node", "a100:"),
    ("--gres=gpu:a100:2:extra", "--gres", "gpu:a100:2:extra"),
    ("--array=1-", "--array", "1-"),
    ("--dependency=after123", "--dependency", "after123"),
    ("--export=1BAD", "--export", "1BAD"),
    ("--signal=B:USR1@soon", "--signal", "B:USR1@soon"),
    ("--mail-type=SOMETIMES", "--mail-type", "SOMETIMES"),
    ("--open-mode=rewrite", "--open-mode", "rewrite"),
    ("--nice=lots", "--nice", "lots"),
    ("--priority=-1", "--priority", "-1"),
    ("--begin=someday", "--begin", "someday"),
    ("--switches=x@5", "--switches", "x@5"),
    ("--exclusive=everyone", "--exclusive", "everyone"),
    ("--distribution=sideways", "--distribution", "sideways"),
    ("--wait-all-nodes=2", "--wait-all-nodes", "2"),
    ("-k=maybe", "-k", "=maybe"),
    ("-N=2", "-N", "=2"),                          # getopt hands "=2" to -N, as sbatch does
])
def test_malformed_values(directive: str, field: str, value: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_script(script(directive), "job.sbatch")
    one_line_error(excinfo, field, value)
    assert excinfo.value.field.startswith("#SBATCH line 2: ")


# --- option families → TrainJob ----------------------------------------------------------------------------


def test_geometry_and_resources() -> None:
    job, _ = convert("-N 2 --ntasks-per-node=4 -c 3 --mem=8G --gpus-per-node=2")
    trainer = job.spec.trainer
    assert (trainer.num_nodes, trainer.num_proc_per_node) == (2, 4)
    assert requests(job) == {"cpu": "12", "memory": "8Gi", "nvidia.com/gpu": "2"}
    assert not [k for k in annotations(job) if k.startswith("hpcbridge.io/sbatch.")]


@pytest.mark.parametrize(("directive", "memory"), [("--mem=4096", "4Gi"), ("--mem=1500M", "1500Mi"),
                                                   ("--mem=2T", "2048Gi"), ("--mem=100K", "1Mi")])
def test_memory_quantity(directive: str, memory: str) -> None:
    assert requests(convert(directive)[0])["memory"] == memory


def test_mem_zero_means_whole_node() -> None:
    job, report = convert("--mem=0")
    assert "memory" not in requests(job)
    assert annotations(job)["hpcbridge.io/sbatch.mem"] == "0"


def test_ntasks_derives_tasks_per_node_and_stays_verbatim() -> None:
    job, report = convert("-N 2 -n 7 -c 2")
    assert job.spec.trainer.num_proc_per_node == 4
    assert requests(job)["cpu"] == "8"
    assert annotations(job)["hpcbridge.io/sbatch.ntasks"] == "7"
    assert any("--ntasks=7" in line for line in report)


def test_node_range_keeps_minimum_and_range() -> None:
    job, report = convert("--nodes=2-8")
    assert job.spec.trainer.num_nodes == 2
    assert annotations(job)["hpcbridge.io/sbatch.nodes"] == "2-8"


@pytest.mark.parametrize(("directive", "gpus", "verbatim"), [
    # the GPU request's spelling is kept for Slurm (slurm-gpus, which other backends need not honour: the
    # count is in the resources); what a count cannot say goes verbatim (sbatch.*, refused off Slurm)
    ("--gpus-per-node=4", "4", {}),
    ("--gpus-per-node=a100:4", "4", {"hpcbridge.io/slurm-gpus": "gpus-per-node=a100:4"}),
    ("--gres=gpu:2", "2", {"hpcbridge.io/slurm-gpus": "gres=gpu:2"}),
    ("--gres=gpu", "1", {"hpcbridge.io/slurm-gpus": "gres=gpu"}),
    ("--gres=gpu:a100:2", "2", {"hpcbridge.io/slurm-gpus": "gres=gpu:a100:2"}),
    ("--gres=gpu:a100:2,gpu:v100:1", "3", {"hpcbridge.io/slurm-gpus": "gres=gpu:a100:2,gpu:v100:1"}),
    ("--gres=gpu:2,nvme:1", "2", {"hpcbridge.io/sbatch.gres": "gpu:2,nvme:1"}),
    ("--gres=nvme:1", None, {"hpcbridge.io/sbatch.gres": "nvme:1"}),
    ("-N 2 --gpus=8", "4", {"hpcbridge.io/slurm-gpus": "gpus=8"}),
    ("-G 8", None, {"hpcbridge.io/sbatch.gpus": "8"}),
    ("-N 3 --gpus=8", None, {"hpcbridge.io/sbatch.gpus": "8"}),
])
def test_gpus(directive: str, gpus: str | None, verbatim: dict[str, str]) -> None:
    job, _ = convert(directive)
    assert requests(job).get("nvidia.com/gpu") == gpus
    assert {k: v for k, v in annotations(job).items()
            if k.startswith(("hpcbridge.io/sbatch.", "hpcbridge.io/slurm-"))} == verbatim
    # Slurm is asked in the user's spelling, once
    block = dict(directive_block(job))
    option, _, value = (verbatim.get("hpcbridge.io/slurm-gpus") or "").partition("=")
    if option:
        assert block.get(option) == value and (option == "gpus-per-node" or "gpus-per-node" not in block)


@pytest.mark.parametrize(("directives", "problem"), [
    (["--mem=4G", "--mem-per-cpu=1G"], "mutually exclusive"),
    (["-c 2", "--cpus-per-gpu=4"], "mutually exclusive"),
    (["--gres=gpu:2", "--gpus-per-node=2"], "GPUs per node once"),
    (["-v -Q"], "both --verbose"),
])
def test_conflicting_options(directives: list[str], problem: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        convert(*directives)
    assert problem in str(excinfo.value)
    assert "#SBATCH line" in excinfo.value.field
    assert "\n" not in str(excinfo.value)


def test_knob_annotations() -> None:
    job, _ = convert("-p gpu -A proj-1 -q high -C 'a100&ib' --exclusive -a 0-15%4 -d afterok:12:13",
                     "-o out-%x-%j.log -e err-%u-%N-%A-%a.log -D /scratch/run")
    assert annotations(job) == {
        "hpcbridge.io/partition": "gpu", "hpcbridge.io/account": "proj-1", "hpcbridge.io/qos": "high",
        "hpcbridge.io/constraint": "a100&ib", "hpcbridge.io/exclusive": "true", "hpcbridge.io/array": "0-15%4",
        "hpcbridge.io/dependency": "afterok:12:13", "hpcbridge.io/output": "out-%x-%j.log",
        "hpcbridge.io/error": "err-%u-%N-%A-%a.log", "hpcbridge.io/workdir": "/scratch/run",
    }


def test_knob_the_planner_refuses_travels_verbatim() -> None:
    # sbatch takes a list of partitions; hpc-bridge's partition annotation takes one name
    job, report = convert("-p debug,long")
    assert annotations(job) == {"hpcbridge.io/sbatch.partition": "debug,long"}
    assert any("not accepted as hpcbridge.io/partition" in line for line in report)


@pytest.mark.parametrize(("directive", "option", "value"), [
    ("--signal=B:USR1@120", "signal", "B:USR1@120"), ("--requeue", "requeue", "true"),
    ("--no-requeue", "no-requeue", "true"), ("-w node[1-4]", "nodelist", "node[1-4]"),
    ("-x node5", "exclude", "node5"), ("--mail-type=BEGIN,END", "mail-type", "BEGIN,END"),
    ("--mail-user=a@b.c", "mail-user", "a@b.c"), ("--comment='two words'", "comment", "two words"),
    ("--open-mode=append", "open-mode", "append"), ("--begin=16:00", "begin", "16:00"),
    ("--begin=now+2hours", "begin", "now+2hours"), ("--deadline=2030-01-02", "deadline", "2030-01-02"),
    ("-L lic:2", "licenses", "lic:2"), ("--reservation=r1", "reservation", "r1"), ("--wckey=k", "wckey", "k"),
    ("--nice=-5", "nice", "-5"), ("--nice", "nice", "true"), ("--priority=TOP", "priority", "TOP"),
    ("-O", "overcommit", "true"), ("-s", "oversubscribe", "true"), ("--spread-job", "spread-job", "true"),
    ("--switches=2@1:00:00", "switches", "2@1:00:00"), ("--tmp=20G", "tmp", "20G"), ("--mincpus=8", "mincpus", "8"),
    ("--sockets-per-node=2", "sockets-per-node", "2"), ("--cores-per-socket=8", "cores-per-socket", "8"),
    ("--threads-per-core=1", "threads-per-core", "1"), ("--ntasks-per-socket=4", "ntasks-per-socket", "4"),
    ("--ntasks-per-core=1", "ntasks-per-core", "1"), ("-m cyclic:block", "distribution", "cyclic:block"),
    ("--distribution=plane=4", "distribution", "plane=4"), ("--gpu-bind=closest", "gpu-bind", "closest"),
    ("--gpus-per-task=a100:1", "gpus-per-task", "a100:1"), ("--cpus-per-gpu=8", "cpus-per-gpu", "8"),
    ("--mem-per-gpu=20G", "mem-per-gpu", "20G"), ("--mem-per-cpu=2000", "mem-per-cpu", "2000"),
    ("-k", "no-kill", "true"), ("--wait-all-nodes=1", "wait-all-nodes", "1"), ("-W", "wait", "true"),
    ("-v", "verbose", "true"), ("-vvv", "verbose", "true"), ("-Q", "quiet", "true"), ("--export=ALL,A=1,B", "export", "ALL,A=1,B"),
    ("--export=NONE", "export", "NONE"), ("--exclusive=user", "exclusive", "user"),
    ("--time=UNLIMITED", "time", "UNLIMITED"), ("--propagate=STACK", "propagate", "STACK"),
    ("--hint=nomultithread", "hint", "nomultithread"),
])
def test_passthrough(directive: str, option: str, value: str) -> None:
    job, report = convert(directive)
    key = f"hpcbridge.io/sbatch.{option}"
    assert annotations(job) == {key: value}
    assert sum(line.endswith(f"passed through verbatim as {key}") for line in report) == 1


def test_hold_suspends() -> None:
    job, report = convert("-H")
    assert job.spec.suspend is True
    assert not annotations(job)


def test_passthrough_value_the_renderer_cannot_write_is_refused() -> None:
    # sbatch accepts an escaped quote; hpc-bridge's #SBATCH writer refuses quotes in values (plan.py)
    with pytest.raises(InvalidSpec) as excinfo:
        convert('--comment="say \\"hi\\""')
    one_line_error(excinfo, "#SBATCH line 2: --comment", 'say "hi"')


# --- names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "label"), [
    ("train", "train"), ("a--0", "a--0"), ("My_Job.v2", "my-job-v2"), ("a  b", "a-b"), ("123abc", "job-123abc"), ("---", "sbatch-job"),
    ("ÜberJob", "berjob"), ("a" * 80, "a" * 63), ("x" + "_" * 70 + "y", "x-y"), ("a" * 62 + "_bcd", "a" * 62),
])
def test_dns_label(given: str, label: str) -> None:
    assert dns_label(given) == label


def test_rename_is_reported_and_slurm_name_kept() -> None:
    job, report = convert("-J 'My Run'")
    assert job.name == "my-run"
    assert annotations(job) == {"hpcbridge.io/slurm-job-name": "My Run"}
    assert dict(directive_block(job))["job-name"] == "My Run"
    assert any("'My Run'" in line and "'my-run'" in line for line in report)


def test_default_name_is_the_script_file() -> None:
    job, report = to_trainjob(parse_script(script(), "jobs/train.sbatch"))
    assert job.name == "train-sbatch"
    # sbatch would call the job train.sbatch (squeue --name, singleton, %x): Slurm keeps that name
    assert annotations(job) == {"hpcbridge.io/slurm-job-name": "train.sbatch"}
    assert dict(directive_block(job))["job-name"] == "train.sbatch"
    assert to_trainjob(parse_script(script()))[0].name == "sbatch"


def test_explicit_name() -> None:
    job, _ = to_trainjob(parse_script(script("-J run1")), name="other")
    assert job.name == "other"
    assert annotations(job) == {"hpcbridge.io/slurm-job-name": "run1"}


# --- bodies ------------------------------------------------------------------------------------------------

HOSTILE_BODIES = [
    "echo \"$(whoami)\" '$(not run)' `date` $((1+2))\n",
    "cat <<'EOF'\n#SBATCH --time=1\n\"quotes' and \\ backslashes\nEOF\n",
    "printf '%s\\n' \"a\nb\"\n",
    "echo done",                                           # no trailing newline
    "x='\n#SBATCH --nodes=99\n'\necho \"$x\"\n",
    "echo ünïcödé ✓\n\n\n",
]


@pytest.mark.parametrize("body", HOSTILE_BODIES)
def test_body_is_kept_byte_for_byte(body: str) -> None:
    text = script("-N 1", body=body)
    job, _ = to_trainjob(parse_script(text, "job.sbatch"))
    assert job.spec.trainer.command == ["/bin/bash", "-c", SHEBANG + body, "job-sbatch"]
    assert job.spec.trainer.num_nodes == 1
    assert command_body(job.spec.trainer.command) == SHEBANG + body
    rendered = render(job)
    # the body travels as one quoted argument: its #SBATCH-looking lines never become directives
    assert exec_line(rendered) == f"exec {join(job.spec.trainer.command)}"
    again = parse_script(rendered)
    assert (again.get("nodes"), again.get("time")) == ("1", None)


def test_sbatch_line_after_a_command_is_ignored() -> None:
    job, _ = convert("-t 10", body="hostname\n#SBATCH --time=99 --bogus\n")
    assert job.spec.active_deadline_seconds == 600
    assert "#SBATCH --time=99 --bogus" in job.spec.trainer.command[2]


@pytest.mark.parametrize(("shebang", "command"), [
    ("#!/bin/bash", ["/bin/bash", "-c"]),
    ("#!/bin/sh", ["/bin/sh", "-c"]),
    ("#!/bin/bash -l", ["/bin/bash", "-l", "-c"]),
    ("#!/usr/bin/zsh", ["/usr/bin/zsh", "-c"]),
])
def test_shell_scripts_run_through_their_shell(shebang: str, command: list[str]) -> None:
    body = f"{shebang}\necho hi\n"
    argv = script_command(body, "n")
    assert argv == [*command, body, "n"]
    assert command_body(argv) == body


def test_other_interpreters_keep_their_shebang() -> None:
    body = "#!/usr/bin/env python3\nprint('hi')\n"
    argv = script_command(body, "n")
    assert argv[:2] == ["/bin/bash", "-c"] and argv[3:] == ["n", body, "/usr/bin/env", "python3"]
    assert command_body(argv) == body


@pytest.mark.parametrize("text", [
    "#!/bin/bash\n#SBATCH -N 1\necho \"[$0] $(echo sub) '$x'\"\nexit 3\n",
    "#!/bin/sh\n#SBATCH -J t\nprintf '%s\\n' \"a b\" 'c\nd'\n#SBATCH --time=1\nexit 3\n",
    "#!/usr/bin/env python3\n#SBATCH -n 1\nimport sys\nprint('py', len(sys.argv))\nsys.exit(3)\n",
])
def test_script_command_runs_like_the_script(text: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    path.chmod(0o755)
    job, _ = to_trainjob(parse_script(text, str(path)))
    expected = subprocess.run([str(path)], capture_output=True, text=True)
    got = subprocess.run(job.spec.trainer.command, capture_output=True, text=True)
    assert (got.returncode, got.stdout.replace("job-sbatch", str(path))) == (3, expected.stdout)
    assert expected.returncode == 3
    rendered = tmp_path / "rendered.sbatch"
    rendered.write_text(render(job))
    got = subprocess.run(["/bin/bash", str(rendered)], capture_output=True, text=True, cwd=tmp_path)
    assert (got.returncode, got.stdout.replace("job-sbatch", str(path))) == (3, expected.stdout)


def test_relative_interpreter_is_refused() -> None:
    with pytest.raises(InvalidSpec):
        script_command("#!bash\necho\n", "n")


def test_exec_form_is_the_command() -> None:
    job, _ = convert(body="exec python3 train.py --lr 0.1\n")
    assert job.spec.trainer.command == ["python3", "train.py", "--lr", "0.1"]
    job, _ = convert(body="export A='x y'\nexec ./run\n")
    assert job.spec.trainer.command == ["./run"]
    assert [(e.name, e.value) for e in job.spec.trainer.env] == [("A", "x y")]
    # anything the shell would interpret stays a script
    job, _ = convert(body="exec python3 $HOME/train.py\n")
    assert job.spec.trainer.command[0] == "/bin/bash"


def test_exec_form_guards_leading_dashes() -> None:
    assert exec_body(["-l", "x"]) == "#!/bin/bash\nexec -- -l x\n"
    assert parse_exec_body("#!/bin/bash\nexec -- -l x\n") == (["-l", "x"], [])
    assert parse_exec_body("#!/bin/bash\nexec -l x\n") is None          # bash's own exec option
    assert parse_exec_body("#!/bin/bash\nexec -- x\n") is None          # not what exec_body writes
    assert parse_exec_body("#!/bin/bash\nexec a  b\n") is None


@pytest.mark.parametrize("words", [["plain"], ["two words", "it's", '"dq"'], ["$(id)", "`id`", "$HOME", "*", "~"],
                                   ["new\nline", "tab\tx", "back\\slash", ""], ["ünï", "-l", "-a", "x", "--"]])
def test_exec_body_runs_under_bash(words: list[str], tmp_path: Path) -> None:
    argv = ["printf", "<%s>", *words]
    env = [("HOSTILE", "$(id) 'q' \"d\"\nline2")]
    body = exec_body(argv, env)
    out = subprocess.run(["/bin/bash", "-c", body, "n"], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout == "".join(f"<{w}>" for w in words) if words else "<>"
    probe = exec_body(["printenv", "HOSTILE"], env)
    out = subprocess.run(["/bin/bash", "-c", probe, "n"], capture_output=True, text=True, check=True)
    assert out.stdout == env[0][1] + "\n"


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))),
                min_size=1, max_size=5),
       st.lists(st.tuples(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
                          st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)))),
                max_size=3))
def test_exec_body_inverts(argv: list[str], env: list[tuple[str, str]]) -> None:
    assert parse_exec_body(exec_body(argv, env)) == (argv, env)


# --- flags and merging -------------------------------------------------------------------------------------


def test_flags_override_directives() -> None:
    request = merge(parse_script(script("-N 2 -t 10 -p debug --requeue")),
                    parse_flags(["-N", "4", "--time=1:00:00", "--no-requeue", "-Jflagged"]))
    assert {k: d.value for k, d in request.options.items()} == {
        "nodes": "4", "time": "1:00:00", "partition": "debug", "no-requeue": None, "job-name": "flagged"}
    assert request.options["nodes"].where == "command line: -N"
    assert request.options["partition"].where == "#SBATCH line 2: -p"
    job, _ = to_trainjob(request)
    assert (job.spec.trainer.num_nodes, job.spec.active_deadline_seconds, job.name) == (4, 3600, "flagged")


def test_flags_are_argv_items_not_directive_text() -> None:
    request = parse_flags(["--comment", "a \"b\" # c"])
    assert request.get("comment") == "a \"b\" # c"


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["--nodes"], "command line: --nodes", "--nodes"),
    (["job.sbatch"], "command line", "job.sbatch"),
    (["--time=forever"], "command line: --time", "forever"),
    (["--partition=debug\n"], "command line: --partition", "debug"),     # would split a #SBATCH line
    (["--comment", "a\tb"], "command line: --comment", "a\\tb"),
    (["--time=5\n"], "command line: --time", "5"),
    (["-N", "2\n"], "command line: -N", "2"),
])
def test_flag_errors(argv: list[str], field: str, value: str) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        parse_flags(argv)
    one_line_error(excinfo, field, value)


def test_flags_alone_need_a_body() -> None:
    with pytest.raises(InvalidSpec, match="no script body"):
        to_trainjob(parse_flags(["-N", "2"]))
    job, _ = to_trainjob(parse_flags(["-N", "2"]), SHEBANG + "hostname\n", name="adhoc")
    assert job.spec.trainer.num_nodes == 2


# --- TrainJob → script (the Slurm renderer) ----------------------------------------------------------------


def trainjob(runtime: str = SBATCH_RUNTIME, **spec) -> TrainJob:
    spec.setdefault("managedBy", "hpcbridge.io/bridge")
    return TrainJob.model_validate(trainjob_doc("job", runtime=runtime, **spec))


def test_plain_trainjob_renders_and_converts_back() -> None:
    job = trainjob(trainer={"command": ["python3", "train.py", "--msg", "hello world"], "numNodes": 2,
                            "numProcPerNode": 4, "env": [{"name": "A", "value": "1 2"}],
                            "resourcesPerNode": {"requests": {"cpu": "8", "memory": "1536Mi"},
                                                 "limits": {"nvidia.com/gpu": 2}}},
                   activeDeadlineSeconds=90061, suspend=True)
    text = render(job)
    request = parse_script(text)
    assert {name: d.value for name, d in request.options.items()} == {
        "job-name": "job", "comment": f"hpcbridge.io/uid={derive_uid(job)}", "nodes": "2", "ntasks-per-node": "4",
        "cpus-per-task": "2", "mem": "1536M", "gpus-per-node": "2", "time": "1-01:01:01", "hold": None}
    assert "export A='1 2'\n" in text and text.endswith("exec python3 train.py --msg 'hello world'\n")
    again, _ = to_trainjob(request)
    assert again.spec.trainer.command == script_command(request.body, "job")
    assert (again.spec.trainer.num_nodes, again.spec.trainer.num_proc_per_node) == (2, 4)
    assert requests(again) == {"cpu": "8", "memory": "1536Mi", "nvidia.com/gpu": "2"}
    assert (again.spec.active_deadline_seconds, again.spec.suspend) == (90061, True)


def _torch_from_script() -> TrainJob:
    text = script("-N 2", "--gpus-per-node=4", "-t 60", body="exec python3 train.py --lr 0.1\n")
    job, _ = to_trainjob(parse_script(text, "train.sbatch"), runtime="torch-distributed")
    assert job.spec.trainer.command == ["python3", "train.py", "--lr", "0.1"]
    return job


def _torch_trainjob() -> TrainJob:
    return trainjob("torch-distributed", trainer={"command": ["python3", "train.py", "--lr", "0.1"], "numNodes": 2,
                                                  "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}})


@pytest.mark.parametrize("make", [_torch_from_script, _torch_trainjob], ids=["sbatch", "trainjob"])
def test_two_node_torch_job_launches_through_torchrun(make) -> None:
    text = render(make())
    line = exec_line(text)
    # one `hpcbridge launch` per node starts torchrun with the rendezvous; never the bare training command
    assert "exec python3 train.py" not in text
    assert line.startswith("exec srun --nodes=2 --ntasks-per-node=1 ")
    assert " hpcbridge launch --launcher torchrun " in line
    assert " --nodes 2 " in line and " --procs-per-node 4 " in line
    assert line.endswith(" -- python3 train.py --lr 0.1")
    request = parse_script(text)
    assert (request.get("nodes"), request.get("ntasks-per-node"), request.get("gpus-per-node")) == ("2", "1", "4")


@pytest.mark.parametrize(("trainer", "field"), [
    ({"command": ["x"], "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}, "env 'A'.valueFrom"),
    ({"command": ["x"], "env": [{"name": "A-B", "value": "1"}]}, "env 'A-B'"),
    ({}, "spec.trainer.command"),
])
def test_render_refuses_what_a_batch_script_cannot_say(trainer, field) -> None:
    with pytest.raises(InvalidSpec) as excinfo:
        render(trainjob(trainer=trainer))
    assert excinfo.value.field == field
    assert "\n" not in str(excinfo.value)


def test_render_checks_annotations() -> None:
    job = trainjob(trainer={"command": ["x"], "numNodes": 3})
    job.metadata.annotations = {"hpcbridge.io/sbatch.nodes": "2-4"}
    # a verbatim option comes after the renderer's own, so sbatch's last-wins rule keeps it
    assert parse_script(render(job)).get("nodes") == "2-4"
    for key in ("hpcbridge.io/partiton", "hpcbridge.io/comment"):
        job.metadata.annotations = {key: "x"}
        with pytest.raises(InvalidSpec, match="unknown hpc-bridge annotation"):
            render(job)
    job.metadata.annotations = {"hpcbridge.io/output": "two\nlines"}
    with pytest.raises(InvalidSpec) as excinfo:
        render(job)
    assert excinfo.value.field == "metadata.annotations[hpcbridge.io/output]"
    job.metadata.annotations = {"hpcbridge.io/cluster": "hpc-east"}
    assert "hpc-east" not in render(job)


def test_rendered_flag_pass_through_reads_back() -> None:
    job, _ = convert("--requeue", "--nice", "-O")
    again = parse_script(render(job))
    assert {name: again.get(name) for name in ("requeue", "nice", "overcommit")} == dict.fromkeys(
        ("requeue", "nice", "overcommit"))


def test_unknown_pass_through_option_is_refused_before_submit() -> None:
    job = trainjob(trainer={"command": ["x"]})
    job.metadata.annotations = {"hpcbridge.io/sbatch.bogus": "1"}
    with pytest.raises(InvalidSpec):
        render(job)


# --- round trips -------------------------------------------------------------------------------------------

_UID_COMMENT = re.compile(r"(?:^| )hpcbridge\.io/uid=\S*\Z")


def normalised(request: SbatchRequest, default_name: str) -> dict[str, object]:
    """Options by meaning: units resolved, the forms the converter rewrites in their canonical form, and what
    the renderer adds on its own (uid comment, default output) as defaults. Node and task options are compared
    as given: a script's converted TrainJob asks Slurm for exactly the ones the script asked for."""
    out: dict[str, object] = {name: d.value for name, d in request.options.items()}
    out.setdefault("job-name", default_name)
    out.setdefault("output", DEFAULT_OUTPUT)
    if "comment" in out:
        out["comment"] = _UID_COMMENT.sub("", out["comment"]) or None  # type: ignore[arg-type]
        if out["comment"] is None:
            del out["comment"]
    if "time" in out:
        out["time"] = time_seconds(out["time"])  # type: ignore[arg-type]
    if "mem" in out:
        out["mem"] = size_mb(out["mem"])  # type: ignore[arg-type]
    low = 1
    if "nodes" in out:
        low, high = node_range(out["nodes"])  # type: ignore[arg-type]
        out["nodes"] = (low, high)
    if out.get("exclusive") == "exclusive":
        out["exclusive"] = None
    if "gres" in out:
        items = gres_items(out.pop("gres"))  # type: ignore[arg-type]
        gpus = [i for i in items if i.name == "gpu"]
        others = [i.text for i in items if i.name != "gpu"]
        if gpus:
            out["gpus-per-node"] = ",".join(f"{i.kind}:{i.count}" if i.kind else i.count for i in gpus)
        if others:
            out["gres"] = ",".join(others)
    nodes_min = low
    if "gpus" in out and "gpus-per-node" in out:
        total = sum(c for _, c in gpu_counts(out["gpus"]))  # type: ignore[arg-type]
        per = gpu_counts(out["gpus-per-node"])  # type: ignore[arg-type]
        if len(per) == 1 and per[0][0] is None and per[0][1] * nodes_min == total:
            del out["gpus-per-node"]
    return out


@pytest.mark.parametrize("path", sorted(CASES.glob("*.sbatch")), ids=lambda p: p.name)
def test_case_scripts_round_trip(path: Path) -> None:
    # sbatch → TrainJob → rendered script → the same options, and a script that runs the same body
    text = path.read_text(encoding="utf-8")
    request = parse_script(text, str(path))
    job, report = to_trainjob(request)
    assert command_body(job.spec.trainer.command) == request.body
    written = render(job)
    assert exec_line(written) == f"exec {join(job.spec.trainer.command)}"
    again = parse_script(written, str(path))
    assert normalised(again, job.name) == normalised(request, default_job_name(str(path)))
    # converting the rendered script back and rendering again asks Slurm for the same thing
    job_again, _ = to_trainjob(again)
    assert directive_block(job_again) == directive_block(job)


def test_case_mpi_job() -> None:
    job, report = to_trainjob(parse_script((CASES / "mpi-lammps.sbatch").read_text(), "mpi-lammps.sbatch"))
    assert job.name == "lammps-lj"
    assert (job.spec.trainer.num_nodes, job.spec.trainer.num_proc_per_node) == (4, 32)
    assert requests(job) == {"cpu": "32", "memory": "180Gi"}
    assert job.spec.active_deadline_seconds == 12 * 3600
    assert annotations(job)["hpcbridge.io/exclusive"] == "true"
    assert job.spec.trainer.command[-1] == "lammps-lj"
    assert job.spec.runtime_ref.name == SBATCH_RUNTIME and job.spec.managed_by == "hpcbridge.io/bridge"


def test_case_gpu_array_job() -> None:
    job, _ = to_trainjob(parse_script((CASES / "gpu-sweep.sbatch").read_text(), "gpu-sweep.sbatch"))
    assert requests(job) == {"cpu": "16", "nvidia.com/gpu": "4"}
    assert annotations(job)["hpcbridge.io/array"] == "0-15%4"
    assert annotations(job)["hpcbridge.io/slurm-gpus"] == "gres=gpu:a100:4"
    assert job.spec.trainer.command[:3] == ["/bin/bash", "-l", "-c"]


def test_case_many_options_are_all_reported() -> None:
    request = parse_script((CASES / "many-options.sbatch").read_text(), "many-options.sbatch")
    job, report = to_trainjob(request)
    verbatim = [k for k in annotations(job) if k.startswith("hpcbridge.io/sbatch.")]
    assert len(verbatim) >= 30
    for key in verbatim:
        assert sum(line.endswith(f"passed through verbatim as {key}") for line in report) == 1, key
    assert job.spec.suspend is True
    assert "time" not in request                      # the #SBATCH line after `echo` was not read


_NAME = st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
_SAFE = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=12)
_BODY_TEXT = st.text(alphabet=st.characters(blacklist_characters="\x00\r", blacklist_categories=("Cs",)),
                     max_size=80)
_ARGV = st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                         max_size=15), min_size=1, max_size=4)


@st.composite
def trainjobs(draw) -> TrainJob:
    """TrainJobs on the sbatch runtime the Slurm renderer writes a batch script for."""
    trainer: dict[str, object] = {}
    if draw(st.booleans()):
        trainer["command"] = script_command(SHEBANG + "true\n" + draw(_BODY_TEXT), "placeholder")
    else:
        trainer["command"] = draw(_ARGV)
        env = draw(st.lists(st.tuples(st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True), _BODY_TEXT),
                            max_size=2, unique_by=lambda e: e[0]))
        if env:
            trainer["env"] = [{"name": n, "value": v} for n, v in env]
    nodes = draw(st.none() | st.integers(1, 64))
    tasks = draw(st.none() | st.integers(1, 64))
    if nodes is not None:
        trainer["numNodes"] = nodes
    if tasks is not None:
        trainer["numProcPerNode"] = tasks
    req: dict[str, str] = {}
    if draw(st.booleans()):
        req["cpu"] = str(draw(st.integers(1, 16)) * (tasks or 1))
    if draw(st.booleans()):
        req["memory"] = draw(st.sampled_from(["1Gi", "1536Mi", "4Gi", "100Mi", "1024Gi"]))
    if draw(st.booleans()):
        req["nvidia.com/gpu"] = str(draw(st.integers(1, 8)))
    if req:
        trainer["resourcesPerNode"] = {"requests": req}
    spec: dict[str, object] = {"runtimeRef": {"name": SBATCH_RUNTIME}, "managedBy": "hpcbridge.io/bridge",
                               "trainer": trainer}
    if draw(st.booleans()):
        spec["activeDeadlineSeconds"] = draw(st.integers(1, 10**7))
    if draw(st.booleans()):
        spec["suspend"] = True
    notes: dict[str, str] = {}
    for knob in ("partition", "account", "qos"):
        if draw(st.booleans()):
            notes[f"hpcbridge.io/{knob}"] = draw(_SAFE)
    if draw(st.booleans()):
        notes["hpcbridge.io/exclusive"] = "true"
    if draw(st.booleans()):
        notes["hpcbridge.io/array"] = draw(st.sampled_from(["0-15%4", "1,3,5-7", "0-99:2"]))
    if draw(st.booleans()):
        notes["hpcbridge.io/output"] = draw(st.sampled_from(["out %x-%j.log", "logs/%A_%a.out", "a#b"]))
    # no flags ("requeue": "true"): see test_rendered_flag_pass_through_reads_back
    extra = draw(st.dictionaries(st.sampled_from(["comment", "mail-type", "signal", "reservation", "wckey", "nice"]),
                                 st.just("x"), max_size=3))
    values = {"comment": "a b # c", "mail-type": "END,FAIL", "signal": "B:USR1@60", "reservation": "r1",
              "wckey": "w", "nice": "5"}
    notes.update({f"hpcbridge.io/sbatch.{k}": values[k] for k in extra})
    name = draw(_NAME)
    metadata: dict[str, object] = {"name": name}
    if notes:
        metadata["annotations"] = dict(sorted(notes.items()))
    command = trainer["command"]
    if command[-1] == "placeholder":  # type: ignore[index]
        command[-1] = name  # type: ignore[index]
    return TrainJob.model_validate({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                    "metadata": metadata, "spec": spec})


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(trainjobs())
def test_trainjob_script_trainjob_keeps_the_request(job: TrainJob) -> None:
    text = render(job)
    assert exec_line(text) == f"exec {join(job.spec.trainer.command)}"
    again, _ = to_trainjob(parse_script(text, "x.sbatch"))
    trainer, back = job.spec.trainer, again.spec.trainer
    assert again.name == job.name
    assert (back.num_nodes, back.num_proc_per_node) == (trainer.num_nodes or 1, trainer.num_proc_per_node or 1)
    assert requests(again) == requests(job)
    assert (again.spec.active_deadline_seconds, again.spec.suspend) == (job.spec.active_deadline_seconds,
                                                                        job.spec.suspend)
    # and rendering the converted script asks Slurm for exactly what the first rendering did
    assert directive_block(again) == directive_block(job)


_OPTION_VALUES = {
    "nodes": st.sampled_from(["1", "2", "3-5", "4"]), "ntasks": st.sampled_from(["1", "6", "16"]),
    "ntasks-per-node": st.sampled_from(["1", "2", "8"]), "cpus-per-task": st.sampled_from(["1", "4"]),
    "mem": st.sampled_from(["4G", "1000", "1500M", "2T", "100K"]), "time": st.sampled_from(
        ["90", "0:30", "1:00:00", "2-12", "1-2:30", "1-02:03:04", "UNLIMITED"]),
    "gres": st.sampled_from(["gpu:2", "gpu:a100:4", "gpu:2,nvme:1", "nvme:1"]),
    "gpus": st.sampled_from(["4", "a100:2"]), "partition": st.sampled_from(["debug", "a,b"]),
    "account": st.just("proj"), "qos": st.just("high"), "constraint": st.just("a100|h100"),
    "exclusive": st.sampled_from([None, "user"]), "array": st.just("0-9%2"), "dependency": st.just("afterok:1"),
    "output": st.sampled_from(["o-%j.out", "my out %x.log"]), "error": st.just("e-%j.err"),
    "chdir": st.just("/tmp/run dir"), "job-name": st.sampled_from(["Run_1", "run"]), "hold": st.just(None),
    "signal": st.just("USR1@60"), "mail-type": st.just("ALL"), "comment": st.just("hello world"),
    "export": st.just("ALL,A=1"), "nice": st.just("3"),
}  # no flags passed through verbatim (--requeue, --nice): see test_rendered_flag_pass_through_reads_back


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(_OPTION_VALUES)), st.none(), max_size=8).flatmap(
    lambda keys: st.fixed_dictionaries({k: _OPTION_VALUES[k] for k in keys})), _BODY_TEXT)
def test_script_trainjob_script_keeps_options_and_body(options: dict[str, str | None], tail: str) -> None:
    assume(not ({"gres", "gpus"} <= set(options)))
    args = [directive_arg(name, value, "test") for name, value in options.items()]
    text = script(*args, body="true\n" + tail)
    request = parse_script(text, "prop.sbatch")
    job, _ = to_trainjob(request)
    assert command_body(job.spec.trainer.command) == request.body == SHEBANG + "true\n" + tail
    written = render(job)
    assert exec_line(written) == f"exec {join(job.spec.trainer.command)}"
    again = parse_script(written, "prop.sbatch")
    assert normalised(again, job.name) == normalised(request, "prop.sbatch")


# --- the runtime and the planner ---------------------------------------------------------------------------


def test_runtime_and_planner_accept_every_converted_case() -> None:
    runtime = sbatch_runtime()
    assert runtime.name == SBATCH_RUNTIME and runtime.spec.ml_policy.framework == "plain"
    for path in sorted(CASES.glob("*.sbatch")):
        job, _ = to_trainjob(parse_script(path.read_text(), path.name))
        for cluster in (builtin_local_cluster(), SLURM):
            plan = resolve(job, runtime, cluster)
            assert plan.launcher == Launcher.SCRIPT  # the body runs once, as sbatch runs it
            assert plan.command == tuple(job.spec.trainer.command)
            # off Slurm the options that change nothing about the job are dropped, each with a note
            kept = {**dict(plan.options.sbatch_extra), **{o: v for o, v, _ in plan.options.dropped}}
            assert kept == {
                k.removeprefix("hpcbridge.io/sbatch."): v for k, v in annotations(job).items()
                if k.startswith("hpcbridge.io/sbatch.")}
