"""The OTLP/HTTP sink a ``-otel`` server's spans are exported to during a measurement."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.ports import HOST


class OtlpSink:
    """An OTLP/HTTP endpoint that takes every export and keeps only counts: what a
    ``-otel`` server's spans are sent to. A real collector would cost the machine's CPU
    beside the server; this costs a read per batch (512 spans, the SDK's default)."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", 0))
                sink.bytes += len(self.rfile.read(size))
                sink.exports += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.endpoint = f"http://{HOST}:{self._server.server_address[1]}/v1/traces"

    def env(self) -> dict[str, str]:
        """The OTEL_* variables that point a server's OTLP/HTTP exporter here."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint,
        }

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


_SINK: OtlpSink | None = None


def otlp_sink() -> OtlpSink:
    """The harness's one sink, started with the first ``-otel`` server."""
    global _SINK
    if _SINK is None:
        _SINK = OtlpSink()
    return _SINK
