"""R models (lm, glm binomial, randomForest) served by a live server, in-process
(``--workers 0``) and by two workers that each start R after the fork: answers over REST
and gRPC equal R's own ``predict`` on the same rows, whether the columns come as one
tensor or one tensor each; bad input is a 400 and R never runs in the template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.rlang.r_models import RModel, build
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, infer_request, stub_for, workers_server
from tests.support.pool import assert_only_workers_map
from tests.support.runtimes import output_array, rows_request


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, RModel]]:
    root = tmp_path_factory.mktemp("r-repository")
    return root, build(root)


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, repository) -> Iterator[Server]:
    with workers_server(repository[0], request.param, timeout=180) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[GRPCInferenceServiceStub]:
    with stub_for(server) as stub:
        yield stub


NAMES = ["r-lm", "r-glm", "r-rf", "r-rf-prob"]


def assert_r_answers(answer: np.ndarray, model: RModel) -> None:
    assert answer.shape == model.expected.shape
    if model.expected.dtype == object:
        assert answer.tolist() == model.expected.tolist()
    else:
        np.testing.assert_allclose(answer, model.expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", NAMES)
def test_rest_answers_equal_rs_predict(server: Server, repository, name: str) -> None:
    model = repository[1][name]
    reply = httpx.post(
        f"{server.url}/v2/models/{name}/infer", json=rows_request(model.rows), timeout=60
    )
    assert reply.status_code == 200, reply.text
    assert_r_answers(output_array(reply.json(), "predict"), model)


@pytest.mark.parametrize("name", ["r-lm", "r-rf"])
def test_one_tensor_per_column_by_name(server: Server, repository, name: str) -> None:
    model = repository[1][name]
    # In another order than the model's: matched by name.
    inputs = [
        {"name": column, "datatype": "FP64", "shape": [len(model.rows)], "data": values}
        for column, values in zip("cba", model.rows.T[::-1].tolist(), strict=True)
    ]
    reply = httpx.post(f"{server.url}/v2/models/{name}/infer", json={"inputs": inputs}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert_r_answers(output_array(reply.json(), "predict"), model)


@pytest.mark.parametrize("name", NAMES)
def test_grpc_answers_equal_rs_predict(stub, repository, name: str) -> None:
    model = repository[1][name]
    response = stub.ModelInfer(infer_request(name, x=model.rows), timeout=60)
    (output,) = response.outputs
    if output.datatype == "BYTES":
        values = np.array([v.decode() for v in output.contents.bytes_contents], dtype=object)
    else:
        values = np.array(output.contents.fp64_contents)
    assert_r_answers(values.reshape(list(output.shape)), model)


def test_metadata_names_the_columns_the_model_was_fitted_on(server: Server) -> None:
    document = httpx.get(f"{server.url}/v2/models/r-rf-prob", timeout=10).json()
    assert document["platform"] == "r"
    assert [i["name"] for i in document["inputs"]] == ["a", "b", "c"]
    assert document["outputs"] == [{"name": "predict", "datatype": "FP64", "shape": [-1, 3]}]
    labels = httpx.get(f"{server.url}/v2/models/r-rf", timeout=10).json()["outputs"]
    assert labels == [{"name": "predict", "datatype": "BYTES", "shape": [-1]}]


def test_wrong_width_is_a_400(server: Server) -> None:
    reply = httpx.post(
        f"{server.url}/v2/models/r-lm/infer", json=rows_request(np.zeros((2, 2))), timeout=60
    )
    assert reply.status_code == 400, reply.text
    assert "expects its 3 columns (a, b, c)" in reply.json()["error"]


def test_a_label_r_predicts_as_na_is_a_400(stub, repository) -> None:
    # randomForest answers NA for a row with a missing value: no V2 label says that.
    rows = np.array([[0.0, 0.0, 1.0], [np.nan, 0.0, 1.0]])
    with pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(infer_request("r-rf", x=rows), timeout=60)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "predicted NA (R's missing value) for row 1" in failure.value.details()
    model = repository[1]["r-rf"]
    response = stub.ModelInfer(infer_request("r-rf", x=model.rows), timeout=60)
    assert len(response.outputs[0].contents.bytes_contents) == len(model.rows)


def test_no_warning_when_r_starts_off_the_main_thread(server: Server) -> None:
    # --workers 0 loads in a thread: rpy2's warning about SIGINT does not apply (R installs
    # no signal handler under rpy2), and the server's Ctrl-C still stops it.
    assert "R is not initialized by the main thread" not in server.output()


def test_r_starts_in_the_workers_never_in_the_template(server: Server) -> None:
    assert_only_workers_map(server, "libR.so")


def test_an_r_package_missing_stops_the_start_with_one_sentence(tmp_path: Path, repository):
    # No implementation named: model.rds chooses the R runtime; two workers load it.
    folder = tmp_path / "needs-package"
    folder.mkdir()
    (folder / "model.rds").write_bytes((repository[0] / "r-lm" / "model.rds").read_bytes())
    settings = {"name": "needs-package", "parameters": {"extra": {"r_packages": ["nopkgzz"]}}}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    with Server(tmp_path, "--workers", "2") as running:
        assert running.wait_exit(timeout=180) != 0
        sentence = "model.rds needs the R package 'nopkgzz', which is not installed ("
        assert sentence in running.output()
