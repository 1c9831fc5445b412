"""Custom endpoints, feedback and KServe's V1 routes on an in-process engine (no server, no
worker): the REST routes (``rest/endpoints.py``, ``rest/kserve_v1.py``) through the app,
and gRPC's CustomService and FeedbackService handlers (``grpc/custom.py``) called as the
servers call them, all routed by ``frontends/endpoints.py``. The same models on live
servers of both gRPC implementations, with and without workers:
tests/e2e/test_custom_endpoints.py (not in tox -e lowest)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from inferpool.engine.inprocess import InProcessClient
from inferpool.errors import InferpoolError
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.custom import ExtensionServices
from inferpool.frontends.rest.app import build_app
from inferpool.protocol.generated import inferpool_ext_pb2 as ext
from inferpool.settings import ServerSettings
from tests.e2e.test_custom_endpoints import (
    FEEDBACK_REQUEST,
    FEEDBACK_RESPONSE,
    build_repository,
    grpc_feedback,
)


class Context:
    """What the extension services read of a call's context."""

    def time_remaining(self) -> float | None:
        return 30.0


async def grpc_outcome(call: Any) -> Any:
    """A handler's answer, or (status, message) of the error it raised."""
    try:
        return await call
    except InferpoolError as exc:
        return (exc.status, exc.message)


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict[str, Any]:
    """Every request, answered once by one in-process engine."""
    repository = build_repository(tmp_path_factory.mktemp("endpoints"))

    async def main() -> dict[str, Any]:
        settings = ServerSettings(model_repository=repository, workers=0, load_probe=False)
        client = InProcessClient(settings)
        await client.start()
        try:
            transport = httpx.ASGITransport(app=build_app(client))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                return await ask(http, ExtensionServices(DataPlane(client)))
        finally:
            await client.close()

    return asyncio.run(main())


async def ask(http: httpx.AsyncClient, services: ExtensionServices) -> dict[str, Any]:
    out: dict[str, Any] = {}
    get, post = http.get, http.post
    out["status"] = await get("/v2/models/reports/status?x=1", headers={"X-Probe": "p"})
    out["latest"] = await post("/v2/models/reports/reports/latest", json={"rows": 2})
    out["versioned"] = await get("/v2/models/reports/versions/2/status")
    out["no version"] = await get("/v2/models/reports/versions/9/status")
    out["unknown"] = await get("/v2/models/reports/nothing/here")
    out["wrong method"] = await post("/v2/models/reports/status")
    out["forbidden"] = await post("/v2/models/reports/forbidden")
    out["broken"] = await post("/v2/models/reports/broken")
    out["bare"] = await get("/status")
    out["conflict"] = await get("/shared")
    out["no route"] = await get("/no/such/path")
    out["nobody"] = await get("/v2/models/nobody/status")
    body = {"request": FEEDBACK_REQUEST, "response": FEEDBACK_RESPONSE, "reward": 0.5}
    out["feedback"] = await post("/v2/models/plain/feedback", json=body)
    out["bad feedback"] = await post("/v2/models/plain/feedback", content=b"[]")
    # gRPC's CustomService and FeedbackService.
    call = services.call
    out["grpc latest"] = await grpc_outcome(
        call(ext.CallRequest(model_name="reports", path="/reports/latest", method="POST",
                             body=b'{"rows": 1}'), Context())
    )  # fmt: skip
    out["grpc legacy"] = await grpc_outcome(
        call(ext.CallRequest(model_name="twin", path="legacy", body=b"xyz"), None)
    )
    out["grpc errors"] = [
        await grpc_outcome(call(ext.CallRequest(model_name="reports", path=path), Context()))
        for path in ("nothing", "forbidden", "broken")
    ]
    out["grpc feedback"] = await grpc_outcome(
        services.feedback(grpc_feedback("plain", 1.0), Context())
    )
    out["grpc bad feedback"] = await grpc_outcome(
        services.feedback(ext.ModelFeedbackRequest(model_name="plain", reward=1), Context())
    )
    # KServe's V1 protocol.
    out["v1 alive"] = await get("/")
    out["v1 models"] = await get("/v1/models")
    out["v1 ready"] = await get("/v1/models/plain")
    out["v1 missing"] = await get("/v1/models/nobody")
    out["v1 predict"] = await post("/v1/models/plain:predict", json={"instances": [[1, 2], [3, 4]]})
    out["v1 missing predict"] = await post("/v1/models/nobody:predict", json={"instances": []})
    out["v1 explain"] = await post("/v1/models/plain:explain", json={"instances": [[1, 2]]})
    return out


def test_rest_custom_endpoints_answer_as_their_handlers_say(answers) -> None:
    status = answers["status"]
    assert status.status_code == 200, status.text
    assert status.json()["query"] == "x=1" and status.json()["probe"] == "p"
    assert status.headers["x-request-id"]
    latest = answers["latest"]
    assert latest.status_code == 201 and latest.headers["content-type"] == "text/csv"
    assert latest.headers["x-report-rows"] == "2" and latest.text == "id,value\n0,0\n1,2\n"
    assert answers["versioned"].json()["version"] == "2"
    assert answers["no version"].status_code == 404


def test_rest_custom_endpoint_refusals(answers) -> None:
    assert answers["unknown"].status_code == 404
    assert answers["unknown"].json() == {"error": "model 'reports' has no endpoint '/nothing/here'"}
    wrong = answers["wrong method"]
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
    assert answers["forbidden"].status_code == 403
    assert answers["forbidden"].json() == {"error": "not for you"}
    assert answers["broken"].status_code == 500
    assert "ZeroDivisionError" in answers["broken"].json()["error"]
    assert answers["nobody"].status_code == 404


def test_bare_paths(answers) -> None:
    assert answers["bare"].status_code == 200 and answers["bare"].json()["model"] == "reports"
    assert answers["conflict"].status_code == 409
    assert "served by models 'reports' and 'twin'" in answers["conflict"].json()["error"]
    assert answers["no route"].status_code == 404
    assert answers["no route"].json() == {"error": "no route /no/such/path"}


def test_feedback(answers) -> None:
    assert answers["feedback"].status_code == 200 and answers["feedback"].json() == {}
    assert answers["bad feedback"].status_code == 400
    assert "must be a JSON object" in answers["bad feedback"].json()["error"]
    assert answers["grpc feedback"] == ext.ModelFeedbackResponse()
    status, message = answers["grpc bad feedback"]
    assert status == 400 and "needs both 'request' and 'response'" in message


def test_grpc_custom_calls(answers) -> None:
    latest = answers["grpc latest"]
    assert latest.status_code == 201 and latest.content_type == "text/csv"
    assert latest.headers["x-report-rows"] == "1" and latest.body == b"id,value\n0,0\n"
    assert answers["grpc legacy"].body == b'{"length":3}'
    unknown, forbidden, broken = answers["grpc errors"]
    assert unknown == (404, "model 'reports' has no endpoint '/nothing'")
    assert forbidden == (403, "not for you")
    assert broken[0] == 500 and "ZeroDivisionError" in broken[1]


def test_kserve_v1_routes(answers) -> None:
    assert answers["v1 alive"].json() == {"status": "alive"}
    assert answers["v1 models"].json() == {"models": ["plain", "reports", "twin"]}
    assert answers["v1 ready"].json() == {"name": "plain", "ready": True}
    assert answers["v1 missing"].status_code == 404
    predict = answers["v1 predict"]
    # Read in the worker, by the model's declared inputs: these models declare none.
    assert predict.status_code == 400, predict.text
    assert predict.json() == {"error": "the model declares no inputs to read V1 instances into"}
    assert answers["v1 missing predict"].status_code == 404
    explain = answers["v1 explain"]
    assert explain.status_code >= 400 and "error" in explain.json()  # no explainer here
