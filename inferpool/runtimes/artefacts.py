"""Finding a model's artefact file, and telling artefacts apart without loading a library.

Nothing here imports a model library, so the registry can choose a runtime before the
runtime's library is imported (a missing library must give "install inferpool[...]").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from inferpool.settings import ModelSettings

# The first bytes of a LightGBM text model (model.txt, or a .bst written by LightGBM).
LIGHTGBM_TEXT_MAGIC = b"tree\n"
PICKLE_SUFFIXES = (".joblib", ".pkl", ".pickle")
# The file CatBoost's training writes in its ``train_dir`` (``catboost_info/`` by default,
# in the working directory: often the models' folder), beside logs; never a model.
CATBOOST_TRAINING_LOG = "catboost_training.json"


@contextmanager
def single_threaded() -> Iterator[None]:
    """Load without starting an OpenMP thread pool.

    LightGBM and XGBoost parse their trees in OpenMP parallel loops; a pool started while
    loading would make the process unsafe to fork (DESIGN §3: workers fork from a parent
    that has loaded the models). The limit applies to the calling thread only.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="openmp"):
        yield


class HasSettings(Protocol):
    settings: ModelSettings


def find_artefact(runtime: HasSettings, names: Sequence[str]) -> Path:
    """The artefact named by ``parameters.uri``, or the first of ``names`` in the folder."""
    settings = runtime.settings
    if settings.parameters.uri:
        path = settings.resolve(settings.parameters.uri)
        if path.is_dir():
            return find_in_folder(path, names)
        if not path.exists():
            raise FileNotFoundError(f"model file {path} does not exist")
        return path
    if settings.folder is None:
        raise FileNotFoundError(f"model '{settings.name}' names no uri and has no folder")
    return find_in_folder(settings.folder, names)


def find_in_folder(folder: Path, names: Sequence[str]) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"none of {', '.join(names)} in {folder}")


def is_lightgbm_text(path: Path) -> bool:
    """Whether a file is a LightGBM text model (XGBoost writes JSON, UBJSON or binary)."""
    try:
        with path.open("rb") as file:
            head = file.read(len(LIGHTGBM_TEXT_MAGIC) + 1)
    except OSError:
        return False
    return head.replace(b"\r\n", b"\n").startswith(LIGHTGBM_TEXT_MAGIC)


def is_training_output(folder: Path) -> bool:
    """Whether ``folder`` holds what a library's training wrote rather than a model:
    CatBoost's ``catboost_info/`` (its training log), which is no model folder."""
    return (folder / CATBOOST_TRAINING_LOG).is_file()


def library_of(model: Any) -> str | None:
    """``"lightgbm"`` or ``"xgboost"`` for an object those libraries define, else None.

    Read from the class's module, so the library need not be imported to ask.
    """
    for cls in type(model).__mro__:
        package = cls.__module__.partition(".")[0]
        if package in ("lightgbm", "xgboost"):
            return package
    return None


def unpickle(path: Path) -> Any:
    """A model saved with joblib or pickle (joblib reads both)."""
    import joblib  # only pickled artefacts need it

    with single_threaded():
        return joblib.load(path)
