"""scripts/coverage_floors.py (tox -e lowest): one line per package, and a failure when a
package's measured coverage is below its floor."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "coverage_floors.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coverage_floors", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeCoverage:
    """A loaded data file whose report gives each package's figure."""

    totals: dict[str, float] = {}

    def load(self) -> None:
        pass

    def report(self, include: list[str], file: object) -> float:
        [pattern] = include
        return self.totals[pattern]


@pytest.fixture
def script(monkeypatch) -> ModuleType:
    module = load_script()
    monkeypatch.setattr(module.coverage, "Coverage", FakeCoverage)
    monkeypatch.setattr(module, "FLOORS", {"engine": 80.0, "protocol": 90.0})
    return module


def test_every_package_at_or_above_its_floor_passes(script, capsys) -> None:
    FakeCoverage.totals = {"inferpool/engine/*": 80.0, "inferpool/protocol/*": 95.5}
    assert script.main() == 0
    out = capsys.readouterr().out
    assert "inferpool/engine      80.0%  (floor 80%)  ok" in out
    assert "inferpool/protocol    95.5%  (floor 90%)  ok" in out


def test_a_package_below_its_floor_fails_by_name(script, capsys) -> None:
    FakeCoverage.totals = {"inferpool/engine/*": 79.9, "inferpool/protocol/*": 95.5}
    assert script.main() == 1
    captured = capsys.readouterr()
    assert "inferpool/engine      79.9%  (floor 80%)  BELOW FLOOR" in captured.out
    assert "coverage below its floor in: engine" in captured.err


def test_the_floors_name_the_packages_the_issue_asks_for() -> None:
    assert set(load_script().FLOORS) == {"engine", "protocol", "codecs", "frontends", "runtimes"}
