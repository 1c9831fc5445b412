"""Three MLServer custom runtimes, written once as source text with MLServer's own import
lines, the repository that serves them, and the requests they are asked with.

``tests/mlserver/test_mlmodel_installed.py`` serves them as they are (MLServer installed);
``tests/compat/test_mlmodel_*.py`` after rewriting their ``mlserver`` imports to
``inferpool.mlserver``, which is the only change a user makes without MLServer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# decode_request with NumpyRequestCodec, NumpyCodec for the output, get_model_uri for its
# artefact, InferenceError for a value it refuses.
SCALER = """
import json

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, NumpyRequestCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class Scaler(MLModel):
    async def load(self) -> bool:
        with open(await get_model_uri(self.settings)) as file:
            self.factor = json.load(file)["factor"]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        rows = self.decode_request(payload, default_codec=NumpyRequestCodec)
        if (rows < 0).any():
            raise InferenceError("negative values cannot be scaled")
        scaled = (rows * self.factor).astype(np.float64)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output("scaled", scaled)],
        )
"""

# predict decorated with @decode_args: a list of strings and an array in, strings out.
GREETER = """
from typing import List

import numpy as np
from mlserver import MLModel
from mlserver.codecs import decode_args


class Greeter(MLModel):
    async def load(self) -> bool:
        self.greeting = self.settings.parameters.extra["greeting"]
        return True

    @decode_args
    async def predict(self, name: List[str], times: np.ndarray) -> List[str]:
        return [
            " ".join([f"{self.greeting}, {who}!"] * int(count))
            for who, count in zip(name, times.reshape(-1))
        ]
"""

# A pd request (decode_request gives the DataFrame) and a DataFrame answered with
# encode_response (PandasCodec, chosen by the payload's type).
TOTALS = """
import pandas as pd
from mlserver import MLModel
from mlserver.codecs import PandasCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse


class Totals(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        frame = self.decode_request(payload)
        if not isinstance(frame, pd.DataFrame):
            raise InferenceError("send a pd request")
        totals = pd.DataFrame(
            {
                "item": [str(item).upper() for item in frame["item"]],
                "total": frame["price"] * frame["quantity"],
            }
        )
        return self.encode_response(totals, default_codec=PandasCodec)
"""

RUNTIMES = {
    "scaler": ("scaler.py", SCALER, "scaler.Scaler"),
    "greeter": ("greeter.py", GREETER, "greeter.Greeter"),
    "totals": ("totals.py", TOTALS, "totals.Totals"),
}


def as_inferpool(source: str) -> str:
    """The runtime with its MLServer import lines pointed at ``inferpool.mlserver``."""
    return re.sub(r"^(from|import) mlserver\b", r"\1 inferpool.mlserver", source, flags=re.M)


def write_repository(root: Path, rewrite: bool) -> Path:
    """The three models, each in its folder with MLServer's model-settings.json."""
    for name, (filename, source, implementation) in RUNTIMES.items():
        folder = root / name
        folder.mkdir(parents=True)
        (folder / filename).write_text(as_inferpool(source) if rewrite else source)
        settings: dict = {"name": name, "implementation": implementation}
        if name == "scaler":
            (folder / "factor.json").write_text(json.dumps({"factor": 2.5}))
            settings["parameters"] = {"uri": "./factor.json", "version": "v1"}
        if name == "greeter":
            settings["parameters"] = {"extra": {"greeting": "Hello"}}
        (folder / "model-settings.json").write_text(json.dumps(settings))
    return root


SCALER_REQUEST = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}]
}
SCALER_OUTPUT = {
    "name": "scaled",
    "datatype": "FP64",
    "shape": [2, 2],
    "parameters": {"content_type": "np"},
    "data": [2.5, 5.0, 7.5, 10.0],
}
GREETER_REQUEST = {
    "inputs": [
        {
            "name": "name",
            "datatype": "BYTES",
            "shape": [2],
            "parameters": {"content_type": "str"},
            "data": ["Ada", "Linus"],
        },
        {"name": "times", "datatype": "INT32", "shape": [2], "data": [1, 2]},
    ]
}
GREETER_OUTPUT = {
    "name": "output-0",
    "datatype": "BYTES",
    "shape": [2, 1],
    "parameters": {"content_type": "str"},
    "data": ["Hello, Ada!", "Hello, Linus! Hello, Linus!"],
}
TOTALS_REQUEST = {
    "parameters": {"content_type": "pd"},
    "inputs": [
        {
            "name": "item",
            "datatype": "BYTES",
            "shape": [2],
            "parameters": {"content_type": "str"},
            "data": ["pen", "ink"],
        },
        {"name": "price", "datatype": "FP64", "shape": [2], "data": [1.5, 4.0]},
        {"name": "quantity", "datatype": "INT64", "shape": [2], "data": [4, 3]},
    ],
}
TOTALS_OUTPUTS = [
    {
        "name": "item",
        "datatype": "BYTES",
        "shape": [2, 1],
        "parameters": {"content_type": "str"},
        "data": ["PEN", "INK"],
    },
    {"name": "total", "datatype": "FP64", "shape": [2, 1], "data": [6.0, 12.0]},
]


# The typed contents field of each datatype used above.
_CONTENTS = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT32": "int_contents"}
_CONTENTS |= {"INT64": "int64_contents", "BYTES": "bytes_contents"}


def _set_parameters(target, parameters: dict) -> None:
    for key, value in parameters.items():
        target[key].string_param = value


def grpc_request(model: str, document: dict):
    """A REST request document above as a gRPC ``ModelInferRequest`` (typed contents)."""
    from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    _set_parameters(request.parameters, document.get("parameters", {}))
    for tensor in document["inputs"]:
        added = request.inputs.add(
            name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
        )
        _set_parameters(added.parameters, tensor.get("parameters", {}))
        data = tensor["data"]
        if tensor["datatype"] == "BYTES":
            data = [item.encode() for item in data]
        getattr(added.contents, _CONTENTS[tensor["datatype"]]).extend(data)
    return request


def grpc_outputs(response) -> list[dict]:
    """The outputs of a gRPC ``ModelInferResponse`` as REST documents (BYTES as str)."""
    outputs = []
    for tensor in response.outputs:
        document = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        parameters = {key: value.string_param for key, value in tensor.parameters.items()}
        if parameters:
            document["parameters"] = parameters
        data = list(getattr(tensor.contents, _CONTENTS[tensor.datatype]))
        if tensor.datatype == "BYTES":
            data = [item.decode() for item in data]
        document["data"] = data
        outputs.append(document)
    return outputs


# (model, request, expected outputs): one request to each runtime.
CASES = [
    ("scaler", SCALER_REQUEST, [SCALER_OUTPUT]),
    ("greeter", GREETER_REQUEST, [GREETER_OUTPUT]),
    ("totals", TOTALS_REQUEST, TOTALS_OUTPUTS),
]
