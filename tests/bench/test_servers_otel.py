"""The ``-otel`` server profile: inferpool with --tracing, its spans exported over OTLP/HTTP
to the harness's sink."""

import time

import httpx
import pytest

from benchmarks.loadgen.base import Target
from benchmarks.otlp_sink import otlp_sink
from benchmarks.servers import ServerSpec, command, start
from tests.support.pool import sum_request, write_counting_model


def test_an_otel_suffix_turns_tracing_on(tmp_path):
    spec = ServerSpec.parse("inferpool-w2-grpcio-otel-base")
    assert spec.tracing and spec.base and spec.grpc_implementation == "grpcio"
    assert not ServerSpec.parse("inferpool-w2").tracing
    target = Target("127.0.0.1", 1, 2)
    assert (
        command(ServerSpec.parse("inferpool-w2-otel"), tmp_path, target, None, "inferpool")[-1]
        == "--tracing"
    )
    assert "--tracing" not in command(
        ServerSpec.parse("inferpool-w2"), tmp_path, target, None, "inferpool"
    )
    with pytest.raises(ValueError, match="unknown server"):
        ServerSpec.parse("mlserver-w2-otel")


def test_an_otel_server_exports_its_spans_to_the_sink(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # at once, not in 5 s
    repo = tmp_path / "repo"
    write_counting_model(repo, "sums", tmp_path / "calls.txt")
    sink = otlp_sink()
    before = sink.exports
    server = start(ServerSpec.parse("inferpool-w0-otel"), repo, ["sums"], tmp_path / "work")
    try:
        url = f"{server.http_base}/v2/models/sums/infer"
        assert httpx.post(url, json=sum_request([[1, 2, 3]], "a")).status_code == 200
        deadline = time.monotonic() + 10
        while sink.exports == before and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()
    assert sink.exports > before and sink.bytes > 0
