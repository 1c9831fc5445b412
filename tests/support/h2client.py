"""Test clients for the builtin HTTP/2 gRPC server: an ``h2`` client connection and a
raw frame connection, both checked by a ``FlowAudit`` (shared by test_grpc_http2 and
test_http2_hostile)."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Self

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
from h2.settings import SettingCodes

from tests.support import Server
from tests.support.h2frames import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE_SETTING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    TIMEOUT,
    FlowAudit,
    Frame,
    FrameReader,
    Reply,
    echo_typed,
    frame,
    grpc_frame,
    request_headers,
    typed_output,
    window_update,
)


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


def assert_serving(server: Server) -> None:
    with Client(server.grpc_port) as client:
        assert typed_output(client.call(echo_typed(41)).response()) == [41]
