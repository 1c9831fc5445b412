"""The V2 protocol's JSON bodies as OpenAPI 3.0 schemas (``components/schemas``), and the
schemas of one model's tensors built from its metadata.

``COMPONENTS`` is the table the server's document (``openapi.py``) refers to with
``#/components/schemas/<name>``: the Open Inference Protocol's requests and answers
(``InferenceRequest``, ``InferenceResponse``, ``MetadataModelResponse``, ...), the error
body every failure carries (``Error``: ``{"error": "..."}``), and the extensions inferpool
serves (repository, statistics, generate, feedback). ``tensor_schema`` narrows
``RequestInput``/``ResponseOutput`` to one tensor of a model's metadata: its name and
datatype as one-value enums, its shape as an array of that many dimensions, its data typed
by the datatype.
"""

from __future__ import annotations

from typing import Any

from inferpool.protocol.datatypes import DATATYPES

Schema = dict[str, Any]
# An example request's tensors hold at most this many elements (a page stays readable).
EXAMPLE_ELEMENTS = 4096


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(required: list[str], properties: dict[str, Schema], **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = required
    return schema


_STRING: Schema = {"type": "string"}
_BOOL: Schema = {"type": "boolean"}
_SHAPE: Schema = {"type": "array", "items": {"type": "integer", "format": "int64"}}
_ANY: Schema = {}
_REASON: Schema = {"type": "string", "description": "why it is not, when it is not"}
_COUNT: Schema = {"type": "integer", "format": "int64", "minimum": 0}

# One scalar of a tensor's ``data`` by datatype (BYTES: a string, or base64 with the
# ``base64`` content type).
_SCALAR_BY_DATATYPE: dict[str, Schema] = {
    "BOOL": {"type": "boolean"},
    "BYTES": {"type": "string"},
    **{dt: {"type": "integer"} for dt in DATATYPES if dt.startswith(("INT", "UINT"))},
    **{dt: {"type": "number"} for dt in DATATYPES if dt.startswith("FP")},
}

_TENSOR = _object(
    ["name", "shape", "datatype", "data"],
    {
        "name": _STRING,
        "shape": _SHAPE,
        "datatype": {"type": "string", "enum": list(DATATYPES)},
        "parameters": _ref("Parameters"),
        "data": _ref("TensorData"),
    },
)

COMPONENTS: dict[str, Schema] = {
    "Error": _object(
        ["error"],
        {"error": {"type": "string", "description": "what went wrong, in one sentence"}},
    ),
    "Parameters": {"type": "object", "additionalProperties": True},
    "TensorData": {
        "type": "array",
        "items": _ANY,
        "description": "the tensor's elements, flat in row-major order or nested by its shape",
    },
    "MetadataTensor": _object(
        ["name", "datatype", "shape"],
        {
            "name": _STRING,
            "datatype": {"type": "string", "enum": list(DATATYPES)},
            "shape": {**_SHAPE, "description": "-1 marks a dimension of any size"},
            "parameters": _ref("Parameters"),
        },
    ),
    "MetadataServerResponse": _object(
        ["name", "version", "extensions"],
        {"name": _STRING, "version": _STRING, "extensions": {"type": "array", "items": _STRING}},
    ),
    "MetadataModelResponse": _object(
        ["name", "platform"],
        {
            "name": _STRING,
            "versions": {"type": "array", "items": _STRING},
            "platform": _STRING,
            "inputs": {"type": "array", "items": _ref("MetadataTensor")},
            "outputs": {"type": "array", "items": _ref("MetadataTensor")},
            "parameters": _ref("Parameters"),
            "state": {
                "type": "string",
                "enum": ["UNAVAILABLE", "LOADING", "READY", "UNLOADING", "FAILED"],
            },
            "reason": _STRING,
        },
    ),
    # A request's input and a response's output are the same tensor object.
    "RequestInput": _TENSOR,
    "RequestOutput": _object(["name"], {"name": _STRING, "parameters": _ref("Parameters")}),
    "InferenceRequest": _object(
        ["inputs"],
        {
            "id": _STRING,
            "parameters": _ref("Parameters"),
            "inputs": {"type": "array", "items": _ref("RequestInput")},
            "outputs": {"type": "array", "items": _ref("RequestOutput")},
        },
    ),
    "ResponseOutput": _TENSOR,
    "InferenceResponse": _object(
        ["model_name", "outputs"],
        {
            "model_name": _STRING,
            "model_version": _STRING,
            "id": _STRING,
            "parameters": _ref("Parameters"),
            "outputs": {"type": "array", "items": _ref("ResponseOutput")},
        },
    ),
    "LiveResponse": _object(["live"], {"live": _BOOL, "error": _REASON}),
    "ReadyResponse": _object(["ready"], {"ready": _BOOL, "error": _REASON}),
    "ModelReadyResponse": _object(
        ["name", "ready"], {"name": _STRING, "ready": _BOOL, "error": _REASON}
    ),
    "RepositoryIndexRequest": _object(
        [], {"ready": {"type": "boolean", "description": "list READY models only"}}
    ),
    "RepositoryIndexResponse": {
        "type": "array",
        "items": _object(
            ["name", "state", "reason"],
            {"name": _STRING, "version": _STRING, "state": _STRING, "reason": _STRING},
        ),
    },
    "Statistics": _object(
        ["model_stats"],
        {"model_stats": {"type": "array", "items": {"type": "object"}}},
        description="Triton's statistics extension",
    ),
    "ModelConfig": {
        "type": "object",
        "additionalProperties": True,
        "description": "the model's configuration, in Triton's shape",
    },
    "GenerateRequest": _object(
        ["text_input"],
        {"text_input": _STRING, "parameters": _ref("Parameters")},
        additionalProperties=True,
    ),
    "GenerateResponse": _object(
        ["model_name"],
        {"text_output": _STRING, "model_name": _STRING, "model_version": _STRING},
        additionalProperties=True,
    ),
    "TraceSettings": {
        "type": "object",
        "additionalProperties": True,
        "description": "Triton's trace settings: trace_level, trace_rate, trace_count, "
        "log_frequency (each a string or a list of strings; null goes back to the default)",
    },
    "SharedMemoryStatus": {
        "type": "array",
        "items": _object(
            ["name", "key", "offset", "byte_size"],
            {"name": _STRING, "key": _STRING, "offset": _COUNT, "byte_size": _COUNT},
        ),
        "description": "the registered system shared-memory regions (Triton's document)",
    },
    "SharedMemoryRegister": _object(
        ["key", "byte_size"],
        {"key": _STRING, "offset": _COUNT, "byte_size": _COUNT},
        description="the POSIX shared-memory object (shm_open's name) and the part of it "
        "to register",
    ),
    "LogSettings": {
        "type": "object",
        "additionalProperties": True,
        "description": "Triton's log settings: log_info, log_warning, log_error, "
        "log_verbose_level, log_format",
    },
    "V1Request": {
        "type": "object",
        "properties": {
            "instances": {"type": "array", "items": _ANY},
            "inputs": {"type": "array", "items": _ANY},
        },
        "description": "rows (lists), objects by feature name, or strings, under "
        "instances or inputs",
    },
    "V1Predictions": _object(["predictions"], {"predictions": {"type": "array", "items": _ANY}}),
    "V1Explanations": _object(["explanations"], {"explanations": {"type": "object"}}),
    "V1Alive": _object(["status"], {"status": _STRING}),
    "V1Models": _object(["models"], {"models": {"type": "array", "items": _STRING}}),
    "V1ModelReady": _object(["name", "ready"], {"name": _STRING, "ready": _BOOL}),
    "FeedbackRequest": _object(
        ["request", "response", "reward"],
        {
            "request": _ref("InferenceRequest"),
            "response": _ref("InferenceResponse"),
            "reward": {"type": "number"},
            "truth": _ANY,
        },
    ),
}


def tensor_schema(tensor: dict[str, Any], output: bool = False) -> Schema:
    """A ``RequestInput`` (``ResponseOutput`` when ``output``) narrowed to one tensor of a
    model's metadata (``{"name", "datatype", "shape"}``): name and datatype fixed, the shape
    an array of exactly its rank (OpenAPI 3.0 has no per-position items: the fixed sizes are
    in the description and the example), the data typed by the datatype."""
    name, datatype = str(tensor.get("name", "")), str(tensor.get("datatype", ""))
    shape = declared_shape(tensor)
    scalar = _SCALAR_BY_DATATYPE.get(datatype, _ANY)
    shape_schema: Schema = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0},
        "description": f"declared {shape}: -1 is a dimension of any size",
        "example": example_shape(shape),
    }
    if shape:
        shape_schema["minItems"] = shape_schema["maxItems"] = len(shape)
    properties: dict[str, Schema] = {
        "name": {"type": "string", "enum": [name]},
        "shape": shape_schema,
        "datatype": {"type": "string", "enum": [datatype]} if datatype else _STRING,
        "parameters": _ref("Parameters"),
        "data": {"type": "array", "items": {"anyOf": [scalar, {"type": "array", "items": _ANY}]}},
    }
    required = ["name", "shape", "datatype", "data"]
    return _object(required, properties, title=f"{'output' if output else 'input'} {name}")


def declared_shape(tensor: dict[str, Any]) -> list[int]:
    """The metadata's shape, read leniently: a runtime's own ``metadata()`` may say
    anything, and a document must still come out (what is not a size counts as -1)."""
    shape = tensor.get("shape")
    if not isinstance(shape, list | tuple):
        return []
    return [d if isinstance(d, int) and not isinstance(d, bool) else -1 for d in shape]


def example_shape(shape: list[int]) -> list[int]:
    """A shape a request may declare for a metadata shape: one row where any size goes."""
    return [1 if d < 0 else d for d in shape] or [1]


def example_tensor(tensor: dict[str, Any]) -> dict[str, Any] | None:
    """An input tensor matching the metadata's, zero-filled (what Swagger UI's "Try it out"
    starts from); None for one too large to show."""
    datatype = str(tensor.get("datatype", "FP64"))
    shape = example_shape(declared_shape(tensor))
    count = 1
    for size in shape:
        count *= size
    if count > EXAMPLE_ELEMENTS:
        return None
    zero: Any = {"BOOL": False, "BYTES": ""}.get(datatype, 0)
    return {"name": str(tensor.get("name", "")), "shape": shape, "datatype": datatype,
            "data": [zero] * count}  # fmt: skip
