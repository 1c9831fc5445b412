"""Loading the three outlier detectors that compute with scikit-learn and numpy only,
``IForest``, ``Mahalanobis`` and ``SpectralResidual``, from the legacy folder
``save_detector`` writes for them (``meta.dill`` and ``<name>.dill``), in an environment
without TensorFlow.

alibi-detect 0.13 saves these three only in its legacy format, and reads that format
only through its TensorFlow module (``load_detector`` fails with "install
alibi-detect[tensorflow]" without it), although none of them uses TensorFlow. A
detector saved where TensorFlow is installed is served here from an environment of
``alibi-detect`` alone (docs/runtimes/alibi-detect.md), rebuilt as alibi-detect's legacy
loader rebuilds it: the constructor's settings, then the fitted state, then the saved
``meta``. With TensorFlow importable, alibi-detect's own loader is used instead.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dill
from alibi_detect.od import IForest, Mahalanobis, SpectralResidual

from inferpool.errors import ModelLoadError

META_FILE = "meta.dill"

# What each detector's constructor takes from its saved state, then what it was fitted to.
MAHALANOBIS_SETTINGS = ("threshold", "n_components", "std_clip", "start_clip", "max_n",
                        "cat_vars", "ohe")  # fmt: skip
MAHALANOBIS_STATE = ("d_abs", "clip", "mean", "C", "n")
# All SpectralResidual's saved state: alibi-detect 0.13 saves no padding settings, so its
# loader (and this one) rebuilds the detector with the constructor's default paddings.
SPECTRAL_RESIDUAL_SETTINGS = ("threshold", "window_amp", "window_local", "n_est_points",
                              "n_grad_points")  # fmt: skip


def _iforest(state: dict[str, Any]) -> Any:
    detector = IForest(threshold=state["threshold"])
    detector.isolationforest = state["isolationforest"]
    return detector


def _mahalanobis(state: dict[str, Any]) -> Any:
    detector = Mahalanobis(**{key: state[key] for key in MAHALANOBIS_SETTINGS})
    for key in MAHALANOBIS_STATE:
        setattr(detector, key, state[key])
    return detector


def _spectral_residual(state: dict[str, Any]) -> Any:
    return SpectralResidual(**{key: state[key] for key in SPECTRAL_RESIDUAL_SETTINGS})


BUILDERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "IForest": _iforest,
    "Mahalanobis": _mahalanobis,
    "SpectralResidual": _spectral_residual,
}


def without_tensorflow(folder: Path) -> Any | None:
    """The IForest, Mahalanobis or SpectralResidual saved (legacy format) in ``folder``,
    when TensorFlow is not importable; None when alibi-detect's ``load_detector`` should
    load the folder (any other folder or detector, or TensorFlow present)."""
    meta_file = folder / META_FILE
    if not meta_file.is_file() or importlib.util.find_spec("tensorflow") is not None:
        return None
    with meta_file.open("rb") as opened:
        meta = dill.load(opened)
    name = meta.get("name") if isinstance(meta, dict) else None
    if name not in BUILDERS:
        return None  # alibi-detect says what it lacks (TensorFlow for the other detectors)
    state_file = folder / f"{name}.dill"
    if not state_file.is_file():
        raise ModelLoadError(f"{folder} holds {META_FILE} for {name} but not {state_file.name}")
    with state_file.open("rb") as opened:
        state = dill.load(opened)
    try:
        detector = BUILDERS[name](state)
    except KeyError as missing:
        raise ModelLoadError(f"{state_file} lacks {name}'s {missing}") from None
    detector.meta = meta
    return detector
