"""MLServer's ``pd_json`` column content type, and a model-wide ``parameters.content_type``
in model-settings.json as the default of a request that carries none (issue 13, smaller
breaks). Real servers; an echo runtime describes or mirrors what it received."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pandas as pd
import pytest

from tests.e2e.test_content_types import decoded, infer
from tests.support import Server
from tests.support.runtimes import write_echo_model

ECHO_OUTPUT = [{"name": "echo", "datatype": "BYTES", "shape": []}]
DOCS = [{"a": 1, "b": [1, 2]}, [3, "x"], "text", None]


def set_model_content_type(folder, content_type: str) -> None:
    path = folder / "model-settings.json"
    document = json.loads(path.read_text())
    document["parameters"]["content_type"] = content_type
    path.write_text(json.dumps(document))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("smaller-content-repo")
    write_echo_model(root, "frame-mirror", None, accepts="dataframe", mode="mirror")
    write_echo_model(root, "dict-describe", ECHO_OUTPUT, accepts="dict", mode="describe")
    folder = write_echo_model(root, "wide-pd", ECHO_OUTPUT, accepts="dict", mode="describe")
    set_model_content_type(folder, "pd")
    declared = [
        {"name": "doc", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "json"}}
    ]
    folder = write_echo_model(
        root, "wide-str", ECHO_OUTPUT, declared, accepts="dict", mode="describe"
    )
    set_model_content_type(folder, "str")
    with Server(root, "--workers", "1") as running:
        running.wait_ready()
        yield running


def texts(name: str, values: list[str], content_type: str | None = None) -> dict:
    tensor: dict = {"name": name, "datatype": "BYTES", "shape": [len(values)], "data": values}
    if content_type is not None:
        tensor["parameters"] = {"content_type": content_type}
    return tensor


def numbers(name: str, values: list[int]) -> dict:
    return {"name": name, "datatype": "INT64", "shape": [len(values)], "data": values}


# -- pd_json ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [[4], [4, 1]])
def test_a_pd_json_column_is_one_document_per_row(server, shape):
    column = texts("doc", [json.dumps(doc) for doc in DOCS], "pd_json")
    column["shape"] = shape
    frame = decoded(infer(server, "frame-mirror", [column, numbers("n", [1, 2, 3, 4])]))
    assert isinstance(frame, pd.DataFrame)
    assert frame["doc"].tolist() == DOCS
    assert frame["n"].tolist() == [1, 2, 3, 4]


def test_pd_json_in_a_pd_request_to_a_dict_model(server):
    column = texts("doc", ['{"k": 1}', "[2]"], "pd_json")
    response = infer(server, "dict-describe", [column], content_type="pd")
    described = decoded(response)["echo"]
    assert described == {"payload": "DataFrame", "columns": {"doc": "object"}, "rows": 2}


def test_pd_json_outside_a_frame_is_a_list_of_documents(server):
    column = texts("doc", ['{"k": 1}', "[2]"], "pd_json")
    items = decoded(infer(server, "dict-describe", [column]))["echo"]["items"]
    assert items["doc"] == {
        "type": "list",
        "length": 2,
        "element": "dict",
        "value": "[{'k': 1}, [2]]",
    }


NOT_JSON = "input 'doc': element 1 is not valid JSON"
TOO_DEEP = "input 'doc': element 0 is not valid JSON"
NOT_BYTES = "input 'doc': content type 'pd_json' needs BYTES data, got INT64"
INTS = {"name": "doc", "datatype": "INT64", "shape": [1], "data": [1]}


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (texts("doc", ['{"k": 1}', "{nope"], "pd_json"), NOT_JSON),
        ({**INTS, "parameters": {"content_type": "pd_json"}}, NOT_BYTES),
        (texts("doc", ["[" * 5000 + "]" * 5000], "pd_json"), TOO_DEEP),
    ],
)
def test_bad_pd_json_is_400(server, tensor, message):
    response = infer(server, "frame-mirror", [tensor])
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


# -- the model-wide content type ----------------------------------------------------------
def test_a_model_wide_request_content_type_decodes_a_request_without_one(server):
    inputs = [numbers("a", [1, 2]), texts("b", ["x", "y"], "str")]
    described = decoded(infer(server, "wide-pd", inputs))["echo"]
    assert described == {
        "payload": "DataFrame",
        "columns": {"a": "int64", "b": described["columns"]["b"]},
        "rows": 2,
    }
    # Without the model-wide type, the same model-runtime pair gets a dict.
    assert decoded(infer(server, "dict-describe", inputs))["echo"]["payload"] == "dict"


def test_the_request_content_type_wins_over_the_model_wide_one(server):
    inputs = [numbers("a", [1, 2])]
    described = decoded(infer(server, "wide-pd", inputs, content_type="dict"))["echo"]
    assert described["payload"] == "dict"


def test_a_model_wide_input_content_type_is_the_default_of_inputs_without_one(server):
    inputs = [
        texts("plain", ["x", "y"]),  # none of its own: the model-wide str
        texts("raw", ["eA=="], "base64"),  # its own wins
        texts("doc", ['{"k": 1}']),  # the model's metadata declares json: that wins
    ]
    items = decoded(infer(server, "wide-str", inputs))["echo"]["items"]
    assert items["plain"] == {"type": "list", "length": 2, "element": "str", "value": "['x', 'y']"}
    assert items["raw"]["value"] == "[b'x']"
    assert items["doc"]["element"] == "dict"
    # The same inputs to a model without it: BYTES stay bytes.
    items = decoded(infer(server, "dict-describe", [texts("plain", ["x", "y"])]))["echo"]["items"]
    assert items["plain"]["type"] == "ndarray"


def test_an_unknown_model_wide_content_type_fails_the_model_with_a_reason(tmp_path):
    folder = write_echo_model(tmp_path, "bad-wide", ECHO_OUTPUT, accepts="dict")
    set_model_content_type(folder, "nope")
    with Server(tmp_path, "--workers", "0") as server:
        assert server.wait_exit() != 0
        output = server.output()
    assert "parameters.content_type in model-settings.json: unknown content type 'nope'" in output


def test_pd_json_is_symmetric_and_never_picked_by_value():
    from inferpool.codecs.registry import encode_output, find_input_codec

    codec = find_input_codec("pd_json", "input 'doc'")
    tensor = codec.encode("doc", DOCS)
    assert (tensor.datatype, tensor.shape, tensor.content_type) == ("BYTES", (4,), "pd_json")
    assert codec.decode(tensor) == DOCS
    assert encode_output("doc", [{"a": 1}]).content_type == "json"
