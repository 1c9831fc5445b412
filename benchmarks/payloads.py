"""Request payloads: the exact bytes each scenario sends, built once, plus expected outputs.

A payload is what a load generator replays unchanged (wrk posts the body, h2load posts the
gRPC frame), so the bytes verified before a run are the bytes measured. This module also
decodes V2 responses (JSON, Triton binary tensors, gRPC typed or raw) back to numpy.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np

from benchmarks import shm_payload
from benchmarks.shm_payload import SharedRegion

# rest-json17: the JSON Python clients write (tritonclient's HTTP client with binary_data
# off, MLServer's codecs): each float32 through a Python float, 17 significant digits.
PROTOCOLS = ("rest-json", "rest-json17", "rest-binary", "grpc-typed", "grpc-raw")
GRPC_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
INPUT_NAME = "input-0"
BINARY_HEADER = "Inference-Header-Content-Length"

# V2 datatype -> numpy dtype, and the ModelInferResponse `contents` field holding it.
DATATYPES: dict[str, tuple[str, str]] = {
    "BOOL": ("bool", "bool_contents"),
    "INT8": ("int8", "int_contents"),
    "INT16": ("int16", "int_contents"),
    "INT32": ("int32", "int_contents"),
    "INT64": ("int64", "int64_contents"),
    "UINT8": ("uint8", "uint_contents"),
    "UINT16": ("uint16", "uint_contents"),
    "UINT32": ("uint32", "uint_contents"),
    "UINT64": ("uint64", "uint64_contents"),
    "FP16": ("float16", "fp32_contents"),
    "FP32": ("float32", "fp32_contents"),
    "FP64": ("float64", "fp64_contents"),
}


@dataclass(frozen=True)
class Payload:
    """One request, ready to replay: transport, path, headers, body and what must come back."""

    model: str
    batch: int
    protocol: str
    path: str
    headers: dict[str, str]
    body: bytes
    expected: np.ndarray = field(compare=False)
    # grpc-shm: the region the body names, registered with each server before its check.
    region: SharedRegion | None = field(default=None, compare=False)

    @property
    def transport(self) -> str:
        return "grpc" if self.protocol.startswith("grpc") else "rest"


def batch_rows(data: np.ndarray, batch: int) -> np.ndarray:
    """The first ``batch`` rows of ``data``, cycling when it has fewer rows (iris has 150)."""
    index = np.arange(batch) % data.shape[0]
    return np.ascontiguousarray(data[index], dtype=np.float32)


def grpc_frame(message: bytes) -> bytes:
    """gRPC length-prefixed message: 1 byte compressed flag (0), 4 bytes big-endian length."""
    return struct.pack(">BI", 0, len(message)) + message


def grpc_unframe(frame: bytes) -> bytes:
    """Inverse of :func:`grpc_frame` for a single uncompressed message."""
    flag, length = struct.unpack(">BI", frame[:5])
    if flag != 0 or len(frame) != 5 + length:
        raise ValueError(f"not a single uncompressed gRPC message ({len(frame)} bytes)")
    return frame[5:]


def _input_json(x: np.ndarray) -> dict[str, object]:
    return {"name": INPUT_NAME, "shape": list(x.shape), "datatype": "FP32"}


def rest_json_body(x: np.ndarray, through_python: bool = False) -> tuple[dict[str, str], bytes]:
    # Shortest float32 repr (as a float32 client would write it), not the float64 expansion
    # that doubles the body: 0.1f is "0.1", not "0.10000000149011612". ``through_python``:
    # that expansion, as ``ndarray.tolist()`` gives it (rest-json17).
    data = x.ravel().tolist() if through_python else [float(str(v)) for v in x.ravel()]
    inputs = [{**_input_json(x), "data": data}]
    body = json.dumps({"inputs": inputs}, separators=(",", ":")).encode()
    return {"Content-Type": "application/json"}, body


def rest_binary_body(x: np.ndarray) -> tuple[dict[str, str], bytes]:
    """Triton's binary tensor extension: a JSON header, then the raw little-endian tensor."""
    raw = x.astype("<f4").tobytes()
    tensor = {**_input_json(x), "parameters": {"binary_data_size": len(raw)}}
    header = json.dumps({"inputs": [tensor]}, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/octet-stream", BINARY_HEADER: str(len(header))}
    return headers, header + raw


def grpc_request(model: str, x: np.ndarray, raw: bool) -> bytes:
    """A serialized ModelInferRequest (tritonclient ships the same `inference` messages)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=INPUT_NAME, datatype="FP32", shape=list(x.shape))
    if raw:
        request.raw_input_contents.append(x.astype("<f4").tobytes())
    else:
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request.SerializeToString()


def build_payload(
    model: str, batch: int, protocol: str, data: np.ndarray, expected: np.ndarray
) -> Payload:
    """The bytes for one (model, batch, protocol); ``data`` already holds ``batch`` rows."""
    if protocol in ("rest-json", "rest-json17"):
        headers, body = rest_json_body(data, through_python=protocol == "rest-json17")
    elif protocol == "rest-binary":
        headers, body = rest_binary_body(data)
    elif protocol in ("grpc-typed", "grpc-raw"):
        body = grpc_frame(grpc_request(model, data, raw=protocol == "grpc-raw"))
        headers = {"content-type": "application/grpc", "te": "trailers"}
    elif protocol == shm_payload.PROTOCOL:
        message, region = shm_payload.grpc_shm_request(model, data, INPUT_NAME)
        body, headers = grpc_frame(message), {"content-type": "application/grpc", "te": "trailers"}
        path = GRPC_INFER_PATH
        return Payload(model, batch, protocol, path, headers, body, expected, region)
    else:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
    path = GRPC_INFER_PATH if protocol.startswith("grpc") else f"/v2/models/{model}/infer"
    return Payload(model, batch, protocol, path, headers, body, expected)


def decode_rest_response(headers: dict[str, str], body: bytes) -> np.ndarray:
    """The first output of a REST V2 response (JSON, or JSON header + binary tensors)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    header_len = int(lowered.get(BINARY_HEADER.lower(), len(body)))
    document = json.loads(body[:header_len])
    if "outputs" not in document or not document["outputs"]:
        raise ValueError(f"response has no outputs: {body[:200]!r}")
    output = document["outputs"][0]
    dtype = np.dtype(DATATYPES[output["datatype"]][0])
    size = (output.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        # Binary outputs are laid out after the header in the order they are listed.
        offset = header_len
        return np.frombuffer(body[offset : offset + size], dtype=dtype.newbyteorder("<"))
    return np.asarray(output["data"], dtype=dtype).ravel()


def decode_grpc_response(message: bytes) -> np.ndarray:
    """The first output of a serialized ModelInferResponse, typed or raw."""
    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelInferResponse.FromString(message)
    if not response.outputs:
        raise ValueError("gRPC response has no outputs")
    output = response.outputs[0]
    dtype_name, contents_field = DATATYPES[output.datatype]
    if response.raw_output_contents:
        return np.frombuffer(
            response.raw_output_contents[0], dtype=np.dtype(dtype_name).newbyteorder("<")
        )
    return np.asarray(getattr(output.contents, contents_field), dtype=dtype_name)


def predictions_match(got: np.ndarray, expected: np.ndarray) -> bool:
    """Compare by value: exact labels, close scores, or labels where the server gave scores.

    Boosters predict positive-class probabilities while a server may return labels (or the
    other way round), so a binary score vector also matches its thresholded labels.
    """
    got = np.asarray(got).ravel()
    expected = np.asarray(expected).ravel()
    if got.shape != expected.shape:
        return False
    if np.allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-4, atol=1e-5):
        return True
    labels = (
        (expected > 0.5).astype(np.int64)
        if np.issubdtype(expected.dtype, np.floating)
        else expected
    )
    return bool(np.array_equal(got.astype(np.float64), labels.astype(np.float64)))
