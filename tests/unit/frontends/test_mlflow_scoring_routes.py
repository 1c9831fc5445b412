"""MLflow's scoring routes at the root (``frontends/rest/mlflow_scoring.py``) in process, on
an in-process engine (no workers, no server): which model they answer for, the
Content-Type check in MLflow's words (415), errors in MLflow's JSON form, and a
model's predictions (its input) through ``/invocations``. The same routes against a live server and
MLflow's own client: tests/compat/test_smaller_mlflow_scoring.py (not in tox -e lowest)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from inferpool.engine.inprocess import InProcessClient
from inferpool.engine.lifecycle import StartupFailed
from inferpool.frontends.rest.app import build_app
from inferpool.frontends.rest.mlflow_scoring import (
    _endpoint,
    _Unsupported,
    mlflow_error,
    server_version,
)
from inferpool.protocol.mlflow_endpoints import INVOCATIONS, INVOCATIONS_CSV
from inferpool.settings import ServerSettings
from tests.support import write_custom_model

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]]
MAX_BODY = 10_000

Scenario = Callable[[httpx.AsyncClient], Coroutine[Any, Any, dict[str, httpx.Response]]]

# A model that answers its input: MLflow's predictions are the rows sent.
ECHO = """
import numpy as np

from inferpool import Runtime


class Echo(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        return {"output-0": np.asarray(payload)}
"""

# A model whose load fails: a single-model server whose model is not READY.
BROKEN = """
from inferpool import Runtime


class Broken(Runtime):
    def load(self):
        raise RuntimeError("no weights here")

    def predict(self, payload, outputs):
        return {}
"""


def serve(repository: Path, scenario: Scenario) -> dict[str, httpx.Response]:
    """Run ``scenario`` against the REST app of an in-process engine over ``repository``."""

    async def run() -> dict[str, httpx.Response]:
        settings = ServerSettings(
            model_repository=repository, workers=0, max_body_bytes=MAX_BODY, load_probe=False
        )
        client = InProcessClient(settings)
        with contextlib.suppress(StartupFailed):  # a model that fails: still served
            await client.start()
        transport = httpx.ASGITransport(app=build_app(client))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                return await scenario(http)
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, httpx.Response]:
    """Every request against a server of one model, answered once."""
    repository = tmp_path_factory.mktemp("one")
    write_custom_model(repository / "echo", ECHO, "Echo")

    async def scenario(http: httpx.AsyncClient) -> dict[str, httpx.Response]:
        json_body = orjson.dumps({"inputs": ROWS})
        csv_body = "a,b,c,d\n" + "\n".join(",".join(map(str, row)) for row in ROWS)
        asks = {
            "ping": http.get("/ping"),
            "health": http.get("/health"),
            "version": http.get("/version"),
            "json": http.post(
                "/invocations", content=json_body, headers={"content-type": "application/json"}
            ),
            "csv": http.post(
                "/invocations", content=csv_body, headers={"content-type": "text/csv"}
            ),
            "bad": http.post(
                "/invocations",
                content=b'{"nothing": 1}',
                headers={"content-type": "application/json"},
            ),
            "large": http.post(
                "/invocations",
                content=b"[" + b"1," * MAX_BODY + b"1]",
                headers={"content-type": "application/json"},
            ),
            "plain": http.post(
                "/invocations", content=b"x", headers={"content-type": "text/plain"}
            ),
        }
        return {name: await ask for name, ask in asks.items()}

    return serve(repository, scenario)


def test_the_only_model_answers_ping_health_and_version(single):
    answers = single
    for route in ("ping", "health"):
        assert answers[route].status_code == 200
        assert answers[route].text == "\n"
        assert answers[route].headers["content-type"] == "application/json"
    assert answers["version"].status_code == 200
    assert answers["version"].text == server_version()


def test_invocations_predict_from_json_and_csv(single):
    answers = single
    expected = {"predictions": ROWS}
    for route in ("json", "csv"):
        assert answers[route].status_code == 200, answers[route].text
        assert answers[route].json() == expected


def test_invocations_errors_are_mlflows_json(single):
    answers = single
    bad = answers["bad"]
    assert bad.status_code == 400 and bad.json()["error_code"] == "BAD_REQUEST", bad.text
    assert bad.json()["message"]
    large = answers["large"]
    assert large.status_code == 413, large.text
    assert large.json()["error_code"] == "BAD_REQUEST"
    assert "max_body_bytes" in large.json()["message"] or str(MAX_BODY) in large.json()["message"]
    plain = answers["plain"]
    assert plain.status_code == 415
    assert plain.text.startswith("This predictor only supports the following content types")


def test_several_models_none_of_them_mlflow_answer_404_naming_them(tmp_path):
    write_custom_model(tmp_path / "a", ECHO, "Echo")
    write_custom_model(tmp_path / "b", ECHO, "Echo")

    async def scenario(http: httpx.AsyncClient) -> dict[str, httpx.Response]:
        return {
            "ping": await http.get("/ping"),
            "version": await http.get("/version"),
            "invocations": await http.post(
                "/invocations", content=b"{}", headers={"content-type": "application/json"}
            ),
        }

    for name, answer in serve(tmp_path, scenario).items():
        assert answer.status_code == 404, name
        body = answer.json()
        assert body["error_code"] == "RESOURCE_DOES_NOT_EXIST"
        assert "2 models (a, b), none of them MLflow's" in body["message"]
        assert "/v2/models/{name}/invocations" in body["message"]


def test_no_model_and_a_model_not_ready(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()

    async def ping(http: httpx.AsyncClient) -> dict[str, httpx.Response]:
        return {"ping": await http.get("/ping")}

    answer = serve(empty, ping)["ping"]
    assert answer.status_code == 404
    assert "no model" in answer.json()["message"]

    write_custom_model(tmp_path / "broken" / "broken", BROKEN, "Broken")
    answer = serve(tmp_path / "broken", ping)["ping"]
    assert answer.status_code == 503, answer.text
    assert answer.json()["error_code"] == "TEMPORARILY_UNAVAILABLE"
    assert "no weights here" in answer.json()["message"]


@pytest.mark.parametrize(
    ("content_type", "endpoint"),
    [
        ("application/json", INVOCATIONS),
        ("Application/JSON; charset=UTF-8", INVOCATIONS),
        ("text/csv", INVOCATIONS_CSV),
        ("text/csv ;charset=utf-8", INVOCATIONS_CSV),
    ],
)
def test_endpoint_by_content_type(content_type, endpoint):
    assert _endpoint(content_type) == endpoint


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        ("application/json; charset=latin-1", "The scoring server only supports UTF-8"),
        ("text/csv; header=present", "Unrecognized content type parameters: header."),
        (
            "application/json; b=1; a=2",
            "Unrecognized content type parameters: a, b.",
        ),
        (None, "Got ''."),
        ("text/plain", "Got 'text/plain'."),
    ],
)
def test_endpoint_refuses_what_mlflow_refuses(content_type, message):
    with pytest.raises(_Unsupported) as caught:
        _endpoint(content_type)
    assert str(caught.value).endswith(message) or str(caught.value) == message


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "BAD_REQUEST"),
        (404, "RESOURCE_DOES_NOT_EXIST"),
        (418, "BAD_REQUEST"),  # not in the table: by its class
        (500, "INTERNAL_ERROR"),
        (502, "INTERNAL_ERROR"),
        (503, "TEMPORARILY_UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
    ],
)
def test_mlflow_error_codes(status, code):
    response = mlflow_error(status, "why")
    assert response.status_code == status
    assert orjson.loads(response.body) == {"error_code": code, "message": "why"}
