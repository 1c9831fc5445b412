"""Which message ``ModelStreamInfer`` answers with: Triton's or MLServer's.

Both protocols serve ``/inference.GRPCInferenceService/ModelStreamInfer`` at the same path
but disagree on its response: Triton's ``grpc_service.proto`` streams
``ModelStreamInferResponse`` (``error_message`` = 1, ``infer_response`` = 2, a request's
error is a message and the stream goes on), MLServer's ``dataplane.proto`` streams bare
``ModelInferResponse`` messages (an error ends the call with its gRPC status). Neither
parses the other's, so each call is answered in one of them, chosen by the server's
``grpc_stream_response`` setting:

- ``triton`` / ``mlserver``: always that one;
- ``auto`` (the default): by the call's first request and its model. Triton's clients
  (tritonclient in Python and C++, perf_analyzer) always send tensors as
  ``raw_input_contents`` (field 7); MLServer's converters and its documentation's
  examples send typed ``contents``, and stream to MLServer custom runtimes (``MLModel``
  subclasses). A first request with typed contents and no raw contents, to a model whose
  runtime is an MLModel (or to no model the server knows, whose error then ends the call
  as MLServer's does), gets MLServer's message; any other, Triton's: a client of
  inferpool's own runtimes keeps the message it has always had. The whole call keeps the
  choice of its first request.
"""

from __future__ import annotations

from inferpool.protocol.protowire import scan_fields

TRITON = "triton"
MLSERVER = "mlserver"
AUTO = "auto"

# ModelInferRequest: inputs (5), raw_input_contents (7); InferInputTensor: contents (5).
_INPUTS, _RAW = 5, 7


def speaks_mlserver(setting: str, first_request: bytes, mlmodel: bool | None) -> bool:
    """Whether a call answers with MLServer's bare ModelInferResponse (the module's rule).
    ``mlmodel``: the first request's model is an MLServer custom runtime (None: no model
    the server knows)."""
    if setting != AUTO:
        return setting == MLSERVER
    if mlmodel is False:
        return False
    try:
        fields = scan_fields(first_request, (_INPUTS, _RAW))
        if _RAW in fields or _INPUTS not in fields:
            return False
        # The last input's own fields: typed contents (5) means an MLServer-style request.
        return _INPUTS in scan_fields(fields[_INPUTS], (_INPUTS,))
    except ValueError:
        return False  # routing reports the malformed request in the call's message


def response_message(body: bytes, mlserver: bool) -> bytes:
    """One answer's serialized message: ``body`` (a ModelInferResponse) as it is for
    MLServer, wrapped as a ModelStreamInferResponse's ``infer_response`` for Triton."""
    return body if mlserver else length_delimited(2, body)


def stream_error(message: str) -> bytes:
    """A serialized ModelStreamInferResponse carrying ``error_message`` (Triton's)."""
    return length_delimited(1, message.encode())


def length_delimited(number: int, value: bytes) -> bytes:
    """A length-delimited protobuf field: its tag, its length (a varint), its bytes."""
    head = bytearray((number << 3 | 2,))
    length = len(value)
    while length > 0x7F:
        head.append(length & 0x7F | 0x80)
        length >>= 7
    head.append(length)
    return bytes(head) + value
