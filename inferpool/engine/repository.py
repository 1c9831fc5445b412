"""Model repository discovery: each folder is a model, named after the folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferpool.settings import MODEL_SETTINGS_FILE, ModelSettings, read_model_settings


@dataclass(slots=True)
class Discovered:
    """A model found in the repository: its settings, or why they could not be read."""

    name: str
    settings: ModelSettings | None
    error: str = ""


def discover(repository: Path) -> list[Discovered]:
    """Every model under ``repository``; a settings file at its root makes it one model."""
    if not repository.is_dir():
        raise FileNotFoundError(f"model repository {repository} is not a folder")
    folders = []
    if (repository / MODEL_SETTINGS_FILE).is_file():
        folders.append(repository)
    folders.extend(
        sorted(
            path
            for path in repository.iterdir()
            if path.is_dir() and not path.name.startswith((".", "_"))
        )
    )
    return [_read(folder) for folder in folders]


def find_model(repository: Path, name: str) -> Discovered | None:
    """The model called ``name`` in the repository (by settings name or folder name)."""
    for found in discover(repository):
        if found.name == name:
            return found
    return None


def _read(folder: Path) -> Discovered:
    try:
        settings = read_model_settings(folder, default_name=folder.name)
    except ValueError as exc:
        return Discovered(folder.name, None, str(exc))
    return Discovered(settings.name, settings)
