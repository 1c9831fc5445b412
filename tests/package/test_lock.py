"""requirements/image.lock pins every package the image installs.

The image installs ``inferpool[EXTRAS]`` with the lock as a constraint file whose hashes pip
checks (Dockerfile): a dependency or an extra added to pyproject.toml without running
scripts/lock_image.sh again would be resolved unpinned, or refused, at the next build. These
checks fail first, in CI, with the name to add.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from scripts.image_requirements import requirements as image_requirements

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "image.lock"
TOOLS = ROOT / "requirements" / "image-tools.in"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def locked() -> dict[str, Version]:
    """The lock's pins, by canonical name; every one of them must carry a hash."""
    pins: dict[str, Version] = {}
    entries = re.split(r"\n(?=\S)", LOCK.read_text())
    for entry in entries:
        match = PIN.match(entry)
        if match is None:
            assert entry.startswith("#") or not entry.strip(), f"not a pin: {entry!r}"
            continue
        assert "--hash=sha256:" in entry, f"{match[1]} has no hash in {LOCK.name}"
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def requirements_of_all() -> list[Requirement]:
    """What the Dockerfile installs through the lock for ``EXTRAS=all``
    (scripts/image_requirements.py), and the build backend pyproject.toml names."""
    pyproject = ROOT / "pyproject.toml"
    build = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    return [Requirement(r) for r in (*image_requirements(["all"], pyproject), *build)]


def test_the_lock_pins_every_requirement_of_inferpool_all_within_its_range():
    pins = locked()
    for requirement in requirements_of_all():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in {LOCK.name}: run scripts/lock_image.sh"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK.name} pins {name}=={pins[name]} outside {requirement}: "
            "run scripts/lock_image.sh"
        )


def test_the_lock_pins_the_tools_the_build_runs():
    pins = locked()
    for line in TOOLS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            assert requirement.specifier.contains(pins[canonicalize_name(requirement.name)])
    # pip applies a constraint file's hashes to the dependencies it resolves from 26 on.
    assert pins["pip"] >= Version("26")


def test_the_lock_holds_no_inferpool_pin():
    """inferpool itself is the wheel built from the checkout, pinned by its own hash."""
    assert "inferpool" not in locked()
