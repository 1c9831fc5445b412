"""Model repository discovery: which folders are models, and which versions each holds.

The layouts MLServer and Triton users bring, all at once:

- every folder holding a ``model-settings.json``, at any depth (MLServer's recursive
  glob), is a model; its name defaults to the folder's name;
- a direct subfolder without one is a model too, named after it (its artefact chooses
  the runtime), unless it only groups model folders below it; once the repository holds
  a ``model-settings.json`` (MLServer's layout, where only such folders are models), such
  a folder is a model only if it holds a known artefact (or its numbered versions do),
  and never below a root that is itself a model (its folders are that model's files:
  ``catboost_info/``, ``mlruns/``); CatBoost's training folder (``catboost_info/``,
  holding ``catboost_training.json``) is never a model;
- a model folder whose subfolders are numbered (``iris/1``, ``iris/2``; Triton's rule:
  digits, not starting with 0) holds one version per such folder: the model folder's
  settings with the version named after the number and its files in the version folder;
- several folders may name one model with different ``parameters.version`` (MLServer's
  versions side by side); a second folder with the same name and version fails, naming
  the first.

Each model's ``version_policy`` (Triton's: latest N, all, or specific versions; none: all)
chooses which of its versions are served: in Triton's layout the model folder's, in
MLServer's the latest version's settings (``states.newer_version`` orders versions). A
version it leaves out is not discovered, so start-up, the repository API and the poll
watcher treat it as a version the repository does not hold.

A folder that cannot be read never hides the others: it is listed failed with its reason,
under its folder's path in the repository (its settings' name is unknown or taken).
Hidden folders and folders starting with ``_`` are never models, but for ModelMesh's:
its MLServer adapter lays each model out in ``_mlserver_models/<model id>/`` (a
``model-settings.json`` named after the id, its ``uri`` at the files the puller wrote in
``<model id>/`` at the root), so each such folder with settings is a model, and a root
folder named after one of them is the puller's copy of its files, not a model.

A model's name is one path segment that stays inside the repository: no ``/``, ``\\``,
``..`` or control characters. The repository API finds a model by name with
``find_models``, which refuses any other name before it touches the filesystem, and never
returns a folder that resolves (through a symlink) outside the repository's root.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inferpool.engine.states import ModelKey, model_key, newer_version
from inferpool.errors import BadRequest
from inferpool.runtimes.artefacts import is_training_output
from inferpool.runtimes.registry import has_artefact
from inferpool.settings import (
    MODEL_SETTINGS_FILE,
    ModelSettings,
    VersionPolicy,
    read_model_settings,
)
from inferpool.settings.loading import single_model

logger = logging.getLogger(__name__)

MAX_NAME_BYTES = 255  # a folder name's limit on common file systems
# Where ModelMesh's MLServer adapter writes its models' folders (see the module docstring).
ADAPTED_FOLDER = "_mlserver_models"
# Messages about version policies already logged: discovery runs again and again (each
# repository API call, each change the poll watcher sees), the log says each thing once.
_logged: set[str] = set()


@dataclass(slots=True)
class Discovered:
    """A model (one version of it) found in the repository: its settings, or why they
    could not be read. ``folder`` is where it was read from."""

    name: str
    settings: ModelSettings | None
    error: str = ""
    folder: Path | None = None

    @property
    def version(self) -> str | None:
        return self.settings.version if self.settings is not None else None

    @property
    def key(self) -> ModelKey:
        return model_key(self.name, self.version)


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
    """Every model version under ``repository``, each model folder's in path order."""
    if (single := single_model(repository)) is not None:  # MLSERVER_MODEL_*: one model
        return _served([Discovered(*single)])
    if not repository.is_dir():
        raise FileNotFoundError(f"model repository {repository} is not a folder")
    found: list[Discovered] = []
    taken: set[Path] = set()  # version folders of the root's model: not models themselves
    for folder in _model_folders(repository):
        if folder in taken:
            continue
        versions = _version_folders(folder)
        if folder == repository:
            taken.update(versions)
        found.extend(_read(folder, repository, versions))
    return _served(_first_of_each(found, repository))


def find_models(repository: Path, name: str) -> list[Discovered]:
    """Every version the repository holds of the model called ``name`` (by folder name
    or settings name; a failed folder by the name it is listed under).

    400 for a name that is not a single path segment or whose folder resolves outside
    the repository; an empty list when no model has that name. Models read from folders
    that resolve outside the repository are left out.
    """
    check_name(name)
    if not repository.is_dir():
        return []
    root = repository.resolve()
    folder = repository / name
    if (folder.is_dir() or folder.is_symlink()) and not folder.resolve().is_relative_to(root):
        raise BadRequest(f"model '{name}' resolves outside the model repository")
    return [
        found
        for found in discover(repository)
        if found.name == name
        and (found.folder is None or found.folder.resolve().is_relative_to(root))
    ]


def _model_folders(repository: Path) -> list[Path]:
    """The folders that are models, in path order (see the module's docstring)."""
    root = repository.resolve()
    folders = [repository] if _has_settings(repository) else []
    seen = {root}
    bare: list[Path] = []  # direct subfolders without settings, nor settings below
    adapted = _adapted_folders(repository, root)
    pulled = {folder.name for folder in adapted}
    for child in _subfolders(repository):
        if child.name in pulled:
            _log_once(
                logging.DEBUG, f"{child}: files of {repository / ADAPTED_FOLDER / child.name}"
            )
            continue
        below: list[Path] = []
        real = child.resolve()
        if real.is_relative_to(root) and real not in seen:
            seen.add(real)
            below = _settings_below(child, root, seen)
        if _has_settings(child) or not below:
            folders.append(child)
            if not _has_settings(child):
                bare.append(child)
        folders.extend(below)
    folders.extend(adapted)
    skipped = _not_models(repository, bare, has_settings=len(folders) > len(bare))
    return [folder for folder in folders if folder not in skipped]


def _not_models(repository: Path, bare: list[Path], has_settings: bool) -> set[Path]:
    """The folders without settings that are no models, once the repository is an
    MLServer one (it holds a ``model-settings.json``): MLServer serves only folders with
    one, and its examples keep other folders beside their models (CatBoost's
    ``catboost_info/``, MLflow's ``src/`` and ``mlruns/``). Below a model-settings.json
    at the root every folder is that model's (numbered versions aside); elsewhere a
    folder without settings stays a model when it holds a known artefact."""
    if not has_settings:
        # No settings anywhere: each folder's artefact names its runtime, but CatBoost's
        # training folder (``catboost_info/``, written where it was trained) is none
        # (unless a model was saved into it too).
        logs = {f for f in bare if is_training_output(f) and not _holds_artefact(f)}
        for folder in sorted(logs):
            _log_once(logging.INFO, f"{folder}: CatBoost's training output, not a model")
        return logs
    at_root = _has_settings(repository)
    skipped = {folder for folder in bare if at_root or not _holds_artefact(folder)}
    for folder in sorted(skipped):
        _log_once(
            logging.INFO,
            f"{folder}: no {MODEL_SETTINGS_FILE} and no model artefact, not a model "
            f"(the repository holds {MODEL_SETTINGS_FILE} files: MLServer's layout)"
            if not at_root
            else f"{folder}: a folder of the model at {repository} (its "
            f"{MODEL_SETTINGS_FILE}), not a model",
        )
    return skipped


def _adapted_folders(repository: Path, root: Path) -> list[Path]:
    """ModelMesh's MLServer adapter's model folders: ``_mlserver_models/<id>/`` holding a
    ``model-settings.json``, inside the repository."""
    base = repository / ADAPTED_FOLDER
    if not base.is_dir() or not base.resolve().is_relative_to(root):
        return []
    return [
        folder
        for folder in _subfolders(base)
        if _has_settings(folder) and folder.resolve().is_relative_to(root)
    ]


def _holds_artefact(folder: Path) -> bool:
    """A known artefact in the folder, or in one of its numbered version folders."""
    return has_artefact(folder) or any(has_artefact(v) for v in _version_folders(folder))


def _settings_below(folder: Path, root: Path, seen: set[Path]) -> list[Path]:
    """Folders below ``folder`` holding a settings file (never outside the root, each
    real folder once: a symlink loop ends)."""
    found = []
    for child in _subfolders(folder):
        real = child.resolve()
        if not real.is_relative_to(root) or real in seen:
            continue
        seen.add(real)
        if _has_settings(child):
            found.append(child)
        found.extend(_settings_below(child, root, seen))
    return found


def _subfolders(folder: Path) -> list[Path]:
    try:
        children = sorted(folder.iterdir())
    except OSError:
        return []
    return [path for path in children if not path.name.startswith((".", "_")) and path.is_dir()]


def _has_settings(folder: Path) -> bool:
    return (folder / MODEL_SETTINGS_FILE).is_file()


def _version_folders(folder: Path) -> list[Path]:
    """Triton's numbered version folders of a model folder (without settings of their
    own: those are models of their own), lowest number first."""
    numbered = [
        path
        for path in _subfolders(folder)
        if path.name.isascii() and path.name.isdigit() and not path.name.startswith("0")
    ]
    return sorted((p for p in numbered if not _has_settings(p)), key=lambda p: int(p.name))


def _read(folder: Path, repository: Path, versions: list[Path]) -> list[Discovered]:
    """The model in ``folder``: one entry, or one per numbered version folder."""
    listed = _listed_name(folder, repository)
    try:
        settings = read_model_settings(folder, default_name=folder.name)
    except ValueError as exc:
        return [Discovered(listed, None, str(exc), folder)]
    problem = name_problem(settings.name)
    if problem is not None:
        # Listed under its folder, so it can still be seen and unloaded.
        error = f"{folder / MODEL_SETTINGS_FILE}: name: {problem}"
        return [Discovered(listed, None, error, folder)]
    if not versions:
        return [Discovered(settings.name, settings, "", folder)]
    return [
        Discovered(settings.name, _as_version(settings, version), "", version)
        for version in versions
    ]


def _as_version(settings: ModelSettings, folder: Path) -> ModelSettings:
    """The model folder's settings for one numbered version: its number, its files."""
    parameters = settings.parameters.model_copy(update={"version": folder.name})
    return settings.model_copy(update={"folder": folder, "parameters": parameters})


def _first_of_each(found: list[Discovered], repository: Path) -> list[Discovered]:
    """A second folder naming a model and version already found fails, naming the first."""
    first: dict[ModelKey, Discovered] = {}
    result = []
    for entry in found:
        if entry.settings is not None:
            earlier = first.setdefault(entry.key, entry)
            if earlier is not entry:
                version = f" version '{entry.version}'" if entry.version else ""
                entry = Discovered(
                    _listed_name(entry.folder or repository, repository),
                    None,
                    f"{entry.folder}: model '{entry.name}'{version} is already served "
                    f"from {earlier.folder}",
                    entry.folder,
                )
        result.append(entry)
    return result


def _served(found: list[Discovered]) -> list[Discovered]:
    """The versions each model's version policy keeps, in ``found``'s order; each keeps
    the policy that chose it in its settings (what the model configuration reports)."""
    versions: dict[str, list[Discovered]] = {}
    for entry in found:
        if entry.settings is not None:
            versions.setdefault(entry.name, []).append(entry)
    served: set[int] = set()  # the ids of the versions kept
    for name, held in versions.items():
        held.sort(key=functools.cmp_to_key(_newer), reverse=True)  # newest first
        newest = held[0].settings
        assert newest is not None
        policy = newest.version_policy
        served |= _kept(name, policy, held)
        for entry in held:
            if entry.settings is not None and entry.settings.version_policy != policy:
                entry.settings = entry.settings.model_copy(update={"version_policy": policy})
    return [entry for entry in found if entry.settings is None or id(entry) in served]


def _kept(name: str, policy: VersionPolicy | None, held: list[Discovered]) -> set[int]:
    """The ids of the versions of ``held`` (newest first) that ``policy`` serves; the
    others, and versions it names that are not held, are logged."""
    kept = held
    if policy is not None and policy.latest is not None:
        kept = held[: policy.latest.num_versions]
    elif policy is not None and policy.specific is not None:
        wanted = policy.specific.versions
        kept = [entry for entry in held if entry.version in wanted]
        versions = {entry.version for entry in held}
        if missing := [version for version in wanted if version not in versions]:
            _log_once(
                logging.WARNING,
                f"model '{name}': its version_policy names {_versions(missing)}, which the "
                "repository does not hold",
            )
    ids = {id(entry) for entry in kept}
    if others := [entry.version for entry in held if id(entry) not in ids]:
        _log_once(
            logging.INFO,
            f"model '{name}': {_versions(others)} left out by its version_policy (not loaded)",
        )
    return ids


def _newer(a: Discovered, b: Discovered) -> int:
    return newer_version(a.version, b.version)


def _versions(versions: Sequence[str | None]) -> str:
    shown = ", ".join("(no version)" if v is None else f"'{v}'" for v in versions)
    return ("version " if len(versions) == 1 else "versions ") + shown


def _log_once(level: int, message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.log(level, "%s", message)


def _listed_name(folder: Path, repository: Path) -> str:
    """The name a failed folder is listed under: its path in the repository."""
    relative = folder.relative_to(repository).as_posix()
    return folder.name if relative == "." else relative


def _shown(name: str) -> str:
    """A name as an error message may show it: quoted, escaped, and not too long."""
    shown = repr(name)
    return shown if len(shown) <= 80 else shown[:77] + "..."
