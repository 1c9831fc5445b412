"""The REST wire format (V2 JSON, and Triton binary tensors): request bytes in, response bytes out.

``engine/worker/wire_formats.py`` maps ``Kind.REST`` to this module (a ``WireFormat``).
"""

from __future__ import annotations

from inferpool.errors import BadRequest
from inferpool.protocol import rest_json
from inferpool.protocol.binary import binary_outputs, split_binary_outputs
from inferpool.protocol.types import InferenceRequest, InferenceResponse


def decode(body: bytes, json_length: int | None) -> InferenceRequest:
    if json_length is None:
        return rest_json.decode_request(body)
    if not 0 <= json_length <= len(body):
        raise BadRequest(
            f"Inference-Header-Content-Length {json_length} is outside the body ({len(body)} bytes)"
        )
    view = memoryview(body)
    document = rest_json.parse_json_object(bytes(view[:json_length]), "JSON header")
    return rest_json.request_from_document(document, binary_tail=view[json_length:])


def encode(
    response: InferenceResponse, request: InferenceRequest, prefix: bytes = b""
) -> tuple[bytes, int | None]:
    """JSON, or JSON then binary outputs (and its length) when the request asks for them;
    ``prefix`` (a headers block) in front, in the same join: the outputs' arrays are
    copied once, straight from their buffers."""
    binary = binary_outputs(request, response.outputs)
    if not any(binary):
        document = rest_json.encode_response(response)
        return (prefix + document if prefix else document), None
    header, tail = split_binary_outputs(response.outputs, binary)
    document = rest_json.encode_response(response, header)
    return b"".join([prefix, document, *tail]), len(document)
