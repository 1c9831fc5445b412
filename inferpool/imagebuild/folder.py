"""What a model folder asks of an image: whether it is one model or a repository of them,
where it goes in the image, and the pip arguments and Python version of its requirements.

The requirements are read by ``inferpool env pack``'s reader (envpack/sources.py): a
``requirements.txt``, an MLflow ``python_env.yaml`` or a ``conda.yaml`` at the folder's top
(a conda.yaml's ``pip:`` list and its ``python`` pin; any other conda package is refused,
as pip cannot install it). A file a requirement names (``-r extra.txt``) is given relative
to the folder, which is where pip runs in the image; one outside the folder is refused, as
it would not be in the image.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from inferpool.envpack.sources import (
    _FILE_OPTIONS,
    CONDA,
    PYTHON_ENV,
    REQUIREMENTS,
    SourceRefused,
    read_needs,
)

MODEL_SETTINGS = "model-settings.json"
# Where the folder goes. Not /mnt/models, the base image's default, which KServe's storage
# initializer mounts over: a model built into the image must not be hidden by an empty
# volume.
MODELS = PurePosixPath("/opt/models")
# Left out of the image: caches and version control (compiled again in the image).
IGNORED = ("__pycache__", "*.pyc", ".git", ".mypy_cache", ".pytest_cache", ".ipynb_checkpoints")


class BuildRefused(Exception):
    """The folder cannot be made into an image; the message is one sentence saying why."""


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """A model folder, read for an image."""

    source: Path  # the folder on this machine, resolved
    single: bool  # one model (model-settings.json at its top), else a repository
    requirements_file: str | None  # the file its requirements come from, relative to it
    pip_arguments: tuple[str, ...]  # for ``pip install`` run in the folder's copy
    python: str | None  # the Python version asked for, as check_python reads it
    python_origin: str | None  # the file asking for it, relative to the folder

    @property
    def target(self) -> PurePosixPath:
        """The folder's copy in the image."""
        return MODELS / self.source.name if self.single else MODELS


def read_folder(folder: Path) -> ModelFolder:
    """The folder as an image needs it; ``BuildRefused`` with the reason otherwise."""
    if not folder.is_dir():
        raise BuildRefused(f"{folder} is not a folder")
    source = folder.resolve()
    single = (source / MODEL_SETTINGS).is_file()
    if not single and not any(_model_settings_below(source)):
        raise BuildRefused(
            f"{folder} is not a model folder: it holds no {MODEL_SETTINGS}, at its top (one "
            "model) or in a folder below it (a model repository)"
        )
    present = [name for name in (REQUIREMENTS, PYTHON_ENV, CONDA) if (source / name).is_file()]
    if not present:
        return ModelFolder(source, single, None, (), None, None)
    try:
        needs = read_needs(source)
    except SourceRefused as exc:
        # env pack's way out of a conda package (conda-pack) is not one for an image.
        raise BuildRefused(str(exc).split(", or pack the environment")[0]) from None
    arguments = tuple(arg for line in needs.requirements for arg in _arguments(line, source))
    for option, path in itertools.pairwise(arguments):
        if option in _FILE_OPTIONS:
            _check_inside(source / path, source, set())
    origin = needs.origin.relative_to(source).as_posix()
    asks = needs.python_origin.relative_to(source).as_posix() if needs.python_origin else None
    return ModelFolder(source, single, origin, arguments, needs.python, asks)


def _model_settings_below(source: Path) -> list[Path]:
    return [p for p in source.rglob(MODEL_SETTINGS) if not _ignored(p.relative_to(source))]


def _ignored(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts[:-1])


def _check_inside(path: Path, source: Path, seen: set[Path]) -> None:
    """The files a requirements file names (``-r``, ``-c``, at any depth) are inside the
    folder (pip reads them relative to the file naming them)."""
    if path in seen or not path.is_file():
        return  # a missing file: pip says so in the build
    seen.add(path)
    for raw in path.read_text(errors="replace").splitlines():
        option, _, value = raw.strip().partition(" ")
        if option in _FILE_OPTIONS and value.strip():
            named = (path.parent / value.strip()).resolve()
            if not named.is_relative_to(source):
                raise BuildRefused(
                    f"{path.relative_to(source)} names {value.strip()}, outside {source}, which "
                    "the image would not hold: move it into the folder"
                )
            _check_inside(named, source, seen)


def _arguments(line: str, source: Path) -> list[str]:
    """One requirement line as pip arguments: a file option's path made relative to the
    folder (read_needs made it absolute on this machine)."""
    option, _, value = line.partition(" ")
    if option not in _FILE_OPTIONS or not value.strip():
        return [line]
    path = Path(value.strip())
    if not path.is_relative_to(source):
        raise BuildRefused(
            f"the requirement {line!r} names a file outside {source}, which the image would "
            "not hold: move it into the folder"
        )
    return [option, path.relative_to(source).as_posix()]
