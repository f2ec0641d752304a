"""README.md and docs/: the CLI reference is the parser's, links stay inside the repository, and every shell
block that needs a cluster daemon at least parses (bash) and passes the CLI's parser as written. The blocks that
need none run in tests/integration/test_docs_commands.py."""

from __future__ import annotations

import importlib.util
import re
import subprocess

import pytest

from bridge.cli import build_parser
from bridge.errors import BridgeError
from tests import doc_blocks
from tests.doc_blocks import ROOT, Block

BLOCKS = doc_blocks.shell_blocks()
DAEMON_BLOCKS = [block for block in BLOCKS if block.daemons]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_cli_reference_is_generated_from_the_parser() -> None:
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen-cli-docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "cli.md").read_text() == module.render(), "docs/cli.md drifted: run scripts/gen-cli-docs.py"


def test_every_shell_block_is_run_or_checked() -> None:
    # the integration test runs the rest; this keeps the split honest and the count visible
    runnable = [block for block in BLOCKS if not block.daemons]
    print(f"shell blocks: {len(BLOCKS)}; run on the local cluster: {len(runnable)}; "
          f"checked without their daemon: {len(DAEMON_BLOCKS)}")
    assert len(BLOCKS) == len(runnable) + len(DAEMON_BLOCKS)
    assert runnable and DAEMON_BLOCKS
    for block in BLOCKS:
        assert block.commands(), f"{block.where}: a shell block with no command"


def _parse_error(argv: list[str]) -> str | None:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except (BridgeError, SystemExit) as exc:
        return str(exc)
    if extra and not getattr(args, "sbatch_flags_allowed", False):
        return f"unrecognized arguments: {' '.join(extra)}"
    return None


@pytest.mark.parametrize("block", DAEMON_BLOCKS, ids=lambda block: block.where)
def test_blocks_needing_a_daemon_parse(block: Block) -> None:
    script = block.script()
    result = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert result.returncode == 0, f"{block.where}: bash -n: {result.stderr}"
    for argv in doc_blocks.hpcbridge_argvs(script):
        assert _parse_error(argv) is None, f"{block.where}: hpcbridge {' '.join(argv)}: {_parse_error(argv)}"


def test_hpcbridge_argvs_splits_command_lines() -> None:
    script = "hpcbridge status 1 --cluster hpc; hpcbridge logs 1 -f --cluster hpc  # a comment\nx | hpcbridge submit -\n"
    assert doc_blocks.hpcbridge_argvs(script) == [
        ["status", "1", "--cluster", "hpc"], ["logs", "1", "-f", "--cluster", "hpc"], ["submit", "-"]]


@pytest.mark.parametrize("path", doc_blocks.documents(), ids=lambda path: path.name)
def test_links_stay_inside_the_repository(path) -> None:
    text = path.read_text()
    for target in _LINK.findall(text):
        assert not target.startswith(("http:", "https:", "/", "file:")), f"{path.name}: {target} is outside the repository"
        if target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{path.name}: {target} does not exist here"
    for word in ("../shared", "this 2-core machine"):
        assert word not in text, f"{path.name} mentions {word!r}"


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; details belong in docs/"
