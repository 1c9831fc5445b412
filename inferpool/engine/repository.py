"""Model repository discovery: each folder is a model, named after the folder.

A model's name is one path segment that stays inside the repository: no ``/``, ``\\``,
``..`` or control characters. The repository API finds a model by name with
``find_model``, which refuses any other name before it touches the filesystem, and never
reads a folder that resolves (through a symlink) outside the repository's root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferpool.errors import BadRequest
from inferpool.settings import MODEL_SETTINGS_FILE, ModelSettings, read_model_settings

MAX_NAME_BYTES = 255  # a folder name's limit on common file systems


@dataclass(slots=True)
class Discovered:
    """A model found in the repository: its settings, or why they could not be read."""

    name: str
    settings: ModelSettings | None
    error: str = ""


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model, or None when it can."""
    if not name:
        return "a model name cannot be empty"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"a model name has at most {MAX_NAME_BYTES} bytes"
    if "/" in name or "\\" in name or ".." in name:
        return "a model name cannot hold '/', '\\' or '..'"
    if name == "." or not name.isprintable():
        return "a model name cannot be '.' or hold control characters"
    return None


def check_name(name: str) -> None:
    """Refuse (400) a name that could leave the repository or is no folder name."""
    problem = name_problem(name)
    if problem is not None:
        raise BadRequest(f"invalid model name {_shown(name)}: {problem}")


def discover(repository: Path) -> list[Discovered]:
    """Every model under ``repository``; a settings file at its root makes it one model."""
    if not repository.is_dir():
        raise FileNotFoundError(f"model repository {repository} is not a folder")
    folders = []
    if (repository / MODEL_SETTINGS_FILE).is_file():
        folders.append(repository)
    folders.extend(_model_folders(repository))
    return [_read(folder) for folder in folders]


def find_model(repository: Path, name: str) -> Discovered | None:
    """The model called ``name`` in the repository (by folder name or settings name).

    400 for a name that is not a single path segment or whose folder resolves outside
    the repository; None when no model has that name. Folders that resolve outside the
    repository are not read.
    """
    check_name(name)
    if not repository.is_dir():
        return None
    root = repository.resolve()
    folder = repository / name
    if folder.is_dir() or folder.is_symlink():
        if not folder.resolve().is_relative_to(root):
            raise BadRequest(f"model '{name}' resolves outside the model repository")
        found = _read(folder)
        if found.name == name:
            return found
    candidates = [repository] if (repository / MODEL_SETTINGS_FILE).is_file() else []
    candidates += [f for f in _model_folders(repository) if f.resolve().is_relative_to(root)]
    for candidate in candidates:
        if candidate.name == name and candidate != repository:
            continue  # read above: its settings name another model
        found = _read(candidate)
        if found.name == name:
            return found
    return None


def _model_folders(repository: Path) -> list[Path]:
    return sorted(
        path
        for path in repository.iterdir()
        if path.is_dir() and not path.name.startswith((".", "_"))
    )


def _read(folder: Path) -> Discovered:
    try:
        settings = read_model_settings(folder, default_name=folder.name)
    except ValueError as exc:
        return Discovered(folder.name, None, str(exc))
    problem = name_problem(settings.name)
    if problem is not None:
        # Listed under its folder's name, so it can still be seen and unloaded.
        return Discovered(folder.name, None, f"{folder / MODEL_SETTINGS_FILE}: name: {problem}")
    return Discovered(settings.name, settings)


def _shown(name: str) -> str:
    """A name as an error message may show it: quoted, escaped, and not too long."""
    shown = repr(name)
    return shown if len(shown) <= 80 else shown[:77] + "..."
