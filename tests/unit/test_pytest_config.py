"""The suite's own pytest configuration (pyproject.toml): warnings are errors, yet a
failing Hypothesis property is reported as a failure with its falsifying example."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]

FAILING_PROPERTY = """
from hypothesis import given, strategies as st

@given(st.integers())
def test_below_five(x):
    assert x < 5
"""


def test_a_failing_property_is_reported_with_its_example(tmp_path: Path) -> None:
    (tmp_path / "test_property.py").write_text(FAILING_PROPERTY)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(PROJECT_ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:]
    assert "INTERNALERROR" not in run.stdout + run.stderr, run.stdout[-3000:]
    # Older Hypothesis releases say "Falsifying example", newer ones "Failing test case"
    # (6.170 in tox); either way the report names the test and its smallest failing input.
    assert re.search(r"(Falsifying example|Failing test case): test_below_five\(", run.stdout)
    assert "x=5" in run.stdout
    assert "1 failed" in run.stdout
