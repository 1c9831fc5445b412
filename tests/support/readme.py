"""Reading the documentation's examples (the README and the pages of docs/): a section, and
the files it shows (a line naming the file as `models/...`, then its code block)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def page_section(page: str, title: str) -> str:
    """The section headed ``title`` (e.g. "## Example") of ``page`` (a path from the
    repository's root, e.g. "docs/pipelines.md"), up to the next section of its level or
    above; a page's title ("# ...") gives the whole page."""
    text = (ROOT / page).read_text()
    start = text.index(title + "\n")
    level = len(title) - len(title.lstrip("#"))
    following = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, start + len(title))
    return text[start : following.start() if following else len(text)]


def readme_section(title: str) -> str:
    """The README's section headed ``title`` (e.g. "## Set-up"), up to the next one."""
    return page_section("README.md", title)


def example_files(section: str) -> dict[str, str]:
    """Each code block preceded by a line naming its file as `models/...` (and the block's
    mark for tests/docs/test_code_blocks.py, if any)."""
    pattern = re.compile(
        r"^`(models/[^`]+)`:\n\n(?:<!--[^\n]*-->\n)?```\w*\n(.*?)^```", re.MULTILINE | re.DOTALL
    )
    return {path: body for path, body in pattern.findall(section)}


def write_example(section: str, root: Path) -> dict[str, str]:
    """Write the section's files under ``root``; the files by path."""
    files = example_files(section)
    for path, body in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
    return files
