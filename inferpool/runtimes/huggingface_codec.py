"""MLServer's HuggingFace codec: a V2 request as a pipeline call's arguments, and a
pipeline's answer as MLServer's one ``output`` of JSON-encoded BYTES. No transformers or
torch here (the unit tests run without them).

Inputs, each by its content type (MLServer 1.7.1's ``HuggingfaceRequestCodec``): none or
``str``, a BYTES tensor as a list of strings (other datatypes: their values, one value
alone as itself); ``hg_json``, its one element as JSON; ``hg_jsonlist``, each element as
JSON; ``np``/``nplist``, a list of its values; ``base64``, bytes. The input ``args`` is
the call's positional arguments (each string one argument), ``array_inputs`` a list given
as the first one (a batch), and any other input a keyword argument (``question`` and
``context`` for question answering).

The answer (MLServer's ``HuggingfaceListJSONCodec``): the pipeline's result as a list (a
single result: a list of one), each item JSON-encoded (arrays as lists) into one element
of a BYTES ``[n, 1]`` output named ``output``, labelled ``hg_jsonlist``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from inferpool.codecs.base import bytes_tensor
from inferpool.errors import BadRequest
from inferpool.protocol.types import InferenceRequest, Tensor, TensorSpec

OUTPUT = "output"  # the name of MLServer's one output
OUTPUT_CONTENT_TYPE = "hg_jsonlist"
READABLE_CONTENT_TYPES = ("str", "hg_json", "hg_jsonlist", "np", "nplist", "base64")
_STR = {"content_type": "str"}
# The inputs each task takes, as MLServer's metadata lists them (text generation: ``args``
# too, which MLServer's pipeline call takes the same way).
TASK_INPUTS: dict[str, list[TensorSpec]] = {
    "question-answering": [
        TensorSpec("question", "BYTES", [-1], _STR),
        TensorSpec("context", "BYTES", [-1], _STR),
    ],
    "text-generation": [
        TensorSpec("args", "BYTES", [-1], _STR),
        TensorSpec("array_inputs", "BYTES", [-1], _STR),
    ],
}
DEFAULT_INPUTS = [TensorSpec("args", "BYTES", [-1], _STR)]
OUTPUT_SPEC = TensorSpec(OUTPUT, "BYTES", [-1, 1], {"content_type": OUTPUT_CONTENT_TYPE})


def task_inputs(task: str) -> list[TensorSpec]:
    """The inputs a task's pipeline takes (metadata)."""
    return TASK_INPUTS.get(task, DEFAULT_INPUTS)


def call_arguments(
    request: InferenceRequest, defaults: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The pipeline call's positional and keyword arguments for a request: ``defaults``
    (the settings' ``inference_kwargs``) updated with the request's own inputs."""
    kwargs: dict[str, Any] = dict(defaults)
    for tensor in request.inputs:
        kwargs[tensor.name] = decode(tensor, request.content_type)
    args = kwargs.pop("args", [])
    if not isinstance(args, list):
        args = [args]
    array_inputs = kwargs.pop("array_inputs", None)
    if array_inputs:
        args = [list(array_inputs), *args]
    if not args and not kwargs:
        raise BadRequest("the request has no input: send the text as the BYTES input 'args'")
    return args, kwargs


def decode(tensor: Tensor, request_content_type: str | None = None) -> Any:
    """One input as MLServer's HuggingFace codec decodes it (the module's text)."""
    content_type = tensor.content_type
    if content_type is None and request_content_type in READABLE_CONTENT_TYPES:
        content_type = request_content_type
    items = np.asarray(tensor.data).reshape(-1).tolist()
    try:
        if content_type in (None, "str"):
            if tensor.datatype == "BYTES":
                return [_text(item) for item in items]
            return items[0] if len(items) == 1 else items
        if content_type == "hg_json":
            return json.loads(_text(items[0])) if items else None
        if content_type == "hg_jsonlist":
            return [json.loads(_text(item)) for item in items]
        if content_type in ("np", "nplist"):
            return np.asarray(tensor.data).tolist()
        if content_type == "base64":
            return [base64.b64decode(item, validate=True) for item in items]
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(
            f"input '{tensor.name}' is not valid {content_type or 'UTF-8 text'}: {exc}"
        ) from None
    raise BadRequest(
        f"input '{tensor.name}': content type '{content_type}' is not one the huggingface "
        f"runtime reads ({', '.join(READABLE_CONTENT_TYPES)})"
    )


def _text(item: Any) -> str:
    return item.decode("utf-8") if isinstance(item, bytes | bytearray) else str(item)


def encode_answer(prediction: Any, name: str = OUTPUT) -> Tensor:
    """A pipeline's answer as MLServer's one output of JSON elements (the module's text)."""
    items = prediction if isinstance(prediction, list) else [prediction]
    elements = [json.dumps(item, default=_plain).encode() for item in items]
    return bytes_tensor(name, elements, (len(elements), 1), OUTPUT_CONTENT_TYPE)


def _plain(value: Any) -> Any:
    """What json cannot encode by itself: arrays and tensors as lists, numpy scalars as
    Python numbers (MLServer's encoder turns arrays into lists too)."""
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "tolist"):  # an ndarray, or a torch tensor
        return value.tolist()
    raise TypeError(f"cannot encode a {type(value).__name__} as JSON")
