"""The codec errors of ``mlserver.codecs.errors`` (all answered 400)."""

from __future__ import annotations

from typing import Any

from inferpool.mlserver.errors import MLServerError
from inferpool.mlserver.types import RequestInput


class CodecNotFound(MLServerError):
    def __init__(
        self,
        name: str | None = None,
        payload_type: str | None = None,
        is_input: bool = False,
        is_request: bool = False,
    ) -> None:
        detail = ""
        if name:
            detail = f"with name '{name}'"
            if payload_type:
                detail += f" and type {payload_type}"
        elif payload_type:
            detail = f"with type {payload_type}"
        side = "input" if is_input else "output"
        kind = ("request" if is_input else "response") if is_request else "field"
        super().__init__(f"Codec not found for {side} {kind} {detail}")


class CodecError(MLServerError):
    def __init__(self, msg: str) -> None:
        super().__init__(f"There was an error encoding / decoding the payload: {msg}")


class OutputNotFound(MLServerError):
    def __init__(self, output_idx: int, output_type: type, output_hints: list[Any]) -> None:
        expected = ", ".join(f"'{hint}'" for hint in output_hints)
        super().__init__(
            f"Unexpected output value at position '{output_idx}' ({output_type}). "
            f"Expected outputs are {expected} outputs."
        )


class InputsNotFound(MLServerError):
    def __init__(self, inputs: list[RequestInput], input_hints: dict[str, Any]) -> None:
        names = ", ".join(f"'{tensor.name}'" for tensor in inputs)
        available = ", ".join(f"'{name}'" for name in input_hints)
        super().__init__(f"Input {names} was not found. Available inputs are {available}.")
