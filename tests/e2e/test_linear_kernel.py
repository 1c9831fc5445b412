"""The linear kernel in a real server: a LogisticRegression and a StandardScaler +
LogisticRegression pipeline say in the load log that the linear kernel predicts them,
and answer over REST (labels and probabilities) as scikit-learn does, in-process and in
worker processes; ``tree_kernel: false`` keeps a model on scikit-learn."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support import iris_data, write_sklearn_model
from tests.support.grpc import models_server
from tests.support.runtimes import output_array, rows_request

server = models_server  # the module's server fixture, over its models


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    root = tmp_path_factory.mktemp("linear")
    X, y = iris_data()
    labels = np.array(["setosa", "versicolor", "virginica"])[y]
    plain = LogisticRegression(max_iter=1000).fit(X, labels)
    scaled = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(X, y)
    write_sklearn_model(root / "logreg", plain)
    write_sklearn_model(root / "scaled-logreg", scaled)
    library = write_sklearn_model(root / "logreg-library", plain)
    (library / "model-settings.json").write_text(
        json.dumps({"parameters": {"extra": {"tree_kernel": False}}})
    )
    return root, {"logreg": plain, "scaled-logreg": scaled, "logreg-library": plain}


def test_the_log_says_the_linear_kernel_predicts(server):
    log = server.output()
    expected = {
        "logreg": r"the linear kernel \(LogisticRegression, 4 features, 3 classes\)",
        # scikit-learn's float32 scaling differs between its versions: then float32 rows
        # are left to it, and the log says so.
        "scaled-logreg": (
            r"the linear kernel \(StandardScaler \+ LogisticRegression, 4 features, 3 classes"
            r"(, float32 rows by scikit-learn)?\)"
        ),
        "logreg-library": r"scikit-learn \(tree_kernel is off\)",
    }
    for model, predictor in expected.items():
        assert re.search(rf"model '{model}': .*predicted by {predictor}", log), log


@pytest.mark.parametrize("model", ["logreg", "scaled-logreg", "logreg-library"])
@pytest.mark.parametrize("n_rows", [1, 40])
def test_rest_answers_match_scikit_learn(server, models, model, n_rows):
    X, _ = iris_data()
    rng = np.random.default_rng(n_rows)
    rows = X.mean(axis=0) + X.std(axis=0) * rng.normal(scale=1.5, size=(n_rows, X.shape[1]))
    rows[::7, 2] = 0.0
    body = rows_request(rows, ["predict", "predict_proba"])
    reply = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    estimator = models[1][model]
    labels = output_array(reply.json(), "predict")
    assert np.array_equal(labels, estimator.predict(rows))
    probabilities = output_array(reply.json(), "predict_proba")
    assert probabilities.shape == (n_rows, 3)
    np.testing.assert_allclose(probabilities, estimator.predict_proba(rows), rtol=1e-9, atol=1e-12)
