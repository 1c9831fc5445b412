"""Reading the README's examples: a section, and the files it shows (a line naming the
file as `models/...`, then its code block)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_section(title: str) -> str:
    """The section headed ``title`` (e.g. "## Custom Python runtime"), up to the next one."""
    text = README.read_text()
    start = text.index(title)
    following = text.find("\n## ", start + len(title))
    return text[start : following if following != -1 else len(text)]


def example_files(section: str) -> dict[str, str]:
    """Each code block preceded by a line naming its file as `models/...`."""
    pattern = re.compile(r"^`(models/[^`]+)`:\n\n```\w*\n(.*?)^```", re.MULTILINE | re.DOTALL)
    return {path: body for path, body in pattern.findall(section)}


def write_example(section: str, root: Path) -> dict[str, str]:
    """Write the section's files under ``root``; the files by path."""
    files = example_files(section)
    for path, body in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
    return files
