"""Python values in and out of the embedded API (``inferpool.Engine``), with no JSON.

``build_request`` turns what a Python program holds (a numpy array, a pandas DataFrame, a
mapping of input name to array, a V2 request as a dict or an ``InferenceRequest``) into
the typed ``InferenceRequest`` the worker path runs. ``InferenceResult`` is what comes
back: output name to numpy array, and the whole response as a DataFrame on demand.

With worker processes the request still has to cross a process boundary as bytes:
``protocol/grpc_raw.py``'s ``to_wire`` and ``from_wire`` carry it in the gRPC format
with raw tensor contents.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from inferpool.codecs.pandas import is_pandas
from inferpool.codecs.registry import decode_output, decode_response, encode_outputs
from inferpool.protocol import rest_json
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput

if TYPE_CHECKING:
    import pandas as pd

# The name of a lone array's input when the model does not declare exactly one input.
DEFAULT_INPUT = "input-0"


def build_request(
    inputs: Any,
    outputs: Sequence[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    input_name: str = DEFAULT_INPUT,
) -> InferenceRequest:
    """The typed request for ``inputs``:

    - an ``InferenceRequest``: as it is;
    - a dict with an ``"inputs"`` list: a V2 request document (its ``data`` may be an
      ndarray), checked as the REST frontend checks one;
    - a pandas DataFrame: one input per column, the request labelled ``pd`` so that the
      model gets the frame back;
    - any other mapping: input name to value (ndarray, list of str, ...);
    - anything else: one array, named ``input_name``.

    ``outputs`` and ``parameters`` are added to the request (``outputs`` replaces the
    request's own list); a problem with the inputs is a ``BadRequest``.
    """
    if isinstance(inputs, InferenceRequest):
        request = inputs
    elif isinstance(inputs, Mapping) and isinstance(inputs.get("inputs"), list):
        request = rest_json.request_from_document(dict(inputs), binary_tail=None)
    else:
        if is_pandas(inputs, "DataFrame"):
            named = {"": inputs}  # its columns name the inputs; labels the request "pd"
        elif isinstance(inputs, Mapping):
            named = {str(name): value for name, value in inputs.items()}
        else:
            named = {input_name: np.asarray(inputs)}
        tensors, content_type = encode_outputs(named)
        request = InferenceRequest(tensors)
        if content_type is not None:
            request.parameters["content_type"] = content_type
    if outputs is not None:  # a copy: the caller's request object stays as it was
        request = replace(request, outputs=[RequestedOutput(name) for name in outputs])
    if parameters:
        request = replace(request, parameters={**request.parameters, **parameters})
    return request


class InferenceResult(Mapping[str, Any]):
    """The outputs of one inference: output name to value, in the response's order.

    A value is what the output's content type decodes to: a numpy array shaped as the
    output (the default), a list of str for ``str`` outputs. ``as_dataframe()`` gives the
    outputs as one DataFrame (a model that returned a DataFrame gets it back as it was);
    ``response`` is the typed V2 response itself.
    """

    __slots__ = ("_values", "response")

    def __init__(self, response: InferenceResponse) -> None:
        self.response = response
        self._values = {tensor.name: decode_output(tensor) for tensor in response.outputs}

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"InferenceResult({self.response.model_name!r}, outputs={list(self._values)})"

    def as_dataframe(self) -> pd.DataFrame:
        """One column per output (an output of shape [rows, k]: k columns ``name_0`` ...)."""
        frame: pd.DataFrame = decode_response(self.response.outputs, "pd")
        return frame
