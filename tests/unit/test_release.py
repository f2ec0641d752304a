"""One version, said three times in agreement: ``bridge.__version__`` (the one source), pyproject's dynamic version
(which reads it) and the CHANGELOG's top released section (what a release tag ``v<version>`` marks)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import bridge

ROOT = Path(__file__).resolve().parents[2]
#: a section heading of CHANGELOG.md: ``## Unreleased`` or ``## <version> - <date>``
SECTION = re.compile(r"^## (?P<name>\S+)(?: - (?P<date>\d{4}-\d{2}-\d{2}))?$", re.MULTILINE)


def _sections() -> list[re.Match[str]]:
    return list(SECTION.finditer((ROOT / "CHANGELOG.md").read_text()))


def test_pyproject_reads_the_version_from_the_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bridge.__version__"}


def test_changelog_top_released_section_is_the_package_version() -> None:
    sections = _sections()
    assert sections and sections[0]["name"] == "Unreleased", "CHANGELOG.md starts with ## Unreleased"
    released = [section for section in sections if section["name"] != "Unreleased"]
    assert released, "CHANGELOG.md has no released section"
    top = released[0]
    assert top["date"], f"{top.group(0)!r} has no date (## <version> - YYYY-MM-DD)"
    assert top["name"] == bridge.__version__


def test_released_sections_go_from_newest_to_oldest() -> None:
    versions = [tuple(int(part) for part in section["name"].split("."))
                for section in _sections() if section["name"] != "Unreleased"]
    assert versions == sorted(versions, reverse=True)
    assert len(set(versions)) == len(versions)
