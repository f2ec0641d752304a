"""Every shell block of README.md and docs/ that needs no cluster daemon runs as written, on the local cluster,
from the repository root, and prints what the text shows (tests/doc_blocks.py says how blocks are read; the
blocks that need a daemon are parsed and checked by tests/unit/test_docs.py)."""

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


def _run(command: doc_blocks.Command, cwd: Path, env: dict[str, str], where: str) -> Path:
    text = command.text.replace("\\\n", " ")
    if text.startswith("cd "):
        return (cwd / text[3:].split("#")[0].strip()).resolve()
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command.text], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    printed = (result.stdout + result.stderr).splitlines()
    assert result.returncode == command.exit_code, (
        f"{where}: `{command.text}` exited {result.returncode}:\n{result.stdout}{result.stderr}")
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
