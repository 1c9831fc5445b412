"""Every bad request gets ``{"error": ...}`` with the right status, never a traceback."""

from __future__ import annotations

import httpx
import pytest

from tests.support import Server, build_iris_repository, write_custom_model
from tests.support.runtimes import write_echo_model

RAISING_RUNTIME = """
    from inferpool import Runtime


    class Raising(Runtime):
        def load(self):
            pass

        def predict(self, payload, outputs):
            raise ValueError("this model always fails")
"""

DATATYPE_SAMPLES = {
    "BOOL": [True, False, True, True],
    "UINT8": [0, 1, 254, 255],
    "UINT16": [0, 1, 65534, 65535],
    "UINT32": [0, 1, 2**32 - 2, 2**32 - 1],
    "UINT64": [0, 1, 2**64 - 2, 2**64 - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-(2**15), -1, 0, 2**15 - 1],
    "INT32": [-(2**31), -1, 0, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 2**63 - 1],
    "FP16": [-1.5, 0.0, 0.25, 65504.0],
    "FP32": [-1.5, 0.0, 0.25, 3.0e38],
    "FP64": [-1.5, 0.0, 0.25, 1.0e300],
    "BYTES": ["a", "", "ünïcode", "three words here"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = build_iris_repository(tmp_path_factory.mktemp("errors-repo"))
    write_custom_model(root / "raiser", RAISING_RUNTIME, "Raising")
    specs = [{"name": dt.lower(), "datatype": dt, "shape": [-1, 2]} for dt in DATATYPE_SAMPLES]
    write_echo_model(root, "echo", inputs=specs)
    with Server(root, "--workers", "0") as running:
        running.wait_ready()
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def iris_input(**overrides):
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [5.1, 3.5, 1.4, 0.2]}
    return {"inputs": [{**tensor, **overrides}]}


def assert_error(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    document = response.json()
    assert set(document) == {"error"}
    for fragment in fragments:
        assert fragment in document["error"]
    assert "Traceback" not in document["error"]


@pytest.mark.parametrize(("datatype", "values"), DATATYPE_SAMPLES.items())
def test_every_datatype_round_trips_flat_and_nested(http, datatype, values):
    name = datatype.lower()
    for data in (values, [values[:2], values[2:]]):
        body = {"inputs": [{"name": name, "shape": [2, 2], "datatype": datatype, "data": data}]}
        response = http.post("/v2/models/echo/infer", json=body)
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        assert output["name"] == name
        assert output["datatype"] == datatype
        assert output["shape"] == [2, 2]
        assert output["data"] == values


def test_unknown_model_and_version_are_404(http):
    assert_error(http.get("/v2/models/nope"), 404, "nope")
    assert_error(http.get("/v2/models/nope/ready"), 404, "nope")
    assert_error(http.post("/v2/models/nope/infer", json=iris_input()), 404, "nope")
    response = http.post("/v2/models/iris-logreg/versions/7/infer", json=iris_input())
    assert_error(response, 404, "iris-logreg", "7")
    assert_error(http.get("/v2/models/iris-logreg/versions/7"), 404, "version")


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"shape": [2, 4]}, ["'x'", "8 values", "got 4"]),
        ({"datatype": "FLOAT"}, ["'x'", "unknown datatype"]),
        ({"shape": [1, -4]}, ["'x'", "shape"]),
        ({"datatype": "UINT8", "data": [1, 2, 300, 4]}, ["'x'", "out of range", "UINT8"]),
        ({"datatype": "INT32", "data": [1.5, 2, 3, 4]}, ["'x'", "integers"]),
        ({"datatype": "INT8", "data": [-129, 0, 0, 0]}, ["'x'", "out of range"]),
        ({"datatype": "FP16", "data": [1e10, 0, 0, 0]}, ["'x'", "out of range"]),
        ({"datatype": "BOOL", "data": [1, 0, 1, 0]}, ["'x'", "true or false"]),
        ({"data": ["a", "b", "c", "d"]}, ["'x'", "numbers"]),
        ({"data": [[1, 2], [3]]}, ["'x'", "ragged"]),
        ({"datatype": "BYTES", "data": [1, 2, 3, 4]}, ["'x'", "strings"]),
        ({"shape": [1, 3], "data": [1, 2, 3]}, ["iris-logreg", "4 features", "got 3"]),
        ({"shape": [4], "data": [1, 2, 3, 4]}, ["iris-logreg", "2-D"]),
    ],
)
def test_bad_tensors_are_400_naming_the_input(http, overrides, fragments):
    response = http.post("/v2/models/iris-logreg/infer", json=iris_input(**overrides))
    assert_error(response, 400, *fragments)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b"{}", "'inputs'"),
        (b'{"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}', "'name'"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}', "no 'data'"),
        (b'{"inputs": [], "id": 5}', "'inputs'"),
    ],
)
def test_malformed_bodies_are_400(http, body, fragment):
    response = http.post("/v2/models/iris-logreg/infer", content=body)
    assert_error(response, 400, fragment)


def test_unknown_output_is_400_listing_the_available_ones(http):
    body = {**iris_input(), "outputs": [{"name": "probabilities"}]}
    response = http.post("/v2/models/iris-rf/infer", json=body)
    assert_error(response, 400, "'probabilities'", "predict, predict_proba")


def test_model_that_raises_is_500_without_traceback(http):
    response = http.post("/v2/models/raiser/infer", json=iris_input())
    assert_error(response, 500, "raiser", "ValueError", "this model always fails")
    # The server survives and keeps serving.
    assert http.post("/v2/models/iris-rf/infer", json=iris_input()).status_code == 200


def test_unknown_route_is_404_json(http):
    assert_error(http.get("/v2/nothing/here"), 404)
