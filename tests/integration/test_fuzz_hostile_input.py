"""Hostile input (issue #24): no value ever becomes a command or a directive, no input crashes or exhausts
hpc-bridge — the fast deterministic subset of ``bench/fuzz_hostile.py``.

A fixed slice of the generated inputs (tests/fuzz/generator.py, seed 24) goes through every command —
validate, render (configured cluster and --to slurm|flux|kubernetes|local), convert --to
trainjob|sbatch|jobspec|jobset, submit --dry-run — each run bounded by RLIMIT_AS/RLIMIT_CPU, and every oracle of
tests/fuzz/oracles.py judges it: exit 0 or 2, no traceback, one-line messages, nothing stopped by the bound,
rendered scripts run under ``bash -x`` against stubs without running a payload, the #SBATCH block exactly what
the renderer meant (nothing privileged), and every rendered Kubernetes object accepted by the real API server
(dry-run). The oracles themselves are checked first on artifacts known to be bad.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.fuzz.generator import COMMANDS, SEED, Case, generate, subset
from tests.fuzz.oracles import (
    API_REFUSAL,
    INJECTION,
    OVER_BOUND,
    STDERR,
    TRACEBACK,
    CaseResult,
    Run,
    Sandbox,
    Summary,
    check_directives,
    check_kubernetes,
    judge,
    judge_process,
    run_case,
    set_limits,
)

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

#: the fast slice: every EVERY-th input of the field × payload kinds (see generator.subset)
EVERY = 12
#: heavy (exhaustion) inputs run through the real entry point with these commands only in the fast slice
HEAVY_COMMANDS = {("validate", "{file}"), ("render", "{file}", "--to", "kubernetes", "-o", "json")}


@functools.cache
def _cases() -> list[Case]:
    return generate(SEED)


def _fast_cases() -> list[Case]:
    return subset(_cases(), EVERY)


@pytest.fixture(scope="module")
def fuzz_results(tmp_path_factory: pytest.TempPathFactory) -> list[CaseResult]:
    # hpc-bridge imported once: each forked run then starts in milliseconds
    import bridge.adapters.flux  # noqa: F401
    import bridge.adapters.kubernetes  # noqa: F401
    import bridge.adapters.local  # noqa: F401
    import bridge.adapters.slurm  # noqa: F401
    import bridge.cli  # noqa: F401
    import bridge.service  # noqa: F401

    base = tmp_path_factory.mktemp("fuzz")
    sandbox = Sandbox(base)
    results = []
    for case in _fast_cases():
        only = (lambda template: template in HEAVY_COMMANDS) if case.heavy else None
        results.append(run_case(case, base, sandbox, subprocess_every=40, only=only))
    return results


def _report(findings, limit: int = 25) -> str:
    summary = Summary(findings=list(findings))
    lines = summary.problem_lines()
    return f"{len(findings)} finding(s), {len(lines)} distinct problem(s):\n" + "\n".join(lines[:limit])


# --- the generator and the oracles ------------------------------------------------------------------------


def test_generator_is_deterministic_and_covers_the_issue() -> None:
    first, second = _cases(), generate(SEED)
    assert [(c.id, c.data, c.config, c.flags) for c in first] == [(c.id, c.data, c.config, c.flags) for c in second]
    assert len(first) >= 500
    kinds = Counter(c.kind for c in first)
    assert set(kinds) == {"trainjob", "runtime", "config", "types", "yaml", "file", "sbatch", "flags"}
    fields = {c.field for c in first}
    for wanted in ("metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels.key",
                   "metadata.annotations.value", "annotations.hpcbridge.io/partition",
                   "annotations.hpcbridge.io/sbatch.<opt>", "spec.runtimeRef.name", "runtime.metadata.name",
                   "spec.trainer.command[0]", "spec.trainer.args[0]", "spec.trainer.env[0].name",
                   "spec.trainer.env[0].value", "spec.trainer.image", "spec.trainer.resourcesPerNode.requests.cpu",
                   "spec.runtimePatches.env", "slurm:cluster.metadata.name", "slurm:defaults.constraint",
                   "flux:defaults.workdir", "slurm:defaults.launchCommand[0]", "slurm:accountMapping.value",
                   "flux:flux.uri", "flux:flux.environment.value", "slurm:slurm.host", "slurm:slurm.user"):
        assert wanted in fields, wanted
    payloads = {c.payload for c in first}
    for wanted in ("newline", "cr", "nul", "squote", "dquote", "cmdsubst", "backtick", "semicolon", "hash",
                   "u2028", "u0085", "bidi", "overlong", "billion-laughs", "alias-cycle", "deep-list-100000",
                   "2**31", "1e308", "bool", "empty", "random-bytes", "uid=0", "gid=0", "get-user-env",
                   "quote-smuggle-jobname", "lone-cr", "crlf"):
        assert wanted in payloads, wanted
    fast = _fast_cases()
    assert {c.kind for c in fast} == set(kinds) and len(fast) >= 150


def _fake_run(case: Case, argv: tuple[str, ...], stdout: str, directives=None, code: int = 0,
              stderr: str = "") -> Run:
    return Run(case, argv, "fork", code, None, stdout.encode(), stderr.encode(), directives)


def test_oracles_catch_known_bad_artifacts(tmp_path: Path) -> None:
    """Each oracle fires on an artifact made to fail it: an empty finding list below means something."""
    case = Case(index=9999, kind="trainjob", field="metadata.namespace", payload="newline", data=b"")
    sandbox = Sandbox(tmp_path)
    good = ("#!/bin/bash\n#SBATCH --job-name=fz\n#SBATCH --comment=\"a b\"\n\nset -eu\n"
            "export A=$'a\\ntouch FZMARK-9999 #'\nexec srun hpcbridge launch -- python3 '$(touch FZMARK-9999)'\n")
    meant = [[["job-name", "fz"], ["comment", "a b"]]]
    injected = good.replace("\nset -eu", "\n# ns a\ntouch FZMARK-9999 #/fz\nset -eu")
    smuggled = good.replace("--comment=\"a b\"", "--comment=\"a\" --uid=0")
    extra_line = good.replace("\n\nset -eu", "\n#SBATCH --gid=0\n\nset -eu")
    argv = ("convert", "input.yaml", "--to", "sbatch")

    def findings(script: str) -> list[str]:
        result = CaseResult(case)
        judge(_fake_run(case, argv, script, meant), sandbox, result)
        return [f"{f.kind}: {f.detail}" for f in result.findings]

    assert findings(good) == []
    assert any("payload ran" in f for f in findings(injected)), findings(injected)
    assert any("privileged" in f for f in findings(smuggled)), findings(smuggled)
    assert any("differ" in f for f in findings(smuggled)), findings(smuggled)
    assert any("privileged" in f for f in findings(extra_line)) and any("line scan" in f for f in findings(extra_line))
    run = _fake_run(case, argv, good, meant)
    assert {f.kind for f in check_directives(run, good.replace("a b", "a\rb"))} == {INJECTION}
    # process oracles
    assert [f.kind for f in judge_process(_fake_run(case, argv, "", code=1, stderr=(
        "Traceback (most recent call last):\n  File \"x\"\nKeyError: 'x'\n")))] == [TRACEBACK]
    assert [f.kind for f in judge_process(_fake_run(case, argv, "", code=2, stderr=(
        "hpcbridge: error: x: bad (got 'a\nb')\n")))] == [STDERR]
    assert judge_process(_fake_run(case, argv, "", code=2, stderr="hpcbridge: note: n\nhpcbridge: error: e\n")) == []
    killed = Run(case, argv, "subprocess", None, signal.SIGXCPU, b"", b"")
    assert [f.kind for f in judge_process(killed)] == [OVER_BOUND]


def test_the_bound_stops_a_runaway_process() -> None:
    """RLIMIT_CPU and RLIMIT_AS as the harness sets them end a process that spins or allocates."""
    def tight() -> None:
        set_limits()
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (1, 2))

    spin = subprocess.run([sys.executable, "-c", "while True: pass"], preexec_fn=tight, timeout=60)
    assert spin.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
    hog = subprocess.run([sys.executable, "-c", "x = bytearray(2 << 30)"], preexec_fn=set_limits, timeout=60,
                         capture_output=True)
    assert b"MemoryError" in hog.stderr


# --- the hostile inputs -----------------------------------------------------------------------------------


def test_hostile_inputs_run_every_command(fuzz_results: list[CaseResult]) -> None:
    runs = [run for result in fuzz_results for run in result.runs]
    assert {run.argv[0] for run in runs} == {c[0] for c in COMMANDS}
    assert any(run.mode == "subprocess" for run in runs) and any(run.mode == "fork" for run in runs)
    # the slice exercises both sides: inputs that are refused and inputs whose artifacts are checked
    assert sum(run.returncode == 0 for run in runs) >= 100
    assert sum(run.returncode == 2 for run in runs) >= 100


@pytest.mark.parametrize("kind", [INJECTION, TRACEBACK, OVER_BOUND])
def test_no_hostile_input_injects_crashes_or_exhausts(fuzz_results: list[CaseResult], kind: str) -> None:
    findings = [f for result in fuzz_results for f in result.findings if f.kind == kind]
    assert not findings, _report(findings)


def test_exit_codes_and_messages(fuzz_results: list[CaseResult]) -> None:
    """Exit 0 or 2 only; a refusal is one error line; an accepted artifact reads back."""
    findings = [f for result in fuzz_results for f in result.findings
                if f.kind not in (INJECTION, TRACEBACK, OVER_BOUND)]
    assert not findings, _report(findings)


@pytest.mark.kubernetes
def test_rendered_kubernetes_objects_pass_the_api_server(fuzz_results: list[CaseResult], kube_api) -> None:
    findings, checked = check_kubernetes(fuzz_results, kube_api)
    assert checked >= 10
    assert not [f for f in findings if f.kind == API_REFUSAL], _report(findings)
    assert not findings, _report(findings)
