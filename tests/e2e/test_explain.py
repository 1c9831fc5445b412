"""``POST /v2/models/{name}[/versions/{v}]/explain`` in a real server, in-process and with
two workers: one model of each family (a scikit-learn forest, a scaled linear pipeline, a
LightGBM and an XGBoost booster) answers contributions that add up to its raw score; an
explainer model answers ``/infer`` and gRPC ``ModelInfer`` with its model's explanation;
a model that cannot explain, and bad input, get a 400 saying why."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support import iris_data, write_sklearn_model
from tests.support.grpc import infer_request, models_server, stub_for
from tests.support.runtimes import (
    N_FEATURES,
    classification_data,
    lightgbm_estimator,
    output_array,
    regression_data,
    rows_request,
    save_booster,
    xgboost_estimator,
)

server = models_server  # the module's server fixture, over its models


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The repository, and each model's raw score (a function of the rows)."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    root = tmp_path_factory.mktemp("explain")
    X, y = iris_data()
    forest = RandomForestClassifier(20, random_state=0, n_jobs=1).fit(X, y)
    write_sklearn_model(root / "forest", forest)
    linear = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(X, y)
    write_sklearn_model(root / "linear", linear)
    (root / "linear" / "model-settings.json").write_text(
        json.dumps({"parameters": {"version": "3"}})
    )
    write_sklearn_model(root / "knn", KNeighborsClassifier().fit(X, y))
    booster, _ = lightgbm_estimator("classifier", 3)
    save_booster(root / "lightgbm", booster.booster_, "model.txt")
    regressor, _ = xgboost_estimator("regressor")
    save_booster(root / "xgboost", regressor.get_booster(), "model.json")
    explainer = root / "forest-explainer"
    explainer.mkdir()
    (explainer / "model-settings.json").write_text(
        json.dumps({"implementation": "explainer", "parameters": {"explains": "../forest"}})
    )
    raw = {
        "forest": forest.predict_proba,
        "linear": linear.decision_function,
        "lightgbm": lambda rows: booster.predict(rows, raw_score=True),
        "xgboost": lambda rows: regressor.predict(rows, output_margin=True),
    }
    return root, raw


def features_of(model: str) -> np.ndarray:
    if model in ("forest", "linear", "knn", "forest-explainer"):
        return iris_data()[0][::15]
    X, _ = classification_data(3) if model == "lightgbm" else regression_data()
    return X[:10]


def explain(server, model: str, body: dict, version: str | None = None) -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/explain"
    return httpx.post(server.url + path, json=body, timeout=30)


@pytest.mark.parametrize(
    ("model", "shape", "score"),
    [
        ("forest", (10, 3, 5), "probability"),
        ("linear", (10, 3, 5), "decision_function"),
        ("lightgbm", (10, 3, N_FEATURES + 1), "raw_score"),
        ("xgboost", (10, N_FEATURES + 1), "raw_score"),
    ],
)
def test_contributions_add_up_to_the_raw_score(server, models, model, shape, score):
    rows = features_of(model)
    reply = explain(server, model, rows_request(rows), version="3" if model == "linear" else None)
    assert reply.status_code == 200, reply.text
    document = reply.json()
    assert document["model_name"] == model
    [output] = document["outputs"]
    assert output["name"] == "contributions" and output["datatype"] == "FP64"
    values = output_array(document, "contributions")
    assert values.shape == shape
    assert output["parameters"]["score"] == score
    # XGBoost computes its contributions in float32; the rest adds up in float64.
    rtol, atol = (1e-5, 1e-5) if model == "xgboost" else (1e-9, 1e-12)
    np.testing.assert_allclose(values.sum(axis=-1), models[1][model](rows), rtol=rtol, atol=atol)
    if model != "xgboost":
        assert output["parameters"]["class_labels"] == [0, 1, 2]


def test_the_explainer_model_answers_infer_with_the_explanation(server, models):
    rows = features_of("forest")
    reply = httpx.post(
        f"{server.url}/v2/models/forest-explainer/infer", json=rows_request(rows), timeout=30
    )
    assert reply.status_code == 200, reply.text
    values = output_array(reply.json(), "contributions")
    assert values.shape == (10, 3, 5)
    np.testing.assert_allclose(values.sum(axis=-1), models[1]["forest"](rows), atol=1e-12)
    direct = output_array(explain(server, "forest", rows_request(rows)).json(), "contributions")
    np.testing.assert_array_equal(values, direct)
    metadata = httpx.get(f"{server.url}/v2/models/forest-explainer", timeout=30).json()
    assert metadata["platform"] == "explainer"
    assert [o["name"] for o in metadata["outputs"]] == ["contributions"]


def test_the_explainer_model_answers_grpc_model_infer(server, models):
    rows = features_of("forest")
    with stub_for(server) as stub:
        response = stub.ModelInfer(infer_request("forest-explainer", **{"input-0": rows}))
    [output] = response.outputs
    assert output.name == "contributions" and list(output.shape) == [10, 3, 5]
    if response.raw_output_contents:
        values = np.frombuffer(response.raw_output_contents[0], "<f8")
    else:
        values = np.array(output.contents.fp64_contents)
    values = values.reshape(10, 3, 5)
    np.testing.assert_allclose(values.sum(axis=-1), models[1]["forest"](rows), atol=1e-12)
    assert output.parameters["score"].string_param == "probability"
    assert json.loads(output.parameters["class_labels"].string_param) == [0, 1, 2]


def test_a_model_that_cannot_explain_says_why(server):
    reply = explain(server, "knn", rows_request(features_of("knn")))
    assert reply.status_code == 400
    assert reply.json()["error"].startswith(
        "model 'knn' cannot explain: KNeighborsClassifier has no explainer"
    )


@pytest.mark.parametrize(
    ("model", "body", "status", "error"),
    [
        ("forest", rows_request(np.ones((2, 3))), 400, "expects 4 features, got 3"),
        ("forest", {"inputs": "not tensors"}, 400, "inputs"),
        ("forest-explainer", rows_request(np.ones((2, 3))), 400, "expects 4 features, got 3"),
        ("missing", rows_request(np.ones((2, 4))), 404, "missing"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(server, model, body, status, error):
    endpoint = "infer" if model == "forest-explainer" else "explain"
    reply = httpx.post(f"{server.url}/v2/models/{model}/{endpoint}", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    assert error in reply.json()["error"]


def test_a_body_that_is_not_json_is_a_400(server):
    reply = httpx.post(f"{server.url}/v2/models/forest/explain", content=b"{nope", timeout=30)
    assert reply.status_code == 400
    assert "not valid JSON" in reply.json()["error"]


def test_explain_over_grpc_through_the_custom_service(server, models):
    """The same endpoint through ``inferpool.CustomService/Call``: a JSON V2 request in,
    the JSON explanation out, equal to REST's; a model that cannot explain is
    INVALID_ARGUMENT with the reason."""
    import grpc

    from inferpool.protocol.generated import inferpool_ext_pb2 as ext
    from inferpool.protocol.generated.inferpool_ext_pb2_grpc import CustomServiceStub

    rows = features_of("forest")
    body = json.dumps(rows_request(rows)).encode()
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = CustomServiceStub(channel)
        answer = stub.Call(
            ext.CallRequest(model_name="forest", path="/explain", method="POST", body=body),
            timeout=30,
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.Call(
                ext.CallRequest(model_name="knn", path="explain", method="POST", body=body),
                timeout=30,
            )
    assert answer.status_code == 200 and answer.content_type.startswith("application/json")
    values = output_array(json.loads(answer.body), "contributions")
    np.testing.assert_allclose(values.sum(axis=-1), models[1]["forest"](rows), atol=1e-12)
    rest = output_array(explain(server, "forest", rows_request(rows)).json(), "contributions")
    np.testing.assert_array_equal(values, rest)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'knn' cannot explain" in refused.value.details()
