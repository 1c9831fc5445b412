"""The documentation site builds with ``mkdocs build --strict`` (tox -e docs runs it as its
first command too): its generated reference pages hold what the code serves, and a link or
an anchor that resolves nowhere fails the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the checkout at ``root``, into ``site``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "PYTHONPATH": str(root), "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the site is built from: the pages, the hooks, the package."""
    root = tmp_path_factory.mktemp("checkout")
    for name in ("docs", "scripts", "inferpool", "benchmarks", "deploy"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    # The pages link these files of the repository's root (the hook publishes them).
    for name in ("mkdocs.yml", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, root / name)
    return root


@pytest.fixture(scope="module")
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from the checkout: the one tox -e docs built just before (DOCS_SITE),
    else built here."""
    built = os.environ.get("DOCS_SITE")
    if built:
        return Path(built)
    site = tmp_path_factory.mktemp("site")
    done = build(request.getfixturevalue("copy"), site)
    assert done.returncode == 0, done.stderr
    return site


def test_the_site_builds_with_its_generated_reference(site: Path) -> None:
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "--max-body-bytes" in cli and "INFERPOOL_MAX_BODY_BYTES" in cli
    metrics = (site / "reference" / "metrics" / "index.html").read_text()
    assert "inferpool_model_requests_total" in metrics
    assert "inferpool_worker_restarts_total" in metrics  # the server collector's too
    endpoints = (site / "reference" / "endpoints" / "index.html").read_text()
    assert "/v2/models/{name}/infer" in endpoints and "ModelStreamInfer" in endpoints
    assert (site / "repo" / "deploy" / "kserve" / "hpa.yaml").is_file()


def test_a_broken_link_or_anchor_fails_the_build(copy: Path, tmp_path: Path) -> None:
    page = copy / "docs" / "index.md"
    original = page.read_text()
    broken = "[gone](no-such-page.md), [gone](pipelines.md#no-such-heading)"
    # beside them, links to the repository's files, which the hook publishes: not refused
    fine = "[readme](../README.md#set-up), [hpa](../deploy/kserve/hpa.yaml)"
    page.write_text(original + f"\nSee {broken}; {fine}.\n")
    try:
        done = build(copy, tmp_path / "site")
    finally:
        page.write_text(original)
    assert done.returncode != 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 2, warnings  # each broken link is named, and nothing else
    assert "no-such-page.md" in warnings[0]
    assert "does not contain an anchor '#no-such-heading'" in warnings[1]
