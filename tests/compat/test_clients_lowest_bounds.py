"""tests/constraints/lowest.txt (tox's ``lowest`` environment) pins exactly pyproject.toml's
lower bounds, so that the versions inferpool claims to support are the ones tested."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def lower_bounds() -> dict[str, Version]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra, items in project["optional-dependencies"].items():
        if extra != "proto":  # grpcio-tools regenerates the code; no environment runs it
            requirements += items
    bounds = {}
    for text in requirements:
        requirement = Requirement(text)
        if requirement.name == "inferpool":  # an extra naming others
            continue
        (lower,) = [s.version for s in requirement.specifier if s.operator == ">="]
        bounds[canonicalize_name(requirement.name)] = Version(lower)
    return bounds


def pins() -> dict[str, Version]:
    found = {}
    for line in (ROOT / "tests" / "constraints" / "lowest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            found[canonicalize_name(name)] = Version(version)
    return found


def test_the_lowest_constraints_pin_every_lower_bound() -> None:
    assert pins() == lower_bounds()
