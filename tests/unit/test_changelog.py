"""CHANGELOG.md (Keep a Changelog): an Unreleased section first, then the releases newest
first, the newest naming the package's version; linked from the README and the docs."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

from inferpool import __version__

ROOT = Path(__file__).resolve().parents[2]
# "## [1.2.3] - 2026-12-06", as Keep a Changelog writes a release's heading.
RELEASE = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})$", re.M)


def test_the_newest_entry_is_the_package_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## .*$", text, re.M)
    assert headings[0] == "## [Unreleased]"
    releases = [match["version"] for match in RELEASE.finditer(text)]
    assert len(releases) == len(headings) - 1, headings  # every other heading is a release
    assert releases[0] == __version__
    versions = [Version(release) for release in releases]
    assert versions == sorted(versions, reverse=True)


def test_the_readme_and_the_docs_link_the_changelog():
    assert "](CHANGELOG.md)" in (ROOT / "README.md").read_text()
    assert "](../CHANGELOG.md)" in (ROOT / "docs" / "index.md").read_text()
