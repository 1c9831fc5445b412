"""Logs of a running server: --log-format json, per-logger levels, and a runtime's records
(logged in a worker, or in the server with --workers 0) written by the server's handler
with the worker's index and the request's id, whole lines only, even in a flood."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, write_custom_model

SOURCE = """
import logging

import inferpool

log = logging.getLogger("chatty")


class Chatty(inferpool.Runtime):
    accepts = "dict"

    def load(self):
        logging.getLogger("chatty.debug").debug("loaded, said at debug")
        logging.getLogger("chatty.quiet").warning("silenced below error")

    def predict(self, payload, outputs):
        lines = int(payload["lines"].reshape(-1)[0])
        for n in range(lines):
            log.info("line %d of %d", n, lines)
        log.warning("predicted", extra={"rows": lines})
        if lines == 0:
            try:
                raise ZeroDivisionError("on purpose")
            except ZeroDivisionError:
                log.exception("a traceback")
        return {"lines": payload["lines"]}
"""
TENSOR = {"name": "lines", "datatype": "INT64", "shape": [1]}
FLOOD = 10_000
# The ``worker`` field a runtime's records may carry, by server ("-": the server process).
WORKERS: dict[str, set[str]] = {}


@pytest.fixture(
    scope="module",
    params=[pytest.param((0, "grpcio"), id="w0-grpcio"), pytest.param((2, "builtin"), id="w2")],
)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    workers, implementation = request.param
    root = tmp_path_factory.mktemp("logs")
    write_custom_model(root / "chatty", SOURCE, "Chatty", inputs=[TENSOR], outputs=[TENSOR])
    args = ["--workers", str(workers), "--grpc-implementation", implementation]
    args += ["--log-format", "json", "--log-levels", "chatty.debug=debug,chatty.quiet=error"]
    with Server(root, *args) as running:
        running.wait_ready()
        WORKERS[running.url] = {"-"} if workers == 0 else {str(n) for n in range(workers)}
        yield running


def records(server: Server) -> list[dict[str, Any]]:
    """Every line the server wrote, each one a JSON object (else the test fails). A line
    still being written as the log is read (no newline yet) is left for the next read."""
    found = []
    text = server.output()
    for line in text[: text.rfind("\n") + 1].splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    return found


def wait_for_record(server: Server, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [record for record in records(server) if match(record)]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no such record in:\n{server.output()}")


def rest_infer(server: Server, lines: int, request_id: str, timeout: float = 30) -> None:
    body = {"inputs": [{**TENSOR, "data": [lines]}]}
    response = httpx.post(
        f"{server.url}/v2/models/chatty/infer",
        json=body,
        headers={"x-request-id": request_id},
        timeout=timeout,
    )
    assert response.status_code == 200, response.text


def test_every_line_is_a_json_object_with_the_server_fields(server: Server) -> None:
    started = wait_for_record(server, lambda r: r["message"].startswith("REST on"))
    assert started["logger"] == "inferpool" and started["level"] == "INFO"
    assert started["worker"] == "-" and started["request_id"] == "-"
    assert started["time"].endswith("Z")


def test_a_runtime_record_names_its_worker_and_request(server: Server) -> None:
    request_id = f"rest-{uuid.uuid4()}"
    rest_infer(server, 1, request_id)
    said = wait_for_record(
        server, lambda r: r["message"] == "line 0 of 1" and r["request_id"] == request_id
    )
    assert said["logger"] == "chatty" and said["level"] == "INFO"
    assert said["worker"] in WORKERS[server.url]
    extra = wait_for_record(
        server, lambda r: r["message"] == "predicted" and r["request_id"] == request_id
    )
    assert extra["rows"] == 1 and extra["worker"] == said["worker"]


def test_a_grpc_request_id_reaches_the_runtime_records(server: Server) -> None:
    request_id = f"grpc-{uuid.uuid4()}"
    request = pb.ModelInferRequest(model_name="chatty")
    tensor = request.inputs.add(name="lines", datatype="INT64", shape=[1])
    tensor.contents.int64_contents.append(2)
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        stub.ModelInfer(request, metadata=[("x-request-id", request_id)], timeout=30)
    said = wait_for_record(
        server, lambda r: r["message"] == "line 1 of 2" and r["request_id"] == request_id
    )
    assert said["worker"] in WORKERS[server.url]


def test_levels_per_logger_over_the_global_one(server: Server) -> None:
    # chatty.debug=debug says more than the global info; chatty.quiet=error silences.
    debug = wait_for_record(server, lambda r: r["message"] == "loaded, said at debug")
    assert debug["level"] == "DEBUG" and debug["worker"] in WORKERS[server.url]
    said = [record["message"] for record in records(server)]
    assert "silenced below error" not in said


def test_a_traceback_is_a_field_of_its_line(server: Server) -> None:
    request_id = f"exc-{uuid.uuid4()}"
    rest_infer(server, 0, request_id)
    said = wait_for_record(
        server, lambda r: r["message"] == "a traceback" and r["request_id"] == request_id
    )
    assert said["level"] == "ERROR"
    assert "ZeroDivisionError: on purpose" in said["exc_info"]
    assert said["exc_info"].startswith("Traceback (most recent call last)")


def test_a_flood_of_records_leaves_whole_lines_and_a_serving_server(server: Server) -> None:
    flood = threading.Thread(target=rest_infer, args=(server, FLOOD, f"flood-{uuid.uuid4()}", 60))
    flood.start()
    try:
        if WORKERS[server.url] != {"-"}:  # (--workers 0: the model runs on the server's loop)
            # While a worker floods it, the server still answers at once.
            wait_for_record(server, lambda r: r["message"] == f"line 0 of {FLOOD}")
            started = time.monotonic()
            assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
            assert time.monotonic() - started < 1.0
    finally:
        flood.join()
    rest_infer(server, 1, f"after-{uuid.uuid4()}", timeout=10)
    wait_for_record(server, lambda r: r["message"] == "predicted" and r["rows"] == FLOOD)
    found = records(server)  # every line parses: none was cut or interleaved
    said = sum(1 for r in found if r["message"].endswith(f" of {FLOOD}"))
    dropped = sum(
        int(r["message"].split()[0])
        for r in found
        if r["logger"] == "inferpool.logs" and "dropped" in r["message"]
    )
    # Whatever the server could not read in time was dropped, and counted.
    assert said + dropped == FLOOD
    assert said > 0


def test_a_bad_level_is_refused_at_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "inferpool", "serve", str(tmp_path)]
    result = subprocess.run(
        [*command, "--log-levels", "chatty=loud"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "unknown log level 'loud'" in result.stderr
