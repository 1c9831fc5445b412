"""What a worker group can run, and whether a model's requirements are met there.

A group's ``Capabilities`` are read off its interpreter: the Python version, every
installed distribution with its version, and the top-level modules each provides (so
``xgboost`` is met by ``xgboost-cpu``, ``sklearn`` by ``scikit-learn``), plus the group's
tags from the settings. The server's own group is read in-process; another
environment's is read by running this module with that environment's interpreter
(``python -m inferpool.engine.environments.capabilities`` prints them as JSON; ``interpreters.py``
starts it).

A model's requirements are its ``requirements`` list (Seldon Core v2's name for it). Each
is a tag, or a package with an optional version specifier (PEP 440: ``lightgbm>=4.0``);
``unmet`` says which one a group lacks. A built-in runtime's library is a requirement
too (DESIGN §3: a worker offers the runtimes importable in its environment), checked
without reading every distribution: ``importable_here`` for the server's interpreter, the
probe's modules for an environment's.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# The library each built-in runtime's models import: an implicit requirement of its models,
# and what logs and metrics show.
RUNTIME_LIBRARIES = {
    "sklearn": "sklearn",
    "lightgbm": "lightgbm",
    "xgboost": "xgboost",
    "mlflow": "mlflow",
    "catboost": "catboost",
    "r": "rpy2",
    "alibi-detect": "alibi_detect",
    "alibi-explain": "alibi",
}
# Distributions that provide a module under another name, first found wins.
MODULE_DISTRIBUTIONS = {
    "sklearn": ("scikit-learn",),
    "xgboost": ("xgboost", "xgboost-cpu"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What one worker group offers."""

    python: str  # "3.11.7"
    # canonical distribution names and top-level module names, both to the version
    packages: dict[str, str] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()

    def with_tags(self, tags: list[str] | tuple[str, ...]) -> Capabilities:
        return Capabilities(self.python, self.packages, frozenset(tags))

    def to_dict(self) -> dict[str, Any]:
        return {"python": self.python, "packages": self.packages, "tags": sorted(self.tags)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Capabilities:
        packages = dict(raw.get("packages") or {})
        return cls(str(raw["python"]), packages, frozenset(raw.get("tags") or ()))

    def version_of(self, name: str) -> str | None:
        return self.packages.get(canonicalize_name(name)) or self.packages.get(name)

    def libraries(self) -> str:
        """'sklearn 1.5.2, lightgbm 4.6.0': the runtimes' libraries found, with versions."""
        names = RUNTIME_LIBRARIES.values()
        return ", ".join(f"{n} {self.version_of(n)}" for n in names if self.version_of(n))

    def describe(self) -> str:
        """'Python 3.11.7, sklearn 1.5.2, lightgbm 4.6.0' and the tags: for logs."""
        tags = [f"tags {', '.join(sorted(self.tags))}"] if self.tags else []
        return ", ".join(
            part for part in [f"Python {self.python}", self.libraries(), *tags] if part
        )


@functools.cache
def here() -> Capabilities:
    """This interpreter's capabilities, read once (about 0.2 s), when first needed."""
    return read_here()


@functools.cache
def importable_here(module: str) -> bool:
    """This interpreter can import the top-level ``module`` (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a meta path finder that refuses it
        return False


def read_here() -> Capabilities:
    """The capabilities of this interpreter (without tags)."""
    packages: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if not name:
            continue
        version = distribution.version
        packages.setdefault(canonicalize_name(name), version)
        for module in (distribution.read_text("top_level.txt") or "").split():
            packages.setdefault(module, version)
    # Wheels without top_level.txt (scikit-learn's, xgboost-cpu's): the modules of the
    # runtimes' libraries by the distributions known to provide them. Reading every
    # distribution's file list instead costs seconds.
    for module, distributions in MODULE_DISTRIBUTIONS.items():
        found = next((packages[d] for d in distributions if d in packages), None)
        if found is not None:
            packages.setdefault(module, found)
    python = ".".join(str(part) for part in sys.version_info[:3])
    return Capabilities(python, packages)


def check_requirements(requirements: list[str]) -> None:
    """ValueError naming a requirement that is neither a tag nor a package specifier."""
    for text in requirements:
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            message = f"requirement {text!r} is not a tag or a package spec: {exc}"
            raise ValueError(message) from None


def unmet(requirements: list[str], capabilities: Capabilities) -> str | None:
    """The first requirement ``capabilities`` do not meet, as written; None if all are."""
    for text in requirements:
        if text in capabilities.tags:
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            return text
        version = capabilities.version_of(requirement.name)
        if version is None:
            return text
        if requirement.specifier and not _satisfies(requirement, version):
            return text
    return None


def _satisfies(requirement: Requirement, version: str) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def main() -> None:
    """Print this interpreter's capabilities as JSON (another environment's probe)."""
    json.dump(read_here().to_dict(), sys.stdout)


if __name__ == "__main__":
    main()
