"""``--dry-run`` is the first half of ``submit`` (issue 40): over the examples and the project's corpora, on the
local cluster named and through ``--cluster auto``, a dry run and a real submit exit with the same code, say the
same notes and error line, and the artifact the dry run printed is the one submit handed the local adapter.

Real processes, no daemons: the local cluster is configured (its documented ``defaults.launchCommand``) to start
``true launch …`` where it starts ``hpcbridge launch …``, and ``true stage …`` for a stage step, so every job a
case submits starts its whole process layout and ends at once, and nothing a hostile case wrote runs. Its GPUs
are the configured ``gpus`` list (four), so the GPU cases run or are refused the same on every machine.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge import service
from bridge.adapters.base import Artifact, JobRef
from bridge.adapters.local import LocalAdapter
from bridge.cli import main
from tests.fuzz.generator import generate

pytestmark = pytest.mark.local

ROOT = Path(__file__).resolve().parents[2]
#: the examples, the golden files' inputs (tests/cases, Training Operator v1 jobs among them), the batch scripts
#: of the conversion tests and of the Slurm oracle's corpus
FILES = sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("examples/*.sbatch"), *ROOT.glob("tests/cases/*.yaml"),
                *ROOT.glob("tests/cases/v1/*.yaml"), *ROOT.glob("tests/cases/sbatch/*.sbatch"),
                *ROOT.glob("tests/integration/slurm/sbatch_corpus/*.sbatch")])
#: the fuzz corpus's batch scripts and sbatch flags (tests/fuzz), but for the exhaustion candidates
FUZZ = [case for case in generate() if case.kind in ("sbatch", "flags") and not case.heavy]
CLUSTERS = ("local", "auto")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

CONFIG = """\
apiVersion: hpcbridge.io/v1alpha1
kind: BridgeCluster
metadata: {name: local}
spec:
  type: local
  gpus: ["0", "1", "2", "3"]
  defaults: {launchCommand: ["true", "launch"]}
"""


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("hpcbridge: error:")]


def run_cli(argv: list[str]) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return Ran(code, out.getvalue(), err.getvalue())


def configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clusters: str, cwd: Path) -> None:
    """The CLI as a user with *clusters* (clusters.yaml text) configured, state of the test's own, in *cwd*."""
    config = tmp_path / "clusters.yaml"
    config.write_text(clusters)
    monkeypatch.setenv("HPCBRIDGE_CONFIG", str(config))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("HPCBRIDGE_CLUSTER", raising=False)
    monkeypatch.chdir(cwd)


def recording(monkeypatch: pytest.MonkeyPatch, adapter_class: type) -> tuple[list[Artifact], list[JobRef]]:
    """The artifacts *adapter_class*'s submit is handed, and the jobs it then sends as it always does."""
    handed: list[Artifact] = []
    refs: list[JobRef] = []
    submit = adapter_class.submit

    def recorded(adapter: Any, artifact: Artifact) -> JobRef:
        handed.append(artifact)
        refs.append(submit(adapter, artifact))
        return refs[-1]

    monkeypatch.setattr(adapter_class, "submit", recorded)
    return handed, refs


@pytest.fixture
def sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Artifact]:
    """The artifacts the local adapter's submit is handed (and then starts, as it always does)."""
    (tmp_path / "work").mkdir()
    configured(monkeypatch, tmp_path, CONFIG, tmp_path / "work")
    return recording(monkeypatch, LocalAdapter)[0]


def _agree(file: str, flags: tuple[str, ...], cluster: str, sent: list[Artifact]) -> None:
    dry = run_cli(["submit", file, "--cluster", cluster, "--dry-run", *flags])
    real = run_cli(["submit", file, "--cluster", cluster, *flags])
    assert (real.code, real.errors) == (dry.code, dry.errors), (dry, real)
    if dry.code:
        assert real.err == dry.err
        return
    # the notes the dry run gave, submit gives first; then it runs the job
    assert real.err.startswith(dry.err), (dry.err, real.err)
    assert sent, "submit exited 0 and sent nothing"
    script = service.read_input(file, flags).script is not None
    assert sent_text(sent, dry.out, fresh_uids=script) == dry.out


def sent_text(sent: list[Artifact], printed: str, fresh_uids: bool) -> str:
    """What submit sent, as the dry run prints it (an array's elements together). A batch script is a new
    job each time it is submitted, as with sbatch (*fresh_uids*): its uids (the job's, an array's) are the one
    thing that differs, so each uid submit gave is written as the one the dry run printed in its place, one
    for one, before the texts are compared."""
    first = sent[0]
    text = Artifact(first.backend, first.kind, first.plan, tuple(f for a in sent for f in a.files), first.command).text()
    if not fresh_uids:
        return text
    given, shown = UUID.findall(text), UUID.findall(printed)
    assert len(given) == len(shown), (text, printed)
    pairs = dict(zip(given, shown, strict=True))
    assert len(set(pairs.values())) == len(pairs), "two uids submit gave are one in the dry run"
    return UUID.sub(lambda match: pairs[match.group(0)], text)


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dry_run_and_submit_agree_on_the_corpus(path: Path, cluster: str, sent: list[Artifact]) -> None:
    _agree(str(path), (), cluster, sent)


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("case", FUZZ, ids=lambda c: c.id)
def test_dry_run_and_submit_agree_on_the_fuzz_scripts(case, cluster: str, sent: list[Artifact],  # type: ignore[no-untyped-def]
                                                      tmp_path: Path) -> None:
    path = tmp_path / case.filename
    path.write_bytes(case.data)
    _agree(str(path), case.flags, cluster, sent)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_auto_takes_the_local_cluster_for_what_it_runs(path: Path, sent: list[Artifact]) -> None:
    """With only the local cluster configured, ``--cluster auto`` runs what ``--cluster local`` runs, the same
    layout, and refuses the rest with local's reason."""
    local = run_cli(["submit", str(path), "--cluster", "local", "--dry-run"])
    auto = run_cli(["submit", str(path), "--cluster", "auto", "--dry-run"])
    assert auto.code == local.code, (local, auto)
    if local.code:
        reason = local.errors[0].removeprefix("hpcbridge: error: ")
        assert reason in auto.errors[0], (local.errors, auto.errors)
    else:
        assert "hpcbridge: note: placement: chose local (starts now)" in auto.err.splitlines()
        if service.read_input(str(path)).script is None:
            assert auto.out == local.out


def test_the_corpus_is_what_it_says() -> None:
    """The cases counted in the report: every example, test case and batch script, and the fuzz scripts."""
    assert len(FILES) >= 90 and {p.suffix for p in FILES} == {".yaml", ".sbatch"}
    assert len(FUZZ) >= 80
