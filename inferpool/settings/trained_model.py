"""KServe's TrainedModel spec as a model's settings, for folders without a
``model-settings.json``.

KServe's model agent (``pkg/agent``: its puller and downloader) pulls each TrainedModel's
``storageUri`` into ``<models dir>/<TrainedModel name>/``, writes the TrainedModel's
``spec.model`` there as JSON in ``SUCCESS.<sha256 of the spec>`` (``{"storageUri": ...,
"framework": "sklearn", "memory": "256Mi"}``), then calls ``POST
/v2/repository/models/<name>/load``. That file is read here:

- ``framework`` chooses the runtime (``FRAMEWORKS``; a framework inferpool does not serve
  fails the model with a sentence naming the ones it does);
- ``memory`` (a Kubernetes quantity: the most the model may take, which KServe's
  controller sums against the server's memory to place TrainedModels) has no inferpool
  setting of the same meaning (``max_memory`` bounds each call's allocations, not the
  model), so it is kept as ``parameters.memory``, as given, for the metadata and the
  runtime to read;
- ``storageUri`` is where the files came from: kept as ``parameters.storage_uri``.

The agent's ``models.json`` entries (``{"modelName": ..., "modelSpec": {...}}``) are read
too when such a file holds one entry's shape instead of the bare spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC_GLOB = "SUCCESS.*"  # the agent's success file: the spec it pulled, as JSON
# TrainedModel frameworks → inferpool's runtimes (the names in runtimes/registry.py).
FRAMEWORKS = {
    "sklearn": "sklearn",
    "scikit-learn": "sklearn",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
    "mlflow": "mlflow",
    "catboost": "catboost",
    "onnx": "onnx",
}


def trained_model_settings(folder: Path) -> dict[str, Any]:
    """The settings a TrainedModel spec in ``folder`` gives (``runtime``, ``parameters``),
    or ``{}`` when the folder holds none; ``ValueError`` with a one-line reason for a
    spec that cannot be read or names a framework inferpool does not serve."""
    path = spec_file(folder)
    if path is None:
        return {}
    try:
        spec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a TrainedModel spec: {exc}") from None
    if isinstance(spec, dict) and isinstance(spec.get("modelSpec"), dict):
        spec = spec["modelSpec"]  # a models.json entry: {"modelName", "modelSpec"}
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a TrainedModel spec is a JSON object")
    return settings_of(spec, str(path))


def settings_of(spec: dict[str, Any], where: str) -> dict[str, Any]:
    """A TrainedModel ``spec.model`` as model settings (see the module's docstring)."""
    settings: dict[str, Any] = {}
    parameters: dict[str, Any] = {}
    framework = spec.get("framework")
    if framework:
        runtime = FRAMEWORKS.get(str(framework).lower())
        if runtime is None:
            served = ", ".join(sorted(set(FRAMEWORKS)))
            raise ValueError(
                f"{where}: framework '{framework}' is not served by inferpool (it serves {served})"
            )
        settings["runtime"] = runtime
    if spec.get("memory"):
        parameters["memory"] = str(spec["memory"])
    if spec.get("storageUri"):
        parameters["storage_uri"] = str(spec["storageUri"])
    if parameters:
        settings["parameters"] = parameters
    return settings


def spec_file(folder: Path) -> Path | None:
    """The agent's newest success file in ``folder``, or None."""
    try:
        found = [path for path in folder.glob(SPEC_GLOB) if path.is_file()]
    except OSError:
        return None
    return max(found, key=_modified) if found else None


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
