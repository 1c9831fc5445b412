"""Each content type reaches a model as the right Python type, and comes back symmetric.

A custom runtime (tests/support/echo_model.py) describes what it received, or mirrors it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import pandas as pd
import pytest

from inferpool.codecs.registry import decode_response
from inferpool.protocol import rest_json
from inferpool.protocol.binary import bytes_elements_to_wire
from tests.support import Server
from tests.support.runtimes import write_echo_model

ECHO_OUTPUT = [{"name": "echo", "datatype": "BYTES", "shape": []}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("content-repo")
    write_echo_model(root, "echo-dict", ECHO_OUTPUT, accepts="dict", mode="describe")
    write_echo_model(root, "echo-request", ECHO_OUTPUT, accepts="request", mode="describe")
    write_echo_model(root, "echo-frame", ECHO_OUTPUT, accepts="dataframe", mode="describe")
    write_echo_model(root, "mirror", None, accepts="dict", mode="mirror")
    declared = [
        {"name": "text", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "str"}},
        {"name": "doc", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "json"}},
    ]
    write_echo_model(root, "echo-declared", ECHO_OUTPUT, declared, accepts="dict", mode="describe")
    with Server(root, "--workers", "0") as running:
        running.wait_ready()
        yield running


def infer(server: Server, model: str, inputs: list[dict], **parameters) -> httpx.Response:
    document: dict = {"inputs": inputs}
    if parameters:
        document["parameters"] = parameters
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=document, timeout=30)


def decoded(response: httpx.Response):
    assert response.status_code == 200, response.text
    reply = rest_json.decode_response(response.content)
    return decode_response(reply.outputs, reply.parameters.get("content_type"))


def echo(server: Server, model: str, inputs: list[dict], **parameters) -> dict:
    return decoded(infer(server, model, inputs, **parameters))["echo"]


def texts(name: str, values: list[str], content_type: str | None = None, shape=None) -> dict:
    tensor = {"name": name, "datatype": "BYTES", "shape": shape or [len(values)], "data": values}
    if content_type:
        tensor["parameters"] = {"content_type": content_type}
    return tensor


def test_each_content_type_arrives_as_its_python_type(server: Server) -> None:
    inputs = [
        {"name": "num", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
        texts("raw", ["a", "b"]),
        texts("text", ["héllo", "wörld"], "str"),
        texts("blob", [base64.b64encode(b"\x00\xff").decode()], "base64"),
        texts("when", ["2024-02-29T12:34:56", "2024-03-01"], "datetime"),
        texts("doc", ['{"k": [1, 2]}'], "json"),
        texts("grid", ["a", "b", "c", "d"], "string", shape=[2, 2]),
    ]
    items = echo(server, "echo-dict", inputs)["items"]
    assert items["num"] == {
        "type": "ndarray",
        "dtype": "float32",
        "shape": [2, 3],
        "element": "float32",
    }
    assert items["raw"]["type"] == "ndarray" and items["raw"]["element"] == "bytes"
    assert items["text"]["value"] == repr(["héllo", "wörld"])
    assert items["blob"]["value"] == repr([b"\x00\xff"])
    assert items["when"]["dtype"] == "datetime64[s]" and items["when"]["shape"] == [2]
    assert items["doc"]["value"] == repr([{"k": [1, 2]}])
    assert items["grid"]["shape"] == [2, 2] and items["grid"]["element"] == "str"


def test_model_metadata_content_type_applies_when_the_request_is_silent(server: Server) -> None:
    metadata = httpx.get(f"{server.url}/v2/models/echo-declared", timeout=30).json()
    assert metadata["inputs"][0]["parameters"]["content_type"] == "str"
    inputs = [texts("text", ["a", "b"]), texts("doc", ['{"x": 1}']), texts("other", ["c"])]
    items = echo(server, "echo-declared", inputs)["items"]
    assert items["text"]["value"] == repr(["a", "b"])
    assert items["doc"]["value"] == repr([{"x": 1}])
    assert items["other"]["element"] == "bytes"  # undeclared: bytes, as over every wire
    # the request's own content type still wins over the model's
    overridden = echo(server, "echo-declared", [texts("text", ["YQ=="], "base64")])["items"]
    assert overridden["text"]["value"] == repr([b"a"])


def test_pd_request_gives_a_dataframe_with_mixed_dtypes(server: Server) -> None:
    inputs = [
        {"name": "age", "datatype": "INT64", "shape": [2], "data": [31, 47]},
        texts("name", ["ann", "bob"], "str", shape=[2, 1]),
        texts("seen", ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z"], "datetime"),
    ]
    described = echo(server, "echo-dict", inputs, content_type="pd")
    assert described["payload"] == "DataFrame"
    assert described["rows"] == 2
    columns = described["columns"]
    assert columns["age"] == "int64"
    assert columns["name"] in ("str", "object")
    assert columns["seen"].startswith("datetime64")


def test_runtime_accepting_dataframe_gets_one_without_being_asked(server: Server) -> None:
    inputs = [{"name": "x", "datatype": "FP64", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]}]
    described = echo(server, "echo-frame", inputs)
    assert described == {
        "payload": "DataFrame",
        "columns": {"x_0": "float64", "x_1": "float64"},
        "rows": 3,
    }


def test_runtime_accepting_request_gets_the_tensors(server: Server) -> None:
    inputs = [{"name": "x", "datatype": "UINT8", "shape": [1, 2], "data": [1, 255]}]
    described = echo(server, "echo-request", inputs)
    assert described["payload"] == "InferenceRequest"
    assert described["items"]["x"]["dtype"] == "uint8"
    assert described["items"]["x"]["shape"] == [1, 2]


def test_dataframe_returned_is_one_output_per_column_and_decodes_back(server: Server) -> None:
    inputs = [
        {"name": "score", "datatype": "FP32", "shape": [2], "data": [0.25, 0.75]},
        texts("label", ["yes", "no"], "str"),
        texts("at", ["2024-05-01T08:00:00", "2024-05-02T09:30:00"], "datetime"),
    ]
    response = infer(server, "mirror", inputs, content_type="pd")
    body = response.json()
    assert body["parameters"]["content_type"] == "pd"
    content_types = {o["name"]: o["parameters"]["content_type"] for o in body["outputs"]}
    assert content_types == {"score": "np", "label": "str", "at": "datetime"}
    frame = decoded(response)
    expected = pd.DataFrame(
        {
            "score": np.array([0.25, 0.75], dtype=np.float32),
            "label": ["yes", "no"],
            "at": np.array(["2024-05-01T08:00:00", "2024-05-02T09:30:00"], dtype="M8[s]"),
        }
    )
    pd.testing.assert_frame_equal(frame, expected)


def test_dict_returned_decodes_back_to_the_same_objects(server: Server) -> None:
    inputs = [
        {"name": "m", "datatype": "INT16", "shape": [2, 2], "data": [1, -2, 3, -4]},
        texts("words", ["ß", "∂"], "str"),
        texts("docs", ['{"a": null}'], "json"),
    ]
    result = decoded(infer(server, "mirror", inputs))
    assert result.keys() == {"m", "words", "docs"}
    assert result["m"].dtype == np.int16 and result["m"].tolist() == [[1, -2], [3, -4]]
    assert result["words"] == ["ß", "∂"]
    assert result["docs"] == [{"a": None}]


def binary_request(name: str, elements: list[bytes], content_type: str) -> tuple[bytes, int]:
    raw = bytes_elements_to_wire(np.array(elements, dtype=object))
    parameters = {"content_type": content_type, "binary_data_size": len(raw)}
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [len(elements)],
                    "parameters": parameters,
                }
            ]
        }
    )
    return header + raw, len(header)


@pytest.mark.parametrize(
    ("inputs", "parameters", "message"),
    [
        ([texts("b", ["@@@"], "base64")], {}, "input 'b': element 0 is not valid base64"),
        ([texts("j", ["[1,"], "json")], {}, "input 'j': element 0 is not valid JSON"),
        ([texts("d", ["31/12/2024"], "datetime")], {}, "input 'd': element 0 ('31/12/2024')"),
        ([texts("c", ["x"], "pickle")], {}, "input 'c': unknown content type 'pickle'"),
        ([texts("c", ["x"])], {"content_type": "arrow"}, "unknown content type 'arrow'"),
        (
            [texts("a", ["x", "y"], "str"), texts("b", ["z"], "str")],
            {"content_type": "pd"},
            "'a' has 2, 'b' has 1",
        ),
    ],
    ids=["base64", "json", "datetime", "input-type", "request-type", "pd-lengths"],
)
def test_malformed_payload_is_a_400_naming_the_problem(server, inputs, parameters, message):
    response = infer(server, "echo-dict", inputs, **parameters)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_invalid_utf8_under_str_is_a_400(server: Server) -> None:
    body, json_length = binary_request("t", [b"fine", b"\xc3\x28"], "str")
    response = httpx.post(
        f"{server.url}/v2/models/echo-dict/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(json_length)},
        timeout=30,
    )
    assert response.status_code == 400
    assert "input 't': element 1 is not valid UTF-8" in response.json()["error"]
    # the same bytes without a content type arrive as bytes, untouched
    body, json_length = binary_request("t", [b"\xc3\x28"], "np")
    ok = httpx.post(
        f"{server.url}/v2/models/echo-dict/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(json_length)},
        timeout=30,
    )
    assert decoded(ok)["echo"]["items"]["t"]["element"] == "bytes"


def test_server_still_serves_after_bad_requests(server: Server) -> None:
    inputs = [{"name": "x", "datatype": "BOOL", "shape": [2], "data": [True, False]}]
    items = echo(server, "echo-dict", inputs)["items"]
    assert items["x"]["dtype"] == "bool"
