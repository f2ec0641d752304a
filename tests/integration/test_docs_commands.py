"""Every shell block of README.md and docs/ that needs no cluster daemon runs as written, on the local cluster,
from the repository root, and prints what the text shows; a block that needs Slurm runs as written against the
suite's Slurm cluster, configured as ``hpc`` (tests/doc_blocks.py says how blocks are read; the blocks that need
what the suite does not start, Flux, a Kubernetes operator install, root, several clusters, are parsed and
checked by tests/unit/test_docs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import doc_blocks
from tests.doc_blocks import ROOT, Block

pytestmark = [pytest.mark.integration, pytest.mark.local]

RUNNABLE = [block for block in doc_blocks.shell_blocks() if not block.daemons]


@pytest.fixture
def reader_env(tmp_path: Path) -> dict[str, str]:
    """A reader's shell: this checkout's hpcbridge first on PATH, no clusters configured, state of its own."""
    config = tmp_path / "clusters.yaml"
    config.write_text("")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HPCBRIDGE_", "SLURM_"))}
    env.update(PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", HPCBRIDGE_CONFIG=str(config),
               XDG_STATE_HOME=str(tmp_path / "state"), PYTHONPATH=str(ROOT))
    return env


def _run(command: doc_blocks.Command, cwd: Path, env: dict[str, str], where: str,
         job_ids: list[str] | None = None) -> Path:
    """Run one command in *cwd* (a ``cd`` moves it); with *job_ids*, ``1234`` is the last id in it, and a
    submit's first printed line is added to it."""
    text = command.text.replace("\\\n", " ")
    if text.startswith("cd "):
        return (cwd / text[3:].split("#")[0].strip()).resolve()
    script = command.text
    if job_ids is not None:
        script = doc_blocks.PLACEHOLDER_ID.sub(job_ids[-1] if job_ids else "1234", script)
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    printed = (result.stdout + result.stderr).splitlines()
    assert result.returncode == command.exit_code, (
        f"{where}: `{command.text}` exited {result.returncode}:\n{result.stdout}{result.stderr}")
    if job_ids is not None and text.startswith("hpcbridge submit") and result.stdout.strip():
        job_ids.append(result.stdout.split()[0])
    for shown in command.output:
        assert doc_blocks.shown_line_found(shown, printed), (
            f"{where}: `{command.text}` did not print {shown!r}; it printed:\n" + "\n".join(printed))
    return cwd


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.where)
def test_block_runs_as_written(block: Block, reader_env: dict[str, str]) -> None:
    if not block.runnable():
        pytest.skip(f"{block.where} needs {', '.join(block.modules)} (not installed)")
    cwd = ROOT
    for command in block.commands():
        cwd = _run(command, cwd, reader_env, block.where)


SLURM_BLOCKS = [block for block in doc_blocks.shell_blocks() if block.runs_on("slurm")]


@pytest.mark.slurm
@pytest.mark.parametrize("block", SLURM_BLOCKS, ids=lambda block: block.where)
def test_slurm_block_runs_as_written(block: Block, reader_env: dict[str, str], slurm_cluster, tmp_path: Path) -> None:
    """As a reader with a Slurm cluster configured as ``hpc`` (the suite's, its commands on this machine):
    each command runs as written, ``1234`` being the id the block's submit printed; a ``sh`` block's commands
    run one by one, ``;``-joined ones together."""
    from bridge.api.loader import to_yaml
    from tests import builders

    hpc = builders.cluster("slurm", "hpc", slurm={"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                           defaults={"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]})
    Path(reader_env["HPCBRIDGE_CONFIG"]).write_text(to_yaml([hpc]))
    cwd, job_ids = ROOT, []
    for line in _lines(block):
        cwd = _run(line, cwd, reader_env, block.where, job_ids)
    assert job_ids, f"{block.where}: no submit printed a job id"


def _lines(block: Block) -> list[doc_blocks.Command]:
    """A block's commands, a ``sh`` block's each line of its own (``\\`` continuations joined)."""
    if block.language == "console":
        return block.commands()
    return [doc_blocks.Command(line) for line in block.script().replace("\\\n", " ").splitlines() if line.strip()]


def test_the_blocks_are_counted() -> None:
    """The counts in the report (printed with -s): run here, run on Slurm, checked without their daemon."""
    blocks = doc_blocks.shell_blocks()
    print(f"\nshell blocks: {len(blocks)}; run on the local cluster: {len(RUNNABLE)}; run on Slurm: "
          f"{len(SLURM_BLOCKS)}; parse-checked only: {len(blocks) - len(RUNNABLE) - len(SLURM_BLOCKS)}")
    assert SLURM_BLOCKS
