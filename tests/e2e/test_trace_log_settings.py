"""Triton's trace and logging extensions against live servers (2 workers, each gRPC
implementation, --tracing into an OTLP/HTTP receiver here, an admin token), with
tritonclient's HTTP and gRPC clients: the settings read and updated, a log level that
makes a worker's debug line appear and disappear, a trace rate of 0, a model's own
trace settings and a trace count that stop spans reaching the receiver, the admin token
guarding updates, and bad values refused (400, INVALID_ARGUMENT)."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import Server, write_custom_model
from tests.support.otlp import Received, exporter_env, http_receiver

pytestmark = pytest.mark.timeout(180)

TOKEN = "s3cret-admin"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
GRPC_ADMIN = {"authorization": f"Bearer {TOKEN}"}  # gRPC metadata keys are lower case
MARKERS = itertools.count(1000)

TALKER = """
import logging
import time

import numpy as np

from inferpool import Runtime

logger = logging.getLogger("talker")


class Talker(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        value = float(np.asarray(payload).ravel()[0])
        time.sleep(0.1)  # concurrent requests are spread over both workers
        logger.debug("talker-debug %s", value)
        logger.info("talker-info %s", value)
        return {"output-0": np.asarray(payload)}
"""


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Received]]:
    with http_receiver() as found:
        yield found


@pytest.fixture(scope="module", params=["builtin", "grpcio"])
def server(request, receiver, tmp_path_factory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("repo")
    write_custom_model(repository / "talker", TALKER, "Talker")
    flags = ["--workers", "2", "--grpc-implementation", request.param, "--tracing"]
    flags += ["--admin-token", TOKEN]
    endpoint, _ = receiver
    with Server(repository, *flags, env=exporter_env("http/protobuf", endpoint)) as running:
        running.wait_ready(timeout=90)
        yield running


@pytest.fixture
def http(server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture
def grpc_client(server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def infer(server: Server, value: float, traceparent: str | None = None) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP64", "data": [value]}]}
    headers = {"traceparent": traceparent} if traceparent else {}
    reply = httpx.post(
        f"{server.url}/v2/models/talker/infer", json=body, headers=headers, timeout=30
    )
    assert reply.status_code == 200, reply.text


def traceparent() -> tuple[int, str]:
    trace_id = random.getrandbits(128) | 1
    return trace_id, f"00-{trace_id:032x}-{random.getrandbits(64) | 1:016x}-01"


def test_v2_lists_the_extensions(server) -> None:
    extensions = httpx.get(f"{server.url}/v2").json()["extensions"]
    assert {"trace", "logging"} <= set(extensions)


def test_log_settings_read_and_updated_over_http_and_grpc(http, grpc_client) -> None:
    settings = http.get_log_settings()
    assert settings["log_info"] is True and settings["log_verbose_level"] == 0
    assert settings["log_format"] == "text"
    updated = http.update_log_settings({"log_verbose_level": 1}, headers=ADMIN)
    assert updated["log_verbose_level"] == 1
    seen = grpc_client.get_log_settings(as_json=True)["settings"]
    assert seen["log_verbose_level"] == {"uint32_param": 1}
    answer = grpc_client.update_log_settings(
        {"log_verbose_level": 0, "log_info": True}, headers=GRPC_ADMIN, as_json=True
    )
    assert answer["settings"]["log_verbose_level"] == {"uint32_param": 0}
    assert http.get_log_settings()["log_verbose_level"] == 0


def test_a_workers_debug_line_follows_the_log_level(server, http) -> None:
    """Debug lines of the model, predicted in the workers, appear once the level is raised
    (each worker got it: several requests reach both) and stop when it is lowered."""

    def send(count: int) -> list[float]:
        values = [float(next(MARKERS)) for _ in range(count)]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda value: infer(server, value), values))
        server.expect_lines([rf"talker-info {value}" for value in values], timeout=20)
        return values

    quiet = send(2)
    assert not re.search(rf"talker-debug ({'|'.join(map(str, quiet))})", server.output())
    http.update_log_settings({"log_verbose_level": 1}, headers=ADMIN)
    loud = send(8)
    output = server.expect_lines([rf"worker=\d.*talker-debug {value}" for value in loud])
    workers = set(re.findall(r"worker=(\d)[^\n]*talker-debug", output))
    assert workers == {"0", "1"}, workers  # both workers log at the new level
    http.update_log_settings({"log_verbose_level": 0}, headers=ADMIN)
    quiet = send(4)
    assert not re.search(rf"talker-debug ({'|'.join(map(str, quiet))})", server.output())


def test_the_log_format_changes_at_run_time(server, http) -> None:
    http.update_log_settings({"log_format": "json"}, headers=ADMIN)
    try:
        value = float(next(MARKERS))
        infer(server, value)
        output = server.expect_lines([rf'"message": ?"talker-info {value}"'], timeout=20)
        line = next(line for line in output.splitlines() if f"talker-info {value}" in line)
        document = json.loads(line)
        assert document["logger"] == "talker" and document["worker"] in ("0", "1")
    finally:
        http.update_log_settings({"log_format": "default"}, headers=ADMIN)
    assert http.get_log_settings()["log_format"] == "text"


def test_trace_settings_read_and_updated_over_http_and_grpc(http, grpc_client) -> None:
    settings = http.get_trace_settings()
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert settings["trace_rate"] == "1" and settings["trace_count"] == "-1"
    assert settings["trace_mode"] == "opentelemetry"
    updated = grpc_client.update_trace_settings(
        settings={"trace_rate": "5", "log_frequency": "3"}, headers=GRPC_ADMIN, as_json=True
    )
    assert updated["settings"]["trace_rate"]["value"] == ["5"]
    assert http.get_trace_settings()["log_frequency"] == "3"
    reset = http.update_trace_settings(
        settings={"trace_rate": None, "log_frequency": None}, headers=ADMIN
    )
    assert reset["trace_rate"] == "1" and reset["log_frequency"] == "0"


def test_a_trace_rate_of_zero_stops_spans(server, http, receiver) -> None:
    _, received = receiver
    first, header = traceparent()
    infer(server, 1.0, header)
    received.trace(first, 1)
    http.update_trace_settings(settings={"trace_rate": "0"}, headers=ADMIN)
    unseen, header = traceparent()
    infer(server, 2.0, header)
    http.update_trace_settings(settings={"trace_rate": "1"}, headers=ADMIN)
    last, header = traceparent()
    infer(server, 3.0, header)
    received.trace(last, 1)  # exported after the one sent before it, had it been traced
    assert not [span for span in received.spans if span.trace_id == unseen]


def test_a_models_trace_settings_and_the_trace_count(server, http, grpc_client, receiver) -> None:
    _, received = receiver
    http.update_trace_settings("talker", {"trace_level": ["OFF"]}, headers=ADMIN)
    assert http.get_trace_settings("talker")["trace_level"] == ["OFF"]
    assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]  # the server's
    off, header = traceparent()
    infer(server, 4.0, header)
    # Back to the server's level; one more trace, then none.
    grpc_client.update_trace_settings(
        "talker", {"trace_level": None, "trace_count": "1"}, headers=GRPC_ADMIN
    )
    counted, header = traceparent()
    infer(server, 5.0, header)
    over, header = traceparent()
    infer(server, 6.0, header)
    assert http.get_trace_settings("talker")["trace_count"] == "0"
    http.update_trace_settings("talker", {"trace_count": None}, headers=ADMIN)
    last, header = traceparent()
    infer(server, 7.0, header)
    received.trace(last, 1)
    received.trace(counted, 1)
    assert not [span for span in received.spans if span.trace_id in (off, over)]
    with pytest.raises(InferenceServerException, match=r"404|not found"):
        http.get_trace_settings("no-such-model")


def test_updates_need_the_admin_token(server, http, grpc_client) -> None:
    for path, body in (("/v2/logging", {"log_info": True}), ("/v2/trace/setting", {})):
        answer = httpx.post(f"{server.url}{path}", json=body)
        assert answer.status_code == 401 and "admin token" in answer.json()["error"]
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.post(f"{server.url}{path}", json=body, headers=wrong).status_code == 401
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        grpc_client.update_log_settings({"log_verbose_level": 1})
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        grpc_client.update_trace_settings(settings={"trace_rate": "2"})
    assert http.get_log_settings()["log_verbose_level"] == 0  # reads stay open


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v2/trace/setting", {"trace_rate": "often"}, "trace_rate must be an integer"),
        ("/v2/trace/setting", {"trace_rate": "-2"}, "trace_rate must be between"),
        ("/v2/trace/setting", {"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
        ("/v2/trace/setting", {"trace_level": ["LOUD"]}, "trace_level must be"),
        ("/v2/trace/setting", {"trace_file": "/tmp/t.json"}, "trace_file cannot be set"),
        ("/v2/trace/setting", {"sampling": "1"}, "unknown trace setting 'sampling'"),
        ("/v2/logging", {"log_verbose_level": -1}, "log_verbose_level must be"),
        ("/v2/logging", {"log_info": "yes"}, "log_info must be true or false"),
        ("/v2/logging", {"log_format": "ISO8601"}, "log_format must be"),
        ("/v2/logging", {"log_file": "/tmp/x.log"}, "log_file cannot be set"),
        ("/v2/logging", [1, 2], "must be a JSON object"),
    ],
)
def test_bad_values_are_400_and_change_nothing(server, path, body, words) -> None:
    before = httpx.get(f"{server.url}{path}").json()
    answer = httpx.post(f"{server.url}{path}", json=body, headers=ADMIN)
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"]
    assert httpx.get(f"{server.url}{path}").json() == before


def test_bad_values_over_grpc_are_invalid_argument(grpc_client) -> None:
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*trace_rate"):
        grpc_client.update_trace_settings(settings={"trace_rate": "often"}, headers=GRPC_ADMIN)
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*log_format"):
        grpc_client.update_log_settings({"log_format": "ISO8601"}, headers=GRPC_ADMIN)


def test_tracing_off_cannot_be_switched_on(tmp_path) -> None:
    write_custom_model(tmp_path / "talker", TALKER, "Talker")
    with Server(tmp_path, "--workers", "0") as running:
        running.wait_ready(timeout=90)
        url = f"{running.url}/v2/trace/setting"
        assert httpx.get(url).json()["trace_level"] == ["OFF"]
        answer = httpx.post(url, json={"trace_level": ["TIMESTAMPS"]})
        assert answer.status_code == 400 and "--tracing" in answer.json()["error"]
        assert httpx.post(url, json={"trace_rate": "10"}).json()["trace_rate"] == "10"
