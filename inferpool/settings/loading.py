"""Reading the settings files: a server's (``settings.json`` in its repository, over the
environment, under its flags) and a model's (``model-settings.json`` in its folder, with
MLServer's key checks and the model variables).

The top of the package: it puts the models (``server``, ``model``) and MLServer's
contract (``inferpool.mlserver.contract.model_settings``) together, so that neither
imports the other; single-model mode's one model (``MLSERVER_MODEL_*`` and no
model-settings.json) is built here for that reason.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from inferpool.mlserver.contract.common import warn_once
from inferpool.mlserver.contract.model_settings import (
    ENVIRONMENT_MODEL,
    check_model_keys,
    model_environment,
    single_model_repository,
    with_model_environment,
)
from inferpool.settings.model import MODEL_SETTINGS_FILE, ModelParameters, ModelSettings
from inferpool.settings.server import ServerSettings
from inferpool.settings.sources import reading_settings_file
from inferpool.settings.trained_model import trained_model_settings

SETTINGS_FILE = "settings.json"


def load_server_settings(repository: Path | None, overrides: dict[str, Any]) -> ServerSettings:
    """Settings for a server of ``repository``; ``overrides`` are the CLI flags given."""
    if repository is None:
        # The environment's (or, in single-model mode, the folder of its model's URI).
        repository = ServerSettings().model_repository or single_model_repository(os.environ)
    path = repository / SETTINGS_FILE if repository is not None else None
    with reading_settings_file(path if path is not None and path.is_file() else None):
        if repository is not None:
            overrides = {"model_repository": repository, **overrides}
        return ServerSettings(**overrides)


def read_model_settings(folder: Path, default_name: str) -> ModelSettings:
    """The settings of the model in ``folder``; ``ValueError`` with a one-line reason."""
    raw: dict[str, Any] = {}
    path = folder / MODEL_SETTINGS_FILE
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: must hold a JSON object")
        check_model_keys(raw, str(path))
        raw = with_model_environment(raw, os.environ)
    else:  # KServe's model agent writes the TrainedModel's spec beside its files
        raw = trained_model_settings(folder)
    raw.setdefault("name", default_name)
    raw["folder"] = folder
    try:
        return ModelSettings(**raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{path}: {where}: {first['msg']}") from None


def single_model(
    repository: Path,
) -> tuple[str, ModelSettings | None, str, Path] | None:
    """Single-model mode's one model: (name, settings or None, error, folder); else None.

    Active when model variables name the model or its URI and the repository holds no
    model-settings.json (MLServer reads the environment's model only then). The artefact is
    at the URI (a file, or a folder), or else at the repository's root. Variables naming
    neither (KServe's multi-model InferenceService: no storageUri, so only the runtime's
    MLSERVER_MODEL_IMPLEMENTATION) describe no model: the repository's folders are the
    models, e.g. the TrainedModels its model agent pulls (``trained_model``).
    """
    raw = model_environment(os.environ)
    named = raw.get("name") or raw.get("parameters", {}).get("uri")
    if not named or not repository.is_dir() or _has_settings_file(repository):
        return None
    where = ENVIRONMENT_MODEL
    parameters = dict(raw.pop("parameters", {}))
    folder = repository
    uri = parameters.pop("uri", None)
    if uri:
        path = Path(uri)
        if path.is_dir():
            folder = path
        else:
            folder, parameters["uri"] = path.parent, str(path)
    name = raw.pop("name", None) or folder.name
    try:
        check_model_keys({**raw, "parameters": parameters}, where)
        settings = ModelSettings(
            name=name, parameters=ModelParameters(**parameters), folder=folder, **raw
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(map(str, first["loc"]))
        return name, None, f"{where}: {loc}: {first['msg']}", folder
    except ValueError as exc:
        return name, None, str(exc), folder
    warn_once(f"single-model mode: model '{name}' from {folder}", logging.INFO)
    return name, settings, "", folder


def _has_settings_file(repository: Path) -> bool:
    return any(True for _ in repository.glob(f"**/{MODEL_SETTINGS_FILE}"))
