"""Input a model rejects is the client's fault (400 naming the input); a fault of the model
itself stays a 500 (issue 12). Requests go through the worker path, as REST bodies."""

from __future__ import annotations

import math
import time

import numpy as np
import orjson
import pytest

from inferpool.engine.ipc.messages import Kind, RequestHeader
from inferpool.engine.worker.model import LoadedModel
from inferpool.engine.worker.path import Job, run_group
from tests.support import iris_data, write_custom_model, write_sklearn_model
from tests.support.runtimes import (
    N_FEATURES,
    classification_data,
    lightgbm_estimator,
    load,
    save_pickle,
    xgboost_estimator,
)


def body(data, shape, datatype="FP64", name="x", **extra) -> bytes:
    tensor = {"name": name, "shape": list(shape), "datatype": datatype, "data": data}
    return orjson.dumps({"inputs": [tensor], **extra})


def nan_body(rows: np.ndarray) -> bytes:
    # Python's json writes NaN and Infinity as bare literals (tritonclient, MLServer).
    import json

    tensor = {
        "name": "x",
        "shape": list(rows.shape),
        "datatype": "FP64",
        "data": rows.ravel().tolist(),
    }
    return json.dumps({"inputs": [tensor]}).encode()


def answer(model: LoadedModel, request: bytes) -> tuple[int, str]:
    header = RequestHeader(0, 0, Kind.REST, None, 0, time.monotonic_ns(), len(request))
    (reply,) = run_group(model, [Job(header, request)])
    if reply.status == 200:
        return 200, ""
    return reply.status, reply.body.decode()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, LoadedModel]:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("models")
    X, y = iris_data()
    write_sklearn_model(root / "logreg", LogisticRegression(max_iter=500).fit(X, y))
    rf = RandomForestClassifier(n_estimators=5, random_state=0, n_jobs=1).fit(X, y)
    write_sklearn_model(root / "forest", rf)
    lgb, _ = lightgbm_estimator("classifier")
    save_pickle(root / "lgb", lgb)
    xgb, _ = xgboost_estimator("classifier")
    save_pickle(root / "xgb", xgb)
    return {name: load(root / name) for name in ("logreg", "forest", "lgb", "xgb")}


def features(name: str) -> int:
    return 4 if name in ("logreg", "forest") else N_FEATURES


def rows(name: str, count: int = 2) -> np.ndarray:
    X = iris_data()[0] if features(name) == 4 else classification_data()[0]
    return np.asarray(X[:count], dtype=float)


@pytest.mark.parametrize("name", ["logreg", "forest", "lgb", "xgb"])
def test_valid_rows_are_answered(models, name):
    X = rows(name)
    assert answer(models[name], body(X.ravel().tolist(), X.shape)) == (200, "")


@pytest.mark.parametrize("name", ["logreg", "forest", "lgb", "xgb"])
def test_zero_rows_are_400_naming_the_input(models, name):
    status, message = answer(models[name], body([], [0, features(name)]))
    assert status == 400
    assert message == f"model '{name}' rejected input 'x': needs at least one row, got 0"


@pytest.mark.parametrize("name", ["logreg", "forest", "lgb", "xgb"])
def test_wrong_feature_count_is_400_naming_the_input(models, name):
    X = rows(name)[:, :3]
    status, message = answer(models[name], body(X.ravel().tolist(), X.shape))
    assert status == 400
    assert message == (
        f"model '{name}' rejected input 'x': expects {features(name)} features, got 3"
    )


@pytest.mark.parametrize("name", ["logreg", "forest", "lgb", "xgb"])
def test_strings_for_a_numeric_model_are_400_naming_the_input(models, name):
    data = [["abc"] * features(name)]
    status, message = answer(models[name], body(data, [1, features(name)], "BYTES"))
    assert status == 400, message
    assert message.startswith(f"model '{name}' rejected input 'x': ")
    if name in ("logreg", "forest"):  # scikit-learn's own message, carried over
        assert "could not convert string to float" in message


def test_nan_where_scikit_learn_forbids_it_is_400_naming_the_input(models):
    X = rows("logreg")
    X[1, 2] = math.nan
    assert answer(models["logreg"], nan_body(X)) == (
        400,
        "model 'logreg' rejected input 'x': cannot take NaN or infinite values",
    )
    X[1, 2] = math.inf
    assert answer(models["logreg"], nan_body(X))[0] == 400


@pytest.mark.parametrize("name", ["forest", "lgb", "xgb"])
def test_nan_where_the_model_takes_it_is_answered(models, name):
    X = rows(name)
    X[0, 1] = math.nan
    assert answer(models[name], nan_body(X)) == (200, "")


def test_infinity_is_400_even_where_scikit_learn_takes_nan(models):
    X = rows("forest")
    X[0, 1] = math.inf
    status, message = answer(models["forest"], nan_body(X))
    assert (status, message) == (
        400,
        "model 'forest' rejected input 'x': cannot take infinite values",
    )


def test_a_library_error_on_the_input_is_400_carrying_its_message(tmp_path):
    """Input only scikit-learn itself checks (a DataFrame model, NaN in a column)."""
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    X, y = iris_data()
    frame = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    model = load(
        write_sklearn_model(tmp_path / "named", LogisticRegression(max_iter=500).fit(frame, y))
    )
    tensors = [
        {"name": column, "shape": [2, 1], "datatype": "FP64", "data": [1.0, math.nan]}
        for column in "abcd"
    ]
    import json

    request = json.dumps({"inputs": tensors, "parameters": {"content_type": "pd"}}).encode()
    status, message = answer(model, request)
    assert status == 400
    assert message.startswith("model 'named' rejected inputs 'a', 'b', 'c', 'd': ")
    assert "NaN" in message


FAULTY_RUNTIME = """
    from inferpool import Runtime


    class Faulty(Runtime):
        def load(self):
            pass

        def predict(self, payload, outputs):
            kind = int(payload[0, 0])
            if kind == 1:
                raise ValueError("asked to fail")
            if kind == 2:
                raise RuntimeError("broken")
            if kind == 3:
                return 1 / 0
            return {outputs[0]: payload.sum(axis=1)}
"""


@pytest.mark.parametrize(
    "kind, error",
    [(1, "ValueError: asked to fail"), (2, "RuntimeError: broken"), (3, "ZeroDivisionError")],
)
def test_a_custom_runtime_raising_is_the_model_fault_500(tmp_path, kind, error):
    folder = write_custom_model(
        tmp_path / "faulty",
        FAULTY_RUNTIME,
        "Faulty",
        outputs=[{"name": "y", "datatype": "FP64", "shape": [-1]}],
    )
    model = load(folder)
    status, message = answer(model, body([[kind, 0]], [1, 2]))
    assert status == 500
    assert message.startswith(f"model 'faulty' raised {error}")
    assert answer(model, body([[0, 5]], [1, 2])) == (200, "")


def test_duplicate_input_names_are_400(models):
    X = rows("logreg", 1)
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP64", "data": X.ravel().tolist()}
    request = orjson.dumps({"inputs": [tensor, tensor]})
    assert answer(models["logreg"], request) == (400, "input 'x' appears twice")


def test_duplicate_requested_outputs_are_400(models):
    X = rows("logreg", 1)
    request = body(X.ravel().tolist(), X.shape, outputs=[{"name": "predict"}] * 2)
    assert answer(models["logreg"], request) == (400, "output 'predict' is requested twice")


def test_mlflow_invocations_refuse_deep_json_before_mlflow_walks_it():
    from inferpool.errors import BadRequest
    from inferpool.runtimes.mlflow import MLflowRuntime

    runtime = MLflowRuntime.__new__(MLflowRuntime)  # the check needs no loaded model
    body = b'{"instances":' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}"
    with pytest.raises(
        BadRequest, match=r"invocations: the body is nested deeper .*max_json_depth"
    ):
        runtime.invocations(body)
