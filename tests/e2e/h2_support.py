"""Hand-made HTTP/2 for the gRPC wire tests: frames, an h2 client checked by a flow-control
audit, a raw frame connection, and replies (shared by test_grpc_http2 and test_http2_hostile)."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
from h2.settings import SettingCodes

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server

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


# -- the h2 client -----------------------------------------------------------------------
class SocketClient:
    """A test client over one socket, closed on leaving its ``with`` block."""

    sock: socket.socket
    eof = False

    def recv_once(self, timeout: float) -> bytes:
        """One read within ``timeout`` (TimeoutError past it); b"" once the server closed."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        finally:
            self.sock.settimeout(TIMEOUT)
        if not data:
            self.eof = True
        return data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Client(SocketClient):
    """An ``h2`` client connection over a blocking socket, checked by a ``FlowAudit``."""

    def __init__(self, port: int, auto_ack: bool = True, **settings: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        initial = {getattr(SettingCodes, key.upper()): value for key, value in settings.items()}
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values=initial)
        self.audit = FlowAudit(self.h2.local_settings.initial_window_size)
        self.tap_in = FrameReader(keep_data=False)
        self.tap_out = FrameReader(skip=len(PREFACE), keep_data=False)
        self.auto_ack = auto_ack
        self.replies: dict[int, Reply] = defaultdict(Reply)
        self.events: list[h2.events.Event] = []
        self.frames_in: list[Frame] = []
        self.eof = False
        self.h2.initiate_connection()
        self.flush()
        # The server's SETTINGS and connection WINDOW_UPDATE, before anything is sent.
        self.wait(lambda: self.count(h2.events.RemoteSettingsChanged))
        self.wait(lambda: self.h2.outbound_flow_control_window > DEFAULT_WINDOW)

    def count(self, kind: type) -> int:
        return sum(isinstance(event, kind) for event in self.events)

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.audit.sent(self.tap_out.feed(data))
            self.sock.sendall(data)

    def start(
        self, message: bytes | None, headers: list | None = None, raw_body: bytes | None = None
    ) -> int:
        """Open a stream with HEADERS and send the whole body (``message``, framed)."""
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, headers or request_headers())
        body = grpc_frame(message) if raw_body is None else raw_body
        self.send_body(stream_id, body)
        return stream_id

    def send_body(self, stream_id: int, body: bytes, end_stream: bool = True) -> None:
        """Send ``body`` as DATA as fast as the server's windows allow."""
        view, pos = memoryview(body), 0
        while pos < len(body):
            size = min(
                self.h2.local_flow_control_window(stream_id),
                self.h2.max_outbound_frame_size,
                len(body) - pos,
            )
            if size <= 0:  # wait for the server's WINDOW_UPDATE
                assert self.receive_some(), "no WINDOW_UPDATE came for a blocked body"
                continue
            last = pos + size == len(body)
            self.h2.send_data(stream_id, view[pos : pos + size], end_stream=end_stream and last)
            pos += size
            self.flush()
        if not body and end_stream:
            self.h2.end_stream(stream_id)
            self.flush()

    def receive_some(self, timeout: float = TIMEOUT) -> bool:
        """Read once from the socket and handle what arrived; False on timeout or EOF."""
        try:
            data = self.recv_once(timeout)
        except TimeoutError:
            return False
        if not data:
            return False
        frames = self.tap_in.feed(data)
        self.audit.received(frames)
        self.frames_in.extend(frames)
        for event in self.h2.receive_data(data):
            self.events.append(event)
            self.handle(event)
        self.flush()
        return True

    def handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.replies[event.stream_id].headers = event.headers
        elif isinstance(event, h2.events.DataReceived):
            self.replies[event.stream_id].data += event.data
            if self.auto_ack:
                self.ack(event)
        elif isinstance(event, h2.events.TrailersReceived):
            self.replies[event.stream_id].trailers = event.headers
        elif isinstance(event, h2.events.StreamEnded):
            self.replies[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.replies[event.stream_id].reset = event.error_code

    def ack(self, event: h2.events.DataReceived) -> None:
        self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)

    def wait(self, condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the server did not answer in time"
            if not self.receive_some(remaining):
                assert not self.eof, "the server closed the connection"

    def quiet(self, seconds: float) -> None:
        """Handle whatever arrives until nothing has for ``seconds``."""
        while self.receive_some(seconds):
            pass

    def reply(self, stream_id: int, timeout: float = TIMEOUT) -> Reply:
        self.wait(lambda: self.replies[stream_id].done, timeout)
        return self.replies[stream_id]

    def call(
        self,
        message: bytes,
        headers: list | None = None,
        raw_body: bytes | None = None,
        timeout: float = TIMEOUT,
    ) -> Reply:
        return self.reply(self.start(message, headers, raw_body), timeout)


# -- the raw client ----------------------------------------------------------------------
class RawConnection(SocketClient):
    """Hand-made frames; large windows granted up front so replies need no updates."""

    WINDOW = 1 << 24

    def __init__(self, port: int, handshake: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.handshake = handshake
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.reader = FrameReader()
        self.audit = FlowAudit(self.WINDOW)
        self.audit.granted[0] = self.WINDOW - DEFAULT_WINDOW
        self.frames: list[Frame] = []
        self.replies: dict[int, Reply] = defaultdict(Reply)
        self._block = b""  # a header block waiting for CONTINUATION
        self.eof = False
        if handshake:
            settings = struct.pack(">HI", INITIAL_WINDOW_SIZE_SETTING, self.WINDOW)
            self.send(
                PREFACE,
                frame(SETTINGS, 0, 0, settings),
                window_update(0, self.WINDOW - DEFAULT_WINDOW),
            )

    def send(self, *chunks: bytes) -> None:
        self.sock.sendall(b"".join(chunks))

    def block(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        return self.encoder.encode(headers)

    def read(self, timeout: float = TIMEOUT) -> bool:
        """Read and handle what arrives; False on EOF (or, with ``quiet``, on timeout)."""
        data = self.recv_once(timeout)
        if not data:
            return False
        frames = self.reader.feed(data)
        self.audit.received(frames)
        self.frames.extend(frames)
        for f in frames:
            self.handle(f)
        return True

    def handle(self, f: Frame) -> None:
        if f.kind == SETTINGS and not f.flags & ACK and self.handshake:
            with contextlib.suppress(OSError):  # the server may have closed already
                self.send(frame(SETTINGS, ACK, 0))
            return
        reply = self.replies[f.stream_id]
        if f.kind in (HEADERS, CONTINUATION):
            self._block += f.payload  # the server sends no padding or priority
            if f.kind == HEADERS:
                reply.ended = bool(f.flags & END_STREAM)
            if f.flags & END_HEADERS:
                headers = self.decoder.decode(self._block, raw=True)
                self._block = b""
                if reply.headers:
                    reply.trailers = headers
                else:
                    reply.headers = headers
        elif f.kind == DATA:
            reply.data += f.payload
            reply.ended = bool(f.flags & END_STREAM)
        elif f.kind == RST_STREAM:
            reply.reset = int.from_bytes(f.payload, "big")

    def quiet(self, seconds: float) -> None:
        """Handle whatever arrives until nothing has for ``seconds``."""
        try:
            while self.read(seconds):
                pass
        except TimeoutError:
            pass

    def read_until_closed(self, timeout: float = TIMEOUT) -> list[Frame]:
        deadline = time.monotonic() + timeout
        while not self.eof:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the server did not close the connection"
            self.read(remaining)
        return self.frames

    def reply(self, stream_id: int, timeout: float = TIMEOUT) -> Reply:
        deadline = time.monotonic() + timeout
        while not self.replies[stream_id].done:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the server did not answer in time"
            assert self.read(remaining), "the server closed the connection"
        return self.replies[stream_id]


def goaway(frames: list[Frame]) -> tuple[int, int]:
    """(last stream id, error code) of the one GOAWAY among ``frames``."""
    (payload,) = [f.payload for f in frames if f.kind == GOAWAY]
    last_stream, code = struct.unpack(">II", payload[:8])
    return last_stream & 0x7FFFFFFF, code


def assert_serving(server: Server) -> None:
    with Client(server.grpc_port) as client:
        assert typed_output(client.call(echo_typed(41)).response()) == [41]
