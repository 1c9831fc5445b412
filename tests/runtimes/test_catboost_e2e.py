"""CatBoost models served end to end, over REST and gRPC, in-process and by two workers:
plain folders (``model.cbm``) and an MLServer-layout folder (``model-settings.json``
naming ``mlserver_catboost.CatboostModel``) in one repository; every answer equals
CatBoost's own call on the same file (numeric models predicted by the tree kernel, as the
log says, batches with NaN included; categorical ones by CatBoost); categorical features
by name and by position; bad input is a 400 (gRPC INVALID_ARGUMENT) with an error, and
the model answers after it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.mlserver.runtimes import grpc_outputs, grpc_request
from tests.runtimes import catboost_models as cm
from tests.support import Server

catboost = pytest.importorskip("catboost")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catboost-repo")
    cm.save(cm.binary_classifier(), root / "binary")
    cm.write_catboost_info(root / "binary")  # inside a model's folder: its files
    cm.save(cm.regressor(), root / "regressor")
    cm.save(cm.multiclass_classifier(), root / "multiclass")
    cm.save(cm.categorical_classifier(), root / "categorical")
    cm.save(cm.categorical_by_index(), root / "by-index")
    cm.save(cm.nan_classifier(nan_mode="Max"), root / "nan-max")
    cm.save(cm.nan_classifier("Logloss"), root / "nan-binary")
    settings = {
        "name": "mlserver-cb",
        "implementation": "mlserver_catboost.CatboostModel",
        "parameters": {"uri": "./model.bin", "version": "v0.1.0"},
    }
    cm.save(cm.binary_classifier(), root / "mlserver-cb", "model.bin", **settings)
    cm.write_catboost_info(root)  # beside the models: no model (the repository has settings)
    return root


@pytest.fixture(scope="module", params=["0", "2"], ids=["w0", "w2"])
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[Server]:
    with Server(repository, "--workers", request.param) as running:
        running.wait_ready(timeout=120)
        yield running


def own(repository: Path, model: str, filename: str = "model.cbm") -> Any:
    """The model as CatBoost itself reads the file: its scikit-learn-API estimator."""
    loaded = catboost.CatBoost()
    loaded.load_model(str(repository / model / filename))
    try:
        return catboost.to_classifier(loaded)
    except catboost.CatBoostError:
        return catboost.to_regressor(loaded)


def rest(server: Server, model: str, body: dict, version: str = "") -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return httpx.post(server.url + path, json=body, timeout=60)


def outputs_of(reply: httpx.Response) -> dict[str, np.ndarray]:
    assert reply.status_code == 200, reply.text
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in reply.json()["outputs"]}


def grpc_infer(server: Server, model: str, body: dict) -> dict[str, np.ndarray]:
    request = grpc_request(model, body)
    for output in body.get("outputs", []):
        request.outputs.add(name=output["name"])
    with grpc.insecure_channel(server.grpc_address) as channel:
        reply = GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in grpc_outputs(reply)}


def expected(estimator: Any, features: Any, output: str) -> np.ndarray:
    if output == "predict_proba":
        return np.asarray(estimator.predict_proba(features))
    if output == "raw_formula_val":
        return np.asarray(estimator.predict(features, prediction_type="RawFormulaVal"))
    return np.asarray(estimator.predict(features)).reshape(len(features), -1).squeeze(1)


NUMERIC = [
    ("binary", 10, ["predict", "predict_proba", "raw_formula_val"]),
    ("regressor", 4, ["predict", "raw_formula_val"]),
    ("multiclass", 4, ["predict", "predict_proba", "raw_formula_val"]),
]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
@pytest.mark.parametrize(("model", "features", "names"), NUMERIC)
def test_numeric_models_answer_as_catboost(server, repository, protocol, model, features, names):
    rows = cm.numeric_rows(5, features, seed=7)
    body = {
        "inputs": [cm.tensor("input-0", rows, "FP64")],
        "outputs": [{"name": name} for name in names],
    }
    answers = outputs_of(rest(server, model, body)) if protocol == "rest" else None
    answers = answers or grpc_infer(server, model, body)
    estimator = own(repository, model)
    for name in names:
        want = expected(estimator, rows, name)
        if want.dtype.kind in "OU":
            assert answers[name].tolist() == want.tolist()
        else:
            np.testing.assert_allclose(answers[name], want, rtol=1e-9)


def test_the_default_output_is_predict(server, repository):
    rows = cm.numeric_rows(3, 10)
    reply = rest(server, "binary", {"inputs": [cm.tensor("x", rows, "FP64")]})
    (output,) = reply.json()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("predict", "INT64", [3])
    assert output["data"] == own(repository, "binary").predict(rows).tolist()


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_categorical_features_by_name_in_any_order(server, repository, protocol):
    frame = cm.categorical_frame(6, seed=9)
    body = {
        "inputs": cm.frame_inputs(frame, order=["size", "colour", "num"]),
        "outputs": [{"name": "predict_proba"}, {"name": "predict"}],
    }
    answers = outputs_of(rest(server, "categorical", body)) if protocol == "rest" else None
    answers = answers or grpc_infer(server, "categorical", body)
    estimator = own(repository, "categorical")
    np.testing.assert_allclose(answers["predict_proba"], estimator.predict_proba(frame))
    assert answers["predict"].tolist() == estimator.predict(frame).tolist()


def test_categorical_features_by_position_in_one_table(server, repository):
    frame = cm.categorical_frame(4, seed=10)
    table = frame.astype(str).to_numpy()
    body = {"inputs": [cm.tensor("table", table, "BYTES")]}
    answers = outputs_of(rest(server, "by-index", body))
    np.testing.assert_allclose(
        answers["predict"], own(repository, "by-index").predict(frame.to_numpy(dtype=object))
    )


def test_metadata_names_the_features_and_the_outputs(server):
    document = httpx.get(f"{server.url}/v2/models/categorical", timeout=10).json()
    assert document["platform"] == "catboost"
    inputs = {spec["name"]: spec["datatype"] for spec in document["inputs"]}
    assert inputs == {"num": "FP64", "colour": "BYTES", "size": "BYTES"}
    names = [spec["name"] for spec in document["outputs"]]
    assert names == ["predict", "predict_proba", "raw_formula_val"]
    binary = httpx.get(f"{server.url}/v2/models/binary", timeout=10).json()
    assert binary["inputs"][0]["shape"] == [-1, 10]


def test_mlservers_layout_answers_mlservers_request(server, repository):
    """MLServer's docs/examples/catboost request: one FP32 row named predict-prob."""
    rows = np.random.default_rng(0).integers(0, 100, size=(1, 10))
    body = {"inputs": [cm.tensor("predict-prob", rows, "FP32")]}
    reply = rest(server, "mlserver-cb", body, version="v0.1.0")
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("predict", "INT64", [1, 1])
    want = own(repository, "mlserver-cb", "model.bin").predict(rows.astype(np.float32))
    assert output["data"] == want.tolist()
    assert reply.json()["model_version"] == "v0.1.0"


def test_catboost_info_is_no_model(server):
    index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
    names = sorted(entry["name"] for entry in index)
    assert names == [
        "binary",
        "by-index",
        "categorical",
        "mlserver-cb",
        "multiclass",
        "nan-binary",
        "nan-max",
        "regressor",
    ]


def test_the_log_says_which_predictor_serves_each_model(server):
    log = server.output()
    kernel = ["binary", "regressor", "multiclass", "nan-max", "nan-binary", "mlserver-cb"]
    for model in kernel:
        pattern = rf"model '{model}'.*[:;] predicted by the tree kernel \(\d+ oblivious trees"
        assert re.search(pattern, log), log
    for model in ("categorical", "by-index"):
        pattern = rf"model '{model}'.*[:;] predicted by CatBoost, not the tree kernel: categorical"
        assert re.search(pattern, log), log


# Trained with NaN: the tree kernel's NaN rules (nan_mode Min and Max) against CatBoost's.
BATCHES = [
    ("nan-max", 6, ["predict", "predict_proba", "raw_formula_val"]),
    ("nan-binary", 6, ["predict", "predict_proba", "raw_formula_val"]),
    ("regressor", 4, ["predict", "raw_formula_val"]),
]


@pytest.mark.parametrize(("model", "features", "names"), BATCHES)
def test_a_raw_grpc_batch_with_nan_answers_as_catboost(server, repository, model, features, names):
    import tritonclient.grpc as grpcclient

    rows = cm.rows_with_nan(256, features, seed=11).astype(np.float32)
    tensor = grpcclient.InferInput("input-0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    asked = [grpcclient.InferRequestedOutput(name) for name in names]
    result = client.infer(model, [tensor], outputs=asked)
    estimator = own(repository, model)
    for name in names:
        want, got = expected(estimator, rows, name), result.as_numpy(name)
        if want.dtype.kind in "OU":
            assert got.astype(str).tolist() == want.astype(str).tolist()
        else:  # CatBoost's exp is its own approximation: a few ulps off the C library's
            np.testing.assert_allclose(got, want, rtol=1e-12)


BAD = [
    ("binary", {"inputs": [cm.tensor("x", cm.numeric_rows(2, 3), "FP64")]}, "10 features"),
    (
        "categorical",
        {"inputs": cm.frame_inputs(cm.categorical_frame(2).drop(columns="size"))},
        "features",
    ),
    (
        "categorical",
        {"inputs": cm.frame_inputs(cm.categorical_frame(2).assign(colour=[1.5, 2.5]))},
        "cat_features must be integer or string",
    ),
    ("regressor", {"inputs": [cm.tensor("x", [[1.0, 2.0, 3.0, 4.0]], "FP64")],
                   "outputs": [{"name": "predict_proba"}]}, "predict_proba"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "body", "words"), BAD, ids=["width", "missing", "float", "out"])
def test_bad_input_is_a_400_and_the_model_still_answers(server, model, body, words):
    reply = rest(server, model, body)
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]
    with pytest.raises(grpc.RpcError) as caught:
        grpc_infer(server, model, body)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    good = {"inputs": [cm.tensor("x", cm.numeric_rows(1, 10), "FP64")]}
    assert rest(server, "binary", good).status_code == 200
