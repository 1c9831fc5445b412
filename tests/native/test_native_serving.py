"""Native models served by a live server, in-process (``--workers 0``) and by two workers
that each dlopen the library after the fork: the linear example against scikit-learn's
LinearRegression, and LightGBM and XGBoost models compiled by tl2cgen against their own
libraries' predictions, over REST and gRPC; bad input is a 400 (INVALID_ARGUMENT) and a
library missing a symbol fails the server's start with one sentence."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.native.native_models import linear_model, source_model, tl2cgen_model
from tests.native.probes import NO_PREDICT
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, infer_request, stub_for, workers_server
from tests.support.pool import assert_only_workers_map
from tests.support.runtimes import output_array, rows_request


@dataclass
class Served:
    """A model of the repository: its rows and what its own library predicts for them."""

    rows: np.ndarray
    expected: np.ndarray
    rtol: float = 1e-12


def build(root: Path) -> dict[str, Served]:
    import lightgbm
    import xgboost
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 5))
    X[::17, 2] = np.nan  # missing values, which the trees route as their libraries do
    y_linear = X[:, 0] * 3 - X[:, 1] + 0.5
    labels = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.3).astype(int)
    rows = X[:40]
    served: dict[str, Served] = {}

    dense = np.nan_to_num(X)
    linear = LinearRegression().fit(dense, y_linear + rng.normal(scale=0.1, size=300))
    linear_model(root / "linear", float(linear.intercept_), linear.coef_)
    served["linear"] = Served(np.nan_to_num(rows), linear.predict(np.nan_to_num(rows)))

    params = {"objective": "binary", "num_leaves": 7, "verbose": -1, "num_threads": 1}
    booster = lightgbm.train(params, lightgbm.Dataset(X, labels > 0), num_boost_round=20)
    tl2cgen_model(root / "lgb-binary", booster)
    served["lgb-binary"] = Served(rows, booster.predict(rows).reshape(-1, 1), rtol=1e-9)

    params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 3, "nthread": 1}
    trees = xgboost.train(params, xgboost.DMatrix(X, labels), num_boost_round=10)
    tl2cgen_model(root / "xgb-multiclass", trees, leaf="float")
    # XGBoost sums float32 leaves: the compiled code too, in another order.
    served["xgb-multiclass"] = Served(rows, trees.predict(xgboost.DMatrix(rows)), rtol=1e-5)
    return served


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Served]]:
    root = tmp_path_factory.mktemp("native-repository")
    return root, build(root)


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, repository) -> Iterator[Server]:
    with workers_server(repository[0], request.param) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[GRPCInferenceServiceStub]:
    with stub_for(server) as stub:
        yield stub


NAMES = ["linear", "lgb-binary", "xgb-multiclass"]


@pytest.mark.parametrize("name", NAMES)
def test_rest_answers_equal_the_library(server: Server, repository, name: str) -> None:
    model = repository[1][name]
    finite = ~np.isnan(model.rows).any(axis=1)  # JSON has no NaN: gRPC sends those rows
    body = rows_request(model.rows[finite])
    reply = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    answer = output_array(reply.json(), "predict")
    expected = model.expected[finite]
    assert answer.shape == expected.shape
    np.testing.assert_allclose(answer, expected, rtol=model.rtol, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_grpc_answers_equal_the_library(stub, repository, name: str) -> None:
    model = repository[1][name]
    response = stub.ModelInfer(infer_request(name, x=model.rows), timeout=30)
    (output,) = response.outputs
    assert (output.name, output.datatype) == ("predict", "FP64")
    if response.raw_output_contents:
        values = np.frombuffer(response.raw_output_contents[0], dtype="<f8")
    else:
        values = np.array(output.contents.fp64_contents)
    answer = values.reshape(list(output.shape))
    np.testing.assert_allclose(answer, model.expected, rtol=model.rtol, atol=1e-12)


def test_metadata_is_the_librarys(server: Server) -> None:
    document = httpx.get(f"{server.url}/v2/models/xgb-multiclass", timeout=10).json()
    assert document["platform"] == "native"
    assert document["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 5]}]
    assert document["outputs"] == [{"name": "predict", "datatype": "FP64", "shape": [-1, 3]}]


def test_wrong_width_is_a_400(server: Server, repository) -> None:
    body = rows_request(np.zeros((3, 2)))
    reply = httpx.post(f"{server.url}/v2/models/lgb-binary/infer", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    assert "expects 5 features, got 2" in reply.json()["error"]


def test_the_librarys_refusal_is_invalid_argument_and_it_keeps_serving(stub, repository) -> None:
    # linear.c refuses a NaN feature itself (INFERPOOL_BAD_INPUT): its message goes back.
    with pytest.raises(grpc.RpcError) as failure:
        rows = np.array([[1.0, np.nan, 2.0, 3.0, 4.0]])
        stub.ModelInfer(infer_request("linear", x=rows), timeout=30)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rejected its input: row 0, feature 1 is NaN" in failure.value.details()
    model = repository[1]["linear"]
    response = stub.ModelInfer(infer_request("linear", x=model.rows), timeout=30)
    assert len(response.outputs) == 1


def test_each_worker_opens_the_library_after_the_fork(server: Server, repository) -> None:
    assert_only_workers_map(server, str(repository[0] / "linear" / "model.so"))


def test_a_library_missing_a_symbol_stops_the_start_with_one_sentence(tmp_path: Path) -> None:
    source_model(tmp_path / "broken", NO_PREDICT)
    with Server(tmp_path, "--workers", "0") as running:
        assert running.wait_exit(timeout=120) != 0
        sentence = "model.so does not export inferpool_model_predict (the native ABI: "
        assert sentence in running.output()
