"""A model repository of small models and the pipelines over them (tests of
``engine/pipelines``): a scaling custom runtime, iris regressors and classifiers, and
chain, router and aggregator pipelines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import iris_data, write_custom_model
from tests.support.runtimes import save_pickle

# Multiplies its input by ``parameters.extra.factor``; refuses negative values with a
# BadRequest (400), so a failing step's status shows in the pipeline's answer.
SCALE_SOURCE = """
import numpy as np

from inferpool import Runtime
from inferpool.errors import BadRequest


class Scale(Runtime):
    def load(self):
        self.factor = float(self.settings.parameters.extra.get("factor", 2.0))

    def predict(self, payload, outputs):
        if (payload < 0).any():
            raise BadRequest("negative values cannot be scaled")
        return {outputs[0]: np.asarray(payload, dtype=np.float64) * self.factor}
"""

IRIS_FEATURES = 4


def write_pipeline(root: Path, name: str, pipeline: dict[str, Any], **settings: Any) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    document = {"name": name, "pipeline": pipeline, **settings}
    (folder / "model-settings.json").write_text(json.dumps(document))
    return folder


def iris_models() -> dict[str, Any]:
    """The estimators the repository serves, fitted on iris (fixed, no randomness)."""
    from sklearn.dummy import DummyClassifier
    from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge

    X, y = iris_data()
    return {
        "reg-a": LinearRegression().fit(X, y.astype(float)),
        "reg-b": Ridge(alpha=10.0).fit(X, y.astype(float)),
        "clf-a": DummyClassifier(strategy="constant", constant=0).fit(X, y),
        "clf-b": LogisticRegression(max_iter=500).fit(X, y),
        "clf-c": DummyClassifier(strategy="constant", constant=2).fit(X, y),
    }


def build_pipeline_repository(root: Path) -> dict[str, Any]:
    """The repository under ``root``; the estimators it serves, by model name."""
    spec = {"name": "x", "datatype": "FP64", "shape": [-1, IRIS_FEATURES]}
    write_custom_model(
        root / "scale",
        SCALE_SOURCE,
        "Scale",
        parameters={"extra": {"factor": 2.0}},
        inputs=[spec],
        outputs=[{"name": "scaled", "datatype": "FP64", "shape": [-1, IRIS_FEATURES]}],
    )
    models = iris_models()
    for name, estimator in models.items():
        save_pickle(root / name, estimator)
    write_pipeline(
        root,
        "chain",
        {
            "steps": [
                {"name": "first", "model": "scale"},
                {"name": "second", "model": "scale", "inputs": {"x": "first.scaled"}},
                {"model": "reg-a", "inputs": {"input-0": "second.scaled"}},
            ]
        },
    )
    write_pipeline(
        root,
        "route-by-class",
        {
            "steps": [
                {
                    "model": "clf-b",
                    "inputs": {"input-0": "pipeline.x"},
                    "outputs": ["predict_proba"],
                },
                {
                    "name": "regress",
                    "route": {
                        "on": "clf-b.predict_proba",
                        "rule": "argmax",
                        "branches": {
                            "0": {"model": "reg-a", "inputs": {"input-0": "pipeline.x"}},
                            "1": {"model": "reg-b", "inputs": {"input-0": "pipeline.x"}},
                        },
                    },
                },
            ]
        },
        inputs=[spec],
    )
    write_pipeline(
        root,
        "route-by-tier",
        {
            "steps": [
                {
                    "name": "pick",
                    "route": {
                        "on": "parameters.tier",
                        "branches": {"gold": {"model": "reg-a"}, "silver": {"model": "reg-b"}},
                    },
                }
            ]
        },
    )
    write_pipeline(
        root,
        "mean",
        {
            "steps": [
                {
                    "name": "avg",
                    "aggregate": {
                        "models": [{"model": "reg-a"}, {"model": "reg-b"}],
                        "combine": "mean",
                    },
                }
            ]
        },
    )
    write_pipeline(
        root,
        "vote",
        {
            "steps": [
                {
                    "name": "ballot",
                    "aggregate": {
                        "models": [{"model": "clf-a"}, {"model": "clf-b"}, {"model": "clf-c"}],
                        "combine": "vote",
                    },
                }
            ]
        },
    )
    return models


def expected_vote(models: dict[str, Any], X: np.ndarray) -> np.ndarray:
    """Majority of clf-a, clf-b, clf-c per row; a three-way tie goes to clf-a's label."""
    votes = np.stack([models[name].predict(X) for name in ("clf-a", "clf-b", "clf-c")])
    out = []
    for column in votes.T:
        values, counts = np.unique(column, return_counts=True)
        top = values[counts == counts.max()]
        out.append(next(label for label in column if label in top))
    return np.array(out)
