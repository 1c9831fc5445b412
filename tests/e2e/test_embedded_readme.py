"""The "Embedded in a Python program" guide's example (docs/embedded.md), run as it is
written, in a fresh
interpreter and an empty folder, and what it prints is what its comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "embedded.md"
SECTION = "# Embedded in a Python program"

pytestmark = pytest.mark.timeout(180)


def readme_example() -> str:
    section = PAGE.read_text()
    assert section.startswith(SECTION)
    [example] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return example


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    example = readme_example()
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", example],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONPATH": str(root)},  # this checkout
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[0 2] (2, 3)"  # what the example's first print says
    assert lines[1].split() == ["predict"]  # the DataFrame's header, then its two rows
    assert [line.split() for line in lines[2:]] == [["0", "0"], ["1", "2"]]
    assert (tmp_path / "models" / "iris" / "model.joblib").is_file()
