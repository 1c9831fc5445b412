"""Hand-made HTTP/2 for the gRPC wire tests: frame and error codes, gRPC messages for the
echo model, frames and a frame reader, the flow-control audit every test connection runs,
and what came back on a stream (the clients are in ``tests.support.h2client``)."""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import hpack

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, CANCEL, COMPRESSION_ERROR = 1, 3, 6, 8, 9
INITIAL_WINDOW_SIZE_SETTING = 0x4

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384  # neither client here raises SETTINGS_MAX_FRAME_SIZE
TIMEOUT = 10.0  # any single wait on the server; nothing in this file should come close

SERVICE = b"/inference.GRPCInferenceService/"
INFER = SERVICE + b"ModelInfer"
OK, DEADLINE_EXCEEDED, NOT_FOUND, UNIMPLEMENTED, INTERNAL = 0, 4, 5, 12, 13


# -- messages ----------------------------------------------------------------------------
def grpc_frame(message: bytes, compressed: int = 0) -> bytes:
    return bytes((compressed,)) + len(message).to_bytes(4, "big") + message


def echo_raw(payload: bytes) -> bytes:
    """ModelInfer for the echo model: UINT8 ``a`` sent raw (and echoed back raw)."""
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="a", datatype="UINT8", shape=[len(payload)])
    request.raw_input_contents.append(payload)
    return request.SerializeToString()


def echo_typed(value: int, sleep: float = 0.0, mark: Path | None = None) -> bytes:
    """ModelInfer for the echo model: INT32 ``a`` = [value]; the model may sleep first."""
    request = pb.ModelInferRequest(model_name="echo")
    if mark is not None:
        tensor = request.inputs.add(name="mark", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(str(mark).encode())
    if sleep:
        tensor = request.inputs.add(name="sleep", datatype="FP64", shape=[1])
        tensor.contents.fp64_contents.append(sleep)
    request.inputs.add(name="a", datatype="INT32", shape=[1]).contents.int_contents.append(value)
    return request.SerializeToString()


def request_headers(
    path: bytes = INFER, content_type: bytes | None = b"application/grpc", extra: Iterable = ()
) -> list[tuple[bytes, bytes]]:
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path)]
    headers.append((b":authority", b"localhost"))
    if content_type is not None:
        headers.append((b"content-type", content_type))
    return [*headers, (b"te", b"trailers"), *extra]


# -- frames ------------------------------------------------------------------------------
@dataclass
class Frame:
    kind: int
    flags: int
    stream_id: int
    length: int
    payload: bytes  # empty for DATA when the reader does not keep data


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    head = struct.pack(">I", len(payload))[1:] + bytes((kind, flags))
    return head + struct.pack(">I", stream_id) + payload


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


class FrameReader:
    """Splits a byte stream into frames (after ``skip`` bytes of preface)."""

    def __init__(self, skip: int = 0, keep_data: bool = True) -> None:
        self.buffer = bytearray()
        self.skip = skip
        self.keep_data = keep_data  # False: DATA payloads are dropped (memory)

    def feed(self, data: bytes) -> list[Frame]:
        if self.skip:
            cut = min(self.skip, len(data))
            data, self.skip = data[cut:], self.skip - cut
        self.buffer += data
        frames, pos, buffer = [], 0, self.buffer
        while len(buffer) - pos >= 9:
            length = int.from_bytes(buffer[pos : pos + 3], "big")
            if len(buffer) - pos < 9 + length:
                break
            kind, flags = buffer[pos + 3], buffer[pos + 4]
            stream_id = int.from_bytes(buffer[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            if kind == DATA and not self.keep_data:
                payload = b""
            else:
                payload = bytes(buffer[pos + 9 : pos + 9 + length])
            frames.append(Frame(kind, flags, stream_id, length, payload))
            pos += 9 + length
        del buffer[:pos]
        return frames


class FlowAudit:
    """What the server may send: every DATA frame within the windows the client granted,
    no frame longer than the client's SETTINGS_MAX_FRAME_SIZE."""

    def __init__(self, initial_window: int) -> None:
        self.initial_window = initial_window
        self.granted: dict[int, int] = defaultdict(int)  # WINDOW_UPDATE increments sent
        self.consumed: dict[int, int] = defaultdict(int)  # DATA bytes (padding included)

    def sent(self, frames: Iterable[Frame]) -> None:
        for f in frames:
            if f.kind == WINDOW_UPDATE:
                self.granted[f.stream_id] += int.from_bytes(f.payload, "big") & 0x7FFFFFFF

    def received(self, frames: Iterable[Frame]) -> None:
        for f in frames:
            assert f.length <= DEFAULT_MAX_FRAME, (
                f"the server sent a frame of type {f.kind} with {f.length} bytes, over "
                f"the client's SETTINGS_MAX_FRAME_SIZE of {DEFAULT_MAX_FRAME}"
            )
            if f.kind != DATA:
                continue
            for stream_id, initial in ((0, DEFAULT_WINDOW), (f.stream_id, self.initial_window)):
                self.consumed[stream_id] += f.length
                allowed = initial + self.granted[stream_id]
                assert self.consumed[stream_id] <= allowed, (
                    f"the server sent {self.consumed[stream_id]} bytes of DATA on stream "
                    f"{stream_id} whose window allowed {allowed}"
                )


@dataclass
class Reply:
    """What came back on one stream."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    ended: bool = False
    reset: int | None = None

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None

    def metadata(self) -> dict[bytes, bytes]:
        """Trailers, or the headers of a trailers-only response."""
        return dict(self.trailers or self.headers)

    @property
    def status(self) -> int:
        assert dict(self.headers).get(b":status") == b"200", self.headers
        return int(self.metadata()[b"grpc-status"])

    @property
    def message(self) -> str:
        return unquote(self.metadata().get(b"grpc-message", b"").decode("ascii"))

    def response(self) -> pb.ModelInferResponse:
        assert self.status == OK, (self.status, self.message)
        data = bytes(self.data)
        assert data[0] == 0, "the response message is flagged compressed"
        assert int.from_bytes(data[1:5], "big") == len(data) - 5, "not exactly one message"
        return pb.ModelInferResponse.FromString(data[5:])


def raw_output(response: pb.ModelInferResponse, name: str = "a") -> bytes:
    names = [output.name for output in response.outputs]
    return response.raw_output_contents[names.index(name)]


def typed_output(response: pb.ModelInferResponse, name: str = "a") -> list[int]:
    (output,) = [output for output in response.outputs if output.name == name]
    return list(output.contents.int_contents)


def goaway(frames: list[Frame]) -> tuple[int, int]:
    """(last stream id, error code) of the one GOAWAY among ``frames``."""
    (payload,) = [f.payload for f in frames if f.kind == GOAWAY]
    last_stream, code = struct.unpack(">II", payload[:8])
    return last_stream & 0x7FFFFFFF, code


def hpack_decode(block: bytes) -> list[tuple[bytes, bytes]]:
    """A header block as an independent HPACK decoder reads it; every helper of ours
    encodes "without indexing", so nothing may enter the decoder's dynamic table."""
    decoder = hpack.Decoder()
    decoder.max_header_list_size = 2**20
    headers = decoder.decode(block, raw=True)
    assert len(decoder.header_table.dynamic_entries) == 0
    return headers
