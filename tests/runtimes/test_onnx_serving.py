"""ONNX models converted from scikit-learn, LightGBM and XGBoost served by a live server,
in-process (``--workers 0``) and by two workers that each create their session after the
fork: answers over REST and gRPC equal the libraries' own within float32 tolerance, the
metadata is the graph's, bad input is a 400 and the workers keep serving."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.runtimes.onnx_models import Converted, assert_library_answers, repository
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, infer_request, stub_for, workers_server
from tests.support.pool import assert_only_workers_map
from tests.support.runtimes import output_array, rows_request

TYPED = {"INT64": "int64_contents", "FP32": "fp32_contents", "BYTES": "bytes_contents"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Converted]]:
    root = tmp_path_factory.mktemp("onnx-repository")
    models = repository(root)
    # MLServer's layout: a settings file whose uri names the graph, under a name of its own.
    (root / "ridge-uri").mkdir()
    (root / "ridge-uri" / "regressor.onnx").write_bytes(
        (root / "sk-ridge" / "model.onnx").read_bytes()
    )
    settings = {"name": "ridge-uri", "parameters": {"uri": "./regressor.onnx", "version": "v3"}}
    (root / "ridge-uri" / "model-settings.json").write_text(json.dumps(settings))
    return root, models


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, converted: tuple[Path, dict]) -> Iterator[Server]:
    with workers_server(converted[0], request.param) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[GRPCInferenceServiceStub]:
    with stub_for(server) as stub:
        yield stub


def rest_answers(server: Server, model: str, rows: np.ndarray, **body: object) -> dict:
    reply = httpx.post(
        f"{server.url}/v2/models/{model}/infer", json={**rows_request(rows), **body}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    return {out["name"]: output_array(reply.json(), out["name"]) for out in reply.json()["outputs"]}


NAMES = ["sk-logreg", "sk-labels", "sk-ridge", "lgb-classifier", "xgb-regressor"]


@pytest.mark.parametrize("name", NAMES)
def test_rest_answers_equal_the_library(server: Server, converted, name: str) -> None:
    model = converted[1][name]
    assert_library_answers(model, rest_answers(server, name, model.rows))


@pytest.mark.parametrize("name", NAMES)
def test_grpc_answers_equal_the_library(stub, converted, name: str) -> None:
    model = converted[1][name]
    response = stub.ModelInfer(infer_request(name, x=model.rows), timeout=30)
    answers = {}
    for output in response.outputs:
        values = list(getattr(output.contents, TYPED[output.datatype]))
        if output.datatype == "BYTES":
            values = [v.decode() for v in values]
        answers[output.name] = np.array(values).reshape(list(output.shape))
    assert_library_answers(model, answers)


def test_metadata_is_the_graphs(server: Server) -> None:
    document = httpx.get(f"{server.url}/v2/models/lgb-classifier", timeout=10).json()
    assert document["platform"] == "onnx"
    assert document["inputs"] == [{"name": "float_input", "datatype": "FP32", "shape": [-1, 8]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in document["outputs"]] == [
        ("label", "INT64", [-1]),
        ("probabilities", "FP32", [-1, -1]),
    ]


def test_grpc_metadata_is_the_graphs(stub) -> None:
    metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="sk-ridge"), timeout=10)
    (tensor,) = metadata.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("float_input", "FP32", [-1, 8])
    assert [o.name for o in metadata.outputs] == ["variable"]


def test_inputs_of_a_two_input_graph_by_name(server: Server) -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    body = {
        "inputs": [
            {"name": "b", "datatype": "FP32", "shape": [2, 2], "data": (a * 10).ravel().tolist()},
            {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": a.ravel().tolist()},
        ]
    }
    reply = httpx.post(f"{server.url}/v2/models/add-two/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    np.testing.assert_array_equal(output_array(reply.json(), "sum"), a * 11)


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        ("sk-ridge", rows_request(np.zeros((2, 5))), "expects shape [-1, 8], got [2, 5]"),
        ("add-two", rows_request(np.zeros((2, 2)), name="a"), "is missing input 'b'"),
        (
            "add-two",
            {
                "inputs": [
                    {"name": n, "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}
                    for n in ("a", "z")
                ]
            },
            "has no input 'z'",
        ),
        ("sk-logreg", rows_request(np.zeros((1, 8)), ["nope"]), "has no output 'nope'"),
        (
            "add-two",
            {**rows_request(np.zeros((1, 4)), name="a"), "parameters": {"content_type": "np"}},
            "takes its inputs by name: 'a', 'b'",
        ),
    ],
    ids=["width", "missing", "wrong-name", "output", "one-array"],
)
def test_bad_input_is_a_400_and_the_model_keeps_serving(
    server: Server, converted, model: str, body: dict, message: str
) -> None:
    reply = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]
    good = converted[1]["sk-ridge"]
    assert_library_answers(good, rest_answers(server, "sk-ridge", good.rows))


def test_grpc_wrong_width_is_invalid_argument(stub) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(infer_request("xgb-regressor", x=np.zeros((3, 2))), timeout=30)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expects shape [-1, 8], got [3, 2]" in failure.value.details()


def test_concurrent_requests_get_their_own_rows(server: Server, converted) -> None:
    # Queued requests of a converted model are joined into one predict (adaptive
    # batching) and split back: each caller gets exactly its rows' answers.
    model = converted[1]["sk-logreg"]
    spans = [(i, i + 1 + i % 3) for i in range(9)] * 2

    def call(span: tuple[int, int]) -> dict:
        return rest_answers(server, "sk-logreg", model.rows[span[0] : span[1]])

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, spans))
    for (start, stop), answer in zip(spans, answers, strict=True):
        expected = {name: value[start:stop] for name, value in model.expected.items()}
        assert_library_answers(Converted("", model.rows[start:stop], expected), answer)


def test_each_worker_sizes_its_session_to_its_share(server: Server) -> None:
    workers = server.workers  # type: ignore[attr-defined]
    if workers == 0:
        pattern = r"predicted by ONNX Runtime [\d.]+ \(its default threads\)"
    else:
        share = max(1, (os.cpu_count() or 1) // workers)
        unit = "thread" if share == 1 else "threads"
        pattern = rf"predicted by ONNX Runtime [\d.]+ \({share} intra-op {unit}\)"
    server.expect_lines([pattern], timeout=30)


def test_no_warning_per_predict_on_the_log(server: Server, converted) -> None:
    # onnxmltools declares the LightGBM classifier's labels as [1]: ONNX Runtime would warn
    # about it on stderr (the server's log) at every predict, at its default log level.
    model = converted[1]["lgb-classifier"]
    for _ in range(3):
        assert_library_answers(model, rest_answers(server, "lgb-classifier", model.rows))
    assert "VerifyOutputSizes" not in server.output()


def test_sessions_live_in_the_workers_never_in_the_template(server: Server) -> None:
    # The template forks the workers: it has not even imported ONNX Runtime (which starts
    # a thread when imported), nor has the server process.
    assert_only_workers_map(server, "onnxruntime_pybind11_state")


def test_a_settings_file_naming_the_graph_by_uri(server: Server, converted) -> None:
    model = converted[1]["sk-ridge"]
    assert_library_answers(model, rest_answers(server, "ridge-uri", model.rows))
    document = httpx.get(f"{server.url}/v2/models/ridge-uri", timeout=10).json()
    assert (document["platform"], document["versions"]) == ("onnx", ["v3"])
