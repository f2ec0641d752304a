"""Shared pytest options: golden files are rewritten only on purpose (--update-golden)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden from the current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """Compare text with tests/golden/<name>; with --update-golden, write it instead."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = ROOT / "tests" / "golden" / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.exists(), f"no golden file {path}; run pytest --update-golden and review the diff"
        assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"

    return check


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own hpc-bridge state dir (the layer's submission record, local jobs), never ~."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
