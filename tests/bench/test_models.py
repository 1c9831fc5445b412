"""The model repository: one folder that both inferpool and MLServer can serve."""

import json

import numpy as np

from benchmarks.models import MODELS, build_repository, features, load_predictor


def test_repository_is_shared_format_and_reproducible(tmp_path):
    first = build_repository(tmp_path / "a", ["iris", "lightgbm"])
    second = build_repository(tmp_path / "b", ["iris", "lightgbm"])
    for name in ("iris", "lightgbm"):
        settings = json.loads((first / name / "model-settings.json").read_text())
        assert settings["name"] == name
        assert settings["implementation"] == MODELS[name].implementation
        assert settings["parameters"]["uri"] == f"./{MODELS[name].artefact}"
    assert (first / "lightgbm" / "model.txt").read_text() == (
        second / "lightgbm" / "model.txt"
    ).read_text()
    x = features("lightgbm")[:64]
    scores = load_predictor(first, "lightgbm")(x)
    assert np.array_equal(scores, load_predictor(second, "lightgbm")(x))
    assert scores.shape == (64,) and scores.min() >= 0 and scores.max() <= 1
    labels = load_predictor(first, "iris")(features("iris"))
    assert set(labels) == {0, 1, 2}


def test_a_built_repository_is_reused(tmp_path):
    repo = build_repository(tmp_path, ["iris"])
    stamp = (repo / "iris" / "model.joblib").stat().st_mtime_ns
    build_repository(tmp_path, ["iris"])
    assert (repo / "iris" / "model.joblib").stat().st_mtime_ns == stamp
