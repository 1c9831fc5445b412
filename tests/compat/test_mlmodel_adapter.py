"""The adapter (inferpool.mlserver.adapter.runtime) and the compatibility package in one process:
how a custom runtime's answers, errors and settings cross over, without a server."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import List  # noqa: UP035 - MLServer's runtimes spell hints this way

import numpy as np
import pandas as pd
import pytest

from inferpool.errors import BadRequest, InferpoolError, ModelError, ModelLoadError, RuntimeNotFound
from inferpool.mlserver import MLModel, ModelSettings
from inferpool.mlserver.codecs import PandasCodec, decode_args
from inferpool.mlserver.types import InferenceRequest as MLRequest
from inferpool.mlserver.utils import get_model_uri
from inferpool.protocol.types import InferenceRequest, Tensor
from inferpool.runtimes.registry import runtime_class
from inferpool.settings import read_model_settings


def serve(root: Path, source: str, settings: dict | None = None):
    """The adapter runtime for ``model.Model`` in ``source``, loaded."""
    folder = root / "m"
    folder.mkdir()
    (folder / "model.py").write_text(textwrap.dedent(source))
    raw = {"name": "m", "implementation": "model.Model", **(settings or {})}
    (folder / "model-settings.json").write_text(json.dumps(raw))
    model_settings = read_model_settings(folder, "m")
    runtime = runtime_class(model_settings)(model_settings)
    runtime.load()
    return runtime


def request(**arrays: np.ndarray) -> InferenceRequest:
    tensors = [Tensor(name, "FP64", a.shape, a.astype(np.float64)) for name, a in arrays.items()]
    return InferenceRequest(tensors)


ANSWER = """
from inferpool.mlserver import MLModel
from inferpool.mlserver.types import InferenceResponse, ResponseOutput
from inferpool.mlserver.errors import MLServerError

class Model(MLModel):
    async def predict(self, payload):
        kind = self.settings.parameters.extra["kind"]
        if kind == "missing":
            raise MLServerError("no such thing", status_code=404)
        if kind == "crash":
            raise ZeroDivisionError("division by zero")
        data = [1, 2, 3] if kind == "short" else [1, 2, 3, 4]
        output = ResponseOutput(name="y", datatype="INT32", shape=[2, 2], data=data)
        return InferenceResponse(model_name=self.name, outputs=[output])
"""


def test_outputs_keep_name_datatype_and_shape(tmp_path: Path) -> None:
    runtime = serve(tmp_path, ANSWER, {"parameters": {"extra": {"kind": "ok"}}})
    (tensor,) = runtime.predict(request(x=np.zeros((1, 1))), ["y"]).values()
    assert (tensor.name, tensor.datatype, tensor.shape) == ("y", "INT32", (2, 2))
    assert tensor.data.dtype == np.int32 and tensor.data.tolist() == [[1, 2], [3, 4]]


def test_mlserver_error_keeps_its_status_and_message(tmp_path: Path) -> None:
    runtime = serve(tmp_path, ANSWER, {"parameters": {"extra": {"kind": "missing"}}})
    with pytest.raises(InferpoolError) as raised:
        runtime.predict(request(x=np.zeros((1, 1))), ["y"])
    assert (raised.value.status, raised.value.message) == (404, "no such thing")


def test_other_exceptions_reach_the_engine_as_they_are(tmp_path: Path) -> None:
    runtime = serve(tmp_path, ANSWER, {"parameters": {"extra": {"kind": "crash"}}})
    with pytest.raises(ZeroDivisionError):  # the engine answers it 500 (model_failure)
        runtime.predict(request(x=np.zeros((1, 1))), ["y"])


def test_data_that_does_not_fit_its_shape_is_the_models_fault(tmp_path: Path) -> None:
    runtime = serve(tmp_path, ANSWER, {"parameters": {"extra": {"kind": "short"}}})
    with pytest.raises(ModelError, match="model 'm' output 'y': data does not fit INT32"):
        runtime.predict(request(x=np.zeros((1, 1))), ["y"])


def test_load_returning_false_fails_the_model(tmp_path: Path) -> None:
    source = """
    from inferpool.mlserver import MLModel

    class Model(MLModel):
        async def load(self):
            return False
    """
    with pytest.raises(ModelLoadError, match=r"model 'm': load\(\) returned False"):
        serve(tmp_path, source)


def test_a_class_that_is_neither_runtime_nor_mlmodel_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeNotFound, match=r"not a subclass of inferpool\.Runtime or of"):
        serve(tmp_path, "class Model:\n    pass\n")


def test_load_and_predict_share_one_event_loop(tmp_path: Path) -> None:
    source = """
    import asyncio
    import numpy as np
    from inferpool.mlserver import MLModel
    from inferpool.mlserver.codecs import NumpyRequestCodec

    class Model(MLModel):
        async def load(self):
            self.lock = asyncio.Lock()  # bound to the loop that runs load()
            self.loop = asyncio.get_running_loop()
            return True

        async def predict(self, payload):
            async with self.lock:
                same = asyncio.get_running_loop() is self.loop
            return NumpyRequestCodec.encode_response(self.name, np.array([same]))
    """
    runtime = serve(tmp_path, source)
    for _ in range(2):
        (tensor,) = runtime.predict(request(x=np.zeros((1, 1))), ["output-1"]).values()
        assert tensor.data.tolist() == [[True]]


@pytest.mark.parametrize("hint", [List[str], list[str]], ids=["typing.List", "list"])  # noqa: UP006
def test_decode_args_finds_the_codec_of_either_spelling(hint) -> None:
    async def predict(self, text):
        return [item.upper() for item in text]

    predict.__annotations__ = {"text": hint, "return": hint}  # as written in a runtime
    wrapped = decode_args(predict)

    class Upper(MLModel):
        pass

    model = Upper(ModelSettings(name="u", implementation=Upper))
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [b"a"]}
    response = asyncio.run(wrapped(model, MLRequest(inputs=[text])))
    assert response.outputs[0].data.root == [b"A"]
    assert model.settings.implementation_ == f"{__name__}.Upper"  # a class: its import path


def test_get_model_uri_is_relative_to_the_settings_file(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    settings = ModelSettings(name="w", implementation="x.Y", parameters={"uri": "./weights.bin"})
    settings._source = str(tmp_path / "model-settings.json")
    assert asyncio.run(get_model_uri(settings)) == str(tmp_path / "weights.bin")


def test_pandas_codec_round_trips_strings_numbers_and_objects() -> None:
    frame = pd.DataFrame({"n": [1.5, None], "s": ["a", "b"], "o": [[1], {"k": 2}]})
    response = PandasCodec.encode_response("m", frame)
    content_types = [o.parameters.content_type if o.parameters else None for o in response.outputs]
    assert content_types == [None, "str", "pd_json"]
    assert response.outputs[0].data.root == [1.5, None]
    back = PandasCodec.decode_response(response)
    assert back["o"].tolist() == [[1], {"k": 2}]
    assert back["n"].isna().tolist() == [False, True]


def test_bytes_outputs_keep_every_byte_and_nested_data_is_flattened(tmp_path: Path) -> None:
    source = """
    from inferpool.mlserver import MLModel
    from inferpool.mlserver.types import InferenceResponse, ResponseOutput

    class Model(MLModel):
        async def predict(self, payload):
            data = [[b"a\\x00", "é"], [b"", b"\\xff"]]
            output = ResponseOutput(name="b", datatype="BYTES", shape=[2, 2], data=data)
            return InferenceResponse(model_name=self.name, outputs=[output])
    """
    runtime = serve(tmp_path, source)
    (tensor,) = runtime.predict(request(x=np.zeros((1, 1))), ["b"]).values()
    assert tensor.data.tolist() == [[b"a\x00", "é".encode()], [b"", b"\xff"]]


def test_a_request_parameter_of_the_wrong_type_is_a_400(tmp_path: Path) -> None:
    runtime = serve(tmp_path, ANSWER, {"parameters": {"extra": {"kind": "ok"}}})
    tensor = Tensor("x", "FP64", (1,), np.zeros(1), {"content_type": 5})
    with pytest.raises(BadRequest, match=r"model 'm': parameters of input 'x': content_type: "):
        runtime.predict(InferenceRequest([tensor]), ["y"])


def test_declared_content_types_decode_as_in_mlserver() -> None:
    # An input's content type from the model's metadata, the request's from the model's
    # parameters.content_type: both stand in for what the request does not say.
    settings = ModelSettings(
        name="d",
        implementation="x.Y",
        inputs=[
            {"name": "s", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "str"}}
        ],
        parameters={"content_type": "pd"},
    )
    model = MLModel(settings)
    payload = MLRequest(
        inputs=[
            {"name": "s", "datatype": "BYTES", "shape": [2], "data": [b"a", b"b"]},
            {"name": "n", "datatype": "INT64", "shape": [2], "data": [1, 2]},
        ]
    )
    assert model.decode(payload.inputs[0]) == ["a", "b"]
    frame = model.decode_request(payload)
    assert frame["s"].tolist() == ["a", "b"] and frame["n"].dtype == np.int64
