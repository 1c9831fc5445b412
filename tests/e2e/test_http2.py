"""``--http2`` serves the same app with Hypercorn: HTTP/2 (prior knowledge) and HTTP/1.1."""

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.test_rest_limits import (
    HOOKS_RUNTIME,
    hooks_body,
    iris_body,
    queued_then_gone,
)
from tests.support import Server, build_iris_repository, write_custom_model


def test_http2_and_http11_both_infer(iris_repo):
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [6, 3, 5, 2]}]}
    with Server(iris_repo, "--workers", "0", "--http2") as server:
        server.wait_ready()
        with httpx.Client(http1=False, http2=True, base_url=server.url) as h2:
            response = h2.post("/v2/models/iris-logreg/infer", json=body)
            assert response.http_version == "HTTP/2"
            assert response.json()["outputs"][0]["data"] == [2]
            missing = h2.get("/v2/models/missing")
            assert missing.status_code == 404 and "missing" in missing.json()["error"]
        response = httpx.post(f"{server.url}/v2/models/iris-logreg/infer", json=body)
        assert response.http_version == "HTTP/1.1"
        assert response.json()["outputs"][0]["data"] == [2]
    assert server.returncode == 0


# -- limits and timeouts under Hypercorn (issue 12) -----------------------------------------
@pytest.fixture(scope="module")
def hyper(tmp_path_factory) -> Iterator[Server]:
    root = build_iris_repository(tmp_path_factory.mktemp("h2-limits-repo"))
    write_custom_model(root / "hooks", HOOKS_RUNTIME, "Hooks")
    flags = ("--max-body-bytes", "1000", "--idle-timeout", "2", "--http2", "--workers", "2")
    with Server(root, *flags) as server:
        server.wait_ready()
        yield server


@pytest.mark.parametrize("h2", [False, True])
def test_errors_before_the_body_is_read_keep_the_connection_serving(hyper, h2):
    infer = "/v2/models/iris-logreg/infer"
    with httpx.Client(http1=not h2, http2=h2, base_url=hyper.url, timeout=30) as http:
        for _ in range(3):
            response = http.post(infer, content=b" " * 5000)
            assert response.status_code == 413
            assert "exceeds the limit of 1000 bytes (--max-body-bytes)" in response.json()["error"]
            response = http.post(infer, content=iter([b" " * 600] * 10))
            assert response.status_code == 413
            bad = {"Inference-Header-Content-Length": "-1"}
            assert http.post(infer, content=iris_body(), headers=bad).status_code == 400
            bad = {"Request-Timeout": "soon"}
            assert http.post(infer, content=iris_body(), headers=bad).status_code == 400
            assert http.post("/v2/models/nope/infer", content=iris_body()).status_code == 404
            response = http.post(infer, content=iris_body())
            assert response.status_code == 200, response.text
            assert response.http_version == ("HTTP/2" if h2 else "HTTP/1.1")
    assert "Traceback" not in hyper.output()


def test_request_timeout_is_504_over_http2(hyper):
    with httpx.Client(http1=False, http2=True, base_url=hyper.url, timeout=30) as http:
        started = time.monotonic()
        response = http.post(
            "/v2/models/hooks/infer",
            content=hooks_body(sleep=3),
            headers={"Request-Timeout": "0.5"},
        )
        assert response.status_code == 504, response.text
        assert time.monotonic() - started < 2.5
        assert http.get("/v2/health/ready").status_code == 200


def test_a_disconnect_cancels_queued_requests_under_hypercorn(hyper, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    assert queued_then_gone(hyper, marks, 4) == 0


def test_a_silent_connection_is_closed_at_the_idle_timeout(hyper):
    with socket.create_connection(("127.0.0.1", hyper.http_port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - started < 4.5
