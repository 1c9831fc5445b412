"""An MLflow model signature as V2 metadata, and requests checked against it.

MLflow's column types map to V2 datatypes; the types V2 has no datatype for (``string``,
``binary``, ``datetime``, arrays and objects) become BYTES tagged with the content type
that decodes them, so no type information is lost. Every tensor carries the content type
MLServer's MLflow runtime gives it (``np`` for numbers and for tensor-based signatures,
``pd_json`` for nested columns), a column has MLServer's shape ``[-1, 1]``, and the
model's own content type (``model_content_type``) is MLServer's too. Reads schema objects
by their attributes, so this module never imports mlflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.tabular import is_dataframe

# MLflow DataType name → (V2 datatype, content type), as MLServer's MLflow runtime says.
COLUMN_TYPES: dict[str, tuple[str, str]] = {
    "boolean": ("BOOL", "np"),
    "integer": ("INT32", "np"),
    "long": ("INT64", "np"),
    "float": ("FP32", "np"),
    "double": ("FP64", "np"),
    "string": ("BYTES", "str"),
    "binary": ("BYTES", "base64"),
    "datetime": ("BYTES", "datetime"),
}
# Arrays, objects and maps of a column travel as JSON documents.
NESTED_TYPE = ("BYTES", "pd_json")
# A column's shape: one value per row.
COLUMN_SHAPE = [-1, 1]


def is_tensor_schema(schema: Any) -> bool:
    return schema is not None and schema.is_tensor_spec()


def specs_of(schema: Any, prefix: str) -> list[TensorSpec]:
    """The V2 tensors of an MLflow input or output schema (empty for no schema)."""
    if schema is None:
        return []
    return [_spec(item, f"{prefix}-{i}") for i, item in enumerate(schema.inputs)]


def _spec(item: Any, default_name: str) -> TensorSpec:
    name = item.name if item.name is not None else default_name
    if hasattr(item, "shape"):  # a TensorSpec: a numpy dtype and a shape
        datatype = datatype_of(np.empty(0, dtype=item.type))
        # Strings decode as str (MLflow enforces str, not bytes); the rest as MLServer's np.
        content_type = "str" if datatype == "BYTES" else "np"
        return TensorSpec(name, datatype, list(item.shape), {"content_type": content_type})
    type_name = getattr(item.type, "name", None)
    datatype, content_type = COLUMN_TYPES.get(type_name or "", NESTED_TYPE)
    parameters: dict[str, Any] = {"content_type": content_type}
    if not getattr(item, "required", True):
        parameters["optional"] = True
    return TensorSpec(name, datatype, list(COLUMN_SHAPE), parameters)


def model_content_type(schema: Any) -> str | None:
    """The model's request content type, as MLServer derives it from the input schema
    (``dict`` for named tensors, ``np`` for one unnamed tensor, ``pd`` for columns)."""
    if schema is None:
        return None
    if schema.is_tensor_spec():
        return "dict" if schema.has_input_names() else "np"
    return "pd"


def required_names(schema: Any) -> list[str]:
    return [i.name for i in schema.inputs if i.name is not None and getattr(i, "required", True)]


def check_names(model: str, given: Sequence[str], schema: Any) -> None:
    """A 400 for an input the signature does not name, or a required one missing."""
    if schema is None or not schema.has_input_names():
        return
    expected = schema.input_names()
    known = set(expected)
    unknown = [str(n) for n in given if str(n) not in known]
    if unknown:
        raise BadRequest(
            f"model '{model}' has no input {', '.join(repr(n) for n in unknown)}; "
            f"expected: {', '.join(expected)}"
        )
    present = {str(n) for n in given}
    missing = [n for n in required_names(schema) if n not in present]
    if missing:
        raise BadRequest(
            f"model '{model}' is missing input {', '.join(repr(n) for n in missing)}; "
            f"expected: {', '.join(expected)}"
        )


def check_payload(model: str, payload: Any, schema: Any) -> None:
    """Check a DataFrame's columns, a dict's keys or an array's shape against the schema."""
    if schema is None:
        return
    if is_dataframe(payload):
        check_names(model, list(payload.columns), schema)
    elif isinstance(payload, dict):
        check_names(model, list(payload), schema)
    elif is_tensor_schema(schema) and len(schema.inputs) == 1:
        _check_shape(model, np.shape(payload), list(schema.inputs[0].shape))


def _check_shape(model: str, shape: tuple[int, ...], expected: list[int]) -> None:
    fits = len(shape) == len(expected) and all(
        e == -1 or e == s for s, e in zip(shape, expected, strict=True)
    )
    if not fits:
        raise BadRequest(f"model '{model}' expects an input of shape {expected}, got {list(shape)}")
