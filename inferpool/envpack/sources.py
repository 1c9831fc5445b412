"""What an environment must hold, read from what a user has: an MLflow model folder, a
``requirements.txt``, a ``python_env.yaml`` or a ``conda.yaml``.

The answer is pip requirement lines and the Python version asked for. Without conda,
conda (non-pip) dependencies cannot be installed: ``python`` is checked against the
interpreter instead, ``pip`` is pip itself, and any other one is refused unless the same
name is also a pip requirement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet

REQUIREMENTS = "requirements.txt"
PYTHON_ENV = "python_env.yaml"
CONDA = "conda.yaml"
# A PEP 508 name at the start of a requirement or conda spec.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# pip's options that name a file, relative to the file they are written in.
_FILE_OPTIONS = ("-r", "--requirement", "-c", "--constraint")


class SourceRefused(Exception):
    """The source cannot be read, or asks for what cannot be installed (one sentence)."""


@dataclass(frozen=True, slots=True)
class Needs:
    """What the environment must hold."""

    origin: Path  # the file the requirements come from
    requirements: tuple[str, ...]  # pip requirement lines; file options made absolute
    python: str | None  # the Python version asked for ("3.11", "==3.11.7", ">=3.9"), if any
    python_origin: Path | None  # the file that asks for it


def read_needs(source: Path) -> Needs:
    """The needs of an MLflow model folder (its ``requirements.txt`` first, else the pip
    dependencies of its ``python_env.yaml`` or ``conda.yaml``; the Python version from
    either yaml), or of one such file. ``SourceRefused`` with the reason otherwise."""
    if source.is_dir():
        return _folder_needs(source)
    if not source.is_file():
        raise SourceRefused(f"{source} does not exist")
    if source.suffix in (".yaml", ".yml"):
        return _yaml_needs(source, _read_yaml(source))
    return Needs(source, (f"-r {source.resolve()}",), None, None)


def check_python(needs: Needs, version: tuple[int, int, int], interpreter: Path) -> None:
    """``SourceRefused`` when the interpreter's Python is not the one asked for: an X.Y
    (and .Z) asked for must match its X.Y (patch releases share an environment's
    packages); a range (``>=3.9``) must contain its version."""
    spec = needs.python
    if spec is None:
        return
    actual = ".".join(map(str, version))
    if spec[:1].isdigit() or (spec.startswith("==") and spec[2:3].isdigit()):
        wanted = tuple(spec.lstrip("=").split("."))[:2]
        fits = wanted == tuple(str(part) for part in version[:2])
    else:
        try:
            fits = SpecifierSet(spec).contains(actual, prereleases=True)
        except InvalidSpecifier:
            raise SourceRefused(
                f"{needs.python_origin}: python {spec!r} is not a version specifier"
            ) from None
    if not fits:
        raise SourceRefused(
            f"{needs.python_origin} asks for Python {spec.lstrip('=')}, but {interpreter} is "
            f"Python {actual}: pick another interpreter with --python"
        )


def _folder_needs(folder: Path) -> Needs:
    files = {name: folder / name for name in (REQUIREMENTS, PYTHON_ENV, CONDA)}
    present = {name: path for name, path in files.items() if path.is_file()}
    if not present:
        raise SourceRefused(f"{folder} holds no {REQUIREMENTS}, {PYTHON_ENV} or {CONDA}")
    yaml_name = PYTHON_ENV if PYTHON_ENV in present else CONDA if CONDA in present else None
    if REQUIREMENTS in present:
        requirements: tuple[str, ...] = (f"-r {present[REQUIREMENTS].resolve()}",)
        if yaml_name is None:
            return Needs(present[REQUIREMENTS], requirements, None, None)
        # MLflow writes the Python version only into the yaml files: check it from there.
        described = _yaml_needs(present[yaml_name], _read_yaml(present[yaml_name]), pip=False)
        return Needs(present[REQUIREMENTS], requirements, described.python, described.origin)
    assert yaml_name is not None
    return _yaml_needs(present[yaml_name], _read_yaml(present[yaml_name]))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceRefused(f"{path} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise SourceRefused(f"{path} is not valid YAML{line}") from None
    if not isinstance(document, dict):
        raise SourceRefused(f"{path} must hold a mapping (python:, dependencies: ...)")
    return document


def _yaml_needs(path: Path, document: dict[str, Any], pip: bool = True) -> Needs:
    """A python_env.yaml (``python:`` and pip ``dependencies:``) or a conda.yaml."""
    if path.name == PYTHON_ENV or ("python" in document and "channels" not in document):
        return _python_env_needs(path, document)
    return _conda_needs(path, document, pip)


def _python_env_needs(path: Path, document: dict[str, Any]) -> Needs:
    # MLflow's build_dependencies (pip, setuptools, wheel) build sdists; pip brings its own.
    python = document.get("python")
    lines = _string_list(document.get("dependencies"), path, "dependencies")
    spec = str(python).strip() if python is not None else None
    return Needs(path, _absolute_file_options(lines, path), spec or None, path if spec else None)


def _conda_needs(path: Path, document: dict[str, Any], pip: bool) -> Needs:
    entries = document.get("dependencies") or []
    if not isinstance(entries, list):
        raise SourceRefused(f"{path}: dependencies must be a list")
    conda: list[str] = []
    pip_lines: list[str] = []
    for entry in entries:
        if isinstance(entry, dict) and set(entry) == {"pip"}:
            pip_lines.extend(_string_list(entry["pip"], path, "dependencies: pip:"))
        elif isinstance(entry, str | int | float):
            conda.append(str(entry).strip())
        else:
            raise SourceRefused(f"{path}: dependency {entry!r} is neither a spec nor pip:")
    pip_names = {_normalise(name) for line in pip_lines if (name := _requirement_name(line))}
    python: str | None = None
    for spec in conda:
        match = _NAME.match(spec.split("::")[-1])
        name = _normalise(match.group()) if match else spec
        rest = spec.split("::")[-1][match.end() :].strip() if match else ""
        if name == "python":
            python = _conda_version(rest) or None
        elif name == "pip" or not pip or name in pip_names:
            continue  # pip is there; a name pip also installs is pip's to install
        else:
            raise SourceRefused(
                f"{path}: conda dependency {spec!r} cannot be installed without conda; list "
                "it under pip: if it is on PyPI, or pack the environment with conda-pack"
            )
    return Needs(path, _absolute_file_options(pip_lines, path), python, path if python else None)


def _conda_version(rest: str) -> str:
    """conda's ``=3.11`` (3.11.*), ``=3.11.7=h955ad1f_0`` (with a build), ``3.11`` (after a
    space), ``==3.11.7`` or a range (``>=3.9,<3.12``), as check_python reads them."""
    if not rest or rest[0] in "<>!~":
        return rest.replace(" ", "")
    version = rest.lstrip("=").split("=")[0].split()[0].removesuffix(".*")
    return "==" + version if rest.startswith("==") else version


def _string_list(value: Any, path: Path, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise SourceRefused(f"{path}: {where} must be a list of requirements")
    return [str(v).strip() for v in value if str(v).strip()]


def _absolute_file_options(lines: list[str], path: Path) -> tuple[str, ...]:
    """``-r requirements.txt`` in a yaml file names a file beside it: pip reads the lines
    from a file elsewhere, so such a path is made absolute."""
    out = []
    for line in lines:
        option, _, value = line.partition(" ")
        if option in _FILE_OPTIONS and value.strip():
            line = f"{option} {(path.parent / value.strip()).resolve()}"
        out.append(line)
    return tuple(out)


def _requirement_name(line: str) -> str | None:
    if line.startswith("-"):
        return None
    match = _NAME.match(line)
    return match.group() if match else None


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
