"""Chooses the runtime class for a model: from settings, MLServer names or the artefact."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from inferpool.runtimes.artefacts import is_lightgbm_text
from inferpool.runtimes.base import Runtime
from inferpool.settings import ModelSettings

# runtime name → (module, class, pip extra that provides the library)
BUILTIN_RUNTIMES: dict[str, tuple[str, str, str]] = {
    "sklearn": ("inferpool.runtimes.sklearn", "SKLearnRuntime", "sklearn"),
    "lightgbm": ("inferpool.runtimes.lightgbm", "LightGBMRuntime", "lightgbm"),
    "xgboost": ("inferpool.runtimes.xgboost", "XGBoostRuntime", "xgboost"),
    "mlflow": ("inferpool.runtimes.mlflow", "MLflowRuntime", "mlflow"),
}

# MLServer's implementation strings, so an MLServer repository serves unchanged.
MLSERVER_IMPLEMENTATIONS = {
    "mlserver_sklearn.SKLearnModel": "sklearn",
    "mlserver_lightgbm.LightGBMModel": "lightgbm",
    "mlserver_xgboost.XGBoostModel": "xgboost",
    "mlserver_mlflow.MLflowRuntime": "mlflow",
}

# Artefact file names recognised without settings, in order of preference. MLmodel comes
# first: an MLflow folder also holds its flavour's file (an sklearn flavour's model.pkl).
ARTEFACTS: tuple[tuple[str, str], ...] = (
    ("MLmodel", "mlflow"),
    ("model.joblib", "sklearn"),
    ("model.pkl", "sklearn"),
    ("model.pickle", "sklearn"),
    ("model.txt", "lightgbm"),
    ("model.json", "xgboost"),
    ("model.ubj", "xgboost"),
    ("model.bst", "xgboost"),
    ("model.xgb", "xgboost"),
)


class RuntimeNotFound(Exception):
    """No runtime could be chosen or imported; the message is the one-line reason."""


def runtime_name_for(settings: ModelSettings) -> str:
    """The runtime's name, or the ``module.Class`` of a custom implementation."""
    if settings.runtime:
        return settings.runtime
    implementation = settings.implementation
    if implementation:
        return MLSERVER_IMPLEMENTATIONS.get(implementation, implementation)
    return infer_runtime(settings)


def infer_runtime(settings: ModelSettings) -> str:
    """Recognise the runtime from the artefact named by ``uri`` or found in the folder."""
    if settings.parameters.uri:
        uri = settings.resolve(settings.parameters.uri)
        if uri.is_dir():
            return _runtime_in_folder(uri)
        for filename, runtime in ARTEFACTS:
            suffix = Path(filename).suffix
            if uri.name == filename or (suffix and uri.suffix == suffix):
                return _by_content(uri, runtime)
    if settings.folder is not None:
        return _runtime_in_folder(settings.folder)
    raise RuntimeNotFound(f"model '{settings.name}' has no folder and no runtime")


def _runtime_in_folder(folder: Path) -> str:
    for filename, runtime in ARTEFACTS:
        if (folder / filename).exists():
            return _by_content(folder / filename, runtime)
    expected = ", ".join(name for name, _ in ARTEFACTS)
    raise RuntimeNotFound(f"no model artefact in {folder} (expected one of: {expected})")


def _by_content(path: Path, runtime: str) -> str:
    """The runtime for an artefact whose name two libraries use: a ``.bst`` is written by
    XGBoost (binary or UBJSON) or by LightGBM (text), so its first bytes decide."""
    if path.suffix == ".bst" and is_lightgbm_text(path):
        return "lightgbm"
    return runtime


def runtime_class(settings: ModelSettings) -> type[Runtime]:
    """Import the runtime class for a model, or raise RuntimeNotFound with what to do."""
    name = runtime_name_for(settings)
    if name in BUILTIN_RUNTIMES:
        module_name, class_name, extra = BUILTIN_RUNTIMES[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("inferpool"):
                raise RuntimeNotFound(f"runtime '{name}' is not available in this build") from None
            raise RuntimeNotFound(
                f"the '{name}' runtime needs {exc.name}: install inferpool[{extra}]"
            ) from None
        return getattr(module, class_name)
    return _custom_class(name, settings)


def _custom_class(implementation: str, settings: ModelSettings) -> type[Runtime]:
    module_name, _, class_name = implementation.rpartition(".")
    if not module_name:
        known = ", ".join(BUILTIN_RUNTIMES)
        raise RuntimeNotFound(
            f"unknown runtime '{implementation}': use one of {known} or module.Class"
        )
    try:
        module = _import_model_module(module_name, settings.folder)
    except ImportError as exc:
        raise RuntimeNotFound(f"cannot import '{module_name}': {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise RuntimeNotFound(f"'{implementation}' is not a subclass of inferpool.Runtime")
    return cls


def _import_model_module(module_name: str, folder: Path | None) -> ModuleType:
    """The module of a custom runtime: from its file in the model's folder, else installed.

    A module found in the folder is executed from its file under a name unique to that
    folder, so two models that each ship a ``model.py`` do not share one module, and a
    reload runs the file again. The folder goes at the END of ``sys.path`` (for the
    module's own sibling imports): a file in it named like a standard-library or
    installed module (``json.py``, ``random.py``) must never replace that module for the
    other models of the process.
    """
    top, _, rest = module_name.partition(".")
    location = _module_file(folder, top) if folder is not None else None
    if location is None:
        return importlib.import_module(module_name)
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]
    unique = f"_inferpool_model_{digest}_{top}"
    for loaded in [name for name in sys.modules if name.split(".")[0] == unique]:
        del sys.modules[loaded]  # a reload runs the model's current files
    path, package = location
    spec = importlib.util.spec_from_file_location(
        unique, path, submodule_search_locations=[str(path.parent)] if package else None
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(unique, None)
        raise
    return importlib.import_module(f"{unique}.{rest}") if rest else module


def _module_file(folder: Path, name: str) -> tuple[Path, bool] | None:
    """``name.py`` or the package ``name/`` in ``folder``: (its file, is a package)."""
    if not name.isidentifier():
        return None
    package = folder / name / "__init__.py"
    if package.is_file():
        return package, True
    module = folder / f"{name}.py"
    if module.is_file():
        return module, False
    return None
