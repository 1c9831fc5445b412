"""CORS from MLServer's ``cors_settings`` (issue 13, smaller breaks): Starlette's
CORSMiddleware answers preflights and labels simple requests for the allowed origins;
without the setting there is no middleware and no CORS header at all."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.support import Server, build_iris_repository

ALLOWED = "https://app.example"
REFUSED = "https://evil.example"
INFER = "/v2/models/iris-logreg/infer"
BODY = {
    "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [5.1, 3.5, 1.4, 0.2]}]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = build_iris_repository(tmp_path_factory.mktemp("cors-repo"))
    cors = {
        "allow_origins": [ALLOWED],
        "allow_methods": ["GET", "POST"],
        "allow_headers": ["content-type"],
        "expose_headers": ["x-answer"],
        "max_age": 120,
    }
    (repository / "settings.json").write_text(json.dumps({"cors_settings": cors}))
    with Server(repository, "--workers", "0") as server:
        server.wait_ready()
        yield server


def preflight(server: Server, origin: str, method: str = "POST") -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "content-type",
    }
    return httpx.options(server.url + INFER, headers=headers)


def test_a_preflight_from_an_allowed_origin_is_answered(server):
    response = preflight(server, ALLOWED)
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == ALLOWED
    assert set(response.headers["access-control-allow-methods"].split(", ")) == {"GET", "POST"}
    assert "content-type" in response.headers["access-control-allow-headers"].lower()
    assert response.headers["access-control-max-age"] == "120"


@pytest.mark.parametrize(("origin", "method"), [(REFUSED, "POST"), (ALLOWED, "DELETE")])
def test_a_preflight_from_a_refused_origin_or_method_is_400(server, origin, method):
    response = preflight(server, origin, method)
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers or origin == ALLOWED


def test_a_simple_request_from_an_allowed_origin_is_labelled(server):
    response = httpx.post(server.url + INFER, json=BODY, headers={"Origin": ALLOWED})
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == ALLOWED
    assert response.headers["access-control-expose-headers"] == "x-answer"
    ready = httpx.get(server.url + "/v2/health/ready", headers={"Origin": ALLOWED})
    assert ready.headers["access-control-allow-origin"] == ALLOWED


def test_a_simple_request_from_a_refused_origin_is_not_labelled(server):
    response = httpx.post(server.url + INFER, json=BODY, headers={"Origin": REFUSED})
    assert response.status_code == 200  # the browser, not the server, withholds the answer
    assert "access-control-allow-origin" not in response.headers


def test_errors_carry_the_cors_headers_too(server):
    response = httpx.post(
        server.url + "/v2/models/nope/infer", json=BODY, headers={"Origin": ALLOWED}
    )
    assert response.status_code == 404
    assert response.headers["access-control-allow-origin"] == ALLOWED


def test_without_cors_settings_there_is_no_cors(iris_server):
    response = httpx.options(
        iris_server.url + INFER,
        headers={"Origin": ALLOWED, "Access-Control-Request-Method": "POST"},
    )
    assert response.status_code == 405
    assert "access-control-allow-origin" not in response.headers
    response = httpx.post(iris_server.url + INFER, json=BODY, headers={"Origin": ALLOWED})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers
