"""Custom endpoints (``inferpool.custom_endpoint``) and feedback on a live server, over REST
and gRPC (``inferpool.CustomService`` / ``FeedbackService`` on both gRPC servers), with 0
and 2 workers: methods, multi-segment and versioned paths, the handler's status, content
type and headers, the bare legacy path and its conflict, 404/405, the access log and
metrics, the default feedback hook and one a runtime overrides, and bad feedbacks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated import inferpool_ext_pb2 as ext
from inferpool.protocol.generated.inferpool_ext_pb2_grpc import (
    CustomServiceStub,
    FeedbackServiceStub,
)
from tests.support import Server, write_custom_model
from tests.support.grpc import SETUPS, running_server

SOURCE = """
import os

import numpy as np

import inferpool
from inferpool import EndpointRequest, EndpointResponse, custom_endpoint


class Base(inferpool.Runtime):
    bare_endpoints = True

    def load(self):
        pass

    def predict(self, payload, outputs):
        return {outputs[0]: np.asarray(payload).sum(axis=1)}


class Reports(Base):
    @custom_endpoint("/status", methods=["GET"])
    def status(self, request: EndpointRequest):
        return {
            "model": self.name, "version": self.settings.version, "method": request.method,
            "query": request.query, "probe": request.headers.get("x-probe"), "pid": os.getpid(),
        }

    @custom_endpoint("/reports/latest", methods=["GET", "POST"])
    def latest(self, request: EndpointRequest):
        if request.method == "GET":
            return b"\\x00binary"
        rows = request.json()["rows"]
        csv = "id,value\\n" + "".join(f"{i},{i * 2}\\n" for i in range(rows))
        return EndpointResponse(csv, status=201, content_type="text/csv",
                                headers={"X-Report-Rows": str(rows), "Cache-Control": "no-store"})

    @custom_endpoint("shared", methods=["GET"])
    def shared(self, request):
        return "reports"

    @custom_endpoint("/forbidden")
    def forbidden(self, request):
        return EndpointResponse({"error": "not for you"}, status=403)

    @custom_endpoint("/moved", methods=["GET"])
    def moved(self, request):
        return EndpointResponse(b"", status=302, headers={"Location": "/v2"})

    @custom_endpoint("/broken")
    def broken(self, request):
        return 1 / 0

    @custom_endpoint("/bad-header")
    def bad_header(self, request):
        return EndpointResponse("x", headers={"X-Bad": "a\\r\\nb"})

    def feedback(self, request, response, reward, truth=None):
        return {
            "inputs": [tensor.name for tensor in request.inputs],
            "data": request.inputs[0].data.tolist(),
            "outputs": [tensor.name for tensor in response.outputs],
            "reward": reward,
            "truth": truth if not isinstance(truth, inferpool.InferenceResponse)
                     else [tensor.data.tolist() for tensor in truth.outputs],
        }


class Twin(Base):
    @custom_endpoint("/shared", methods=["GET"])
    def shared(self, request):
        return "twin"

    def custom_endpoints(self):
        return {"legacy": lambda body: {"length": len(body)}}


class Plain(Base):
    bare_endpoints = False

    @custom_endpoint("/status", methods=["GET"])
    def status(self, request):
        return "plain"
"""

FEEDBACK_REQUEST = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1.0, 2.0]}]
}
FEEDBACK_RESPONSE = {
    "model_name": "reports",
    "outputs": [{"name": "sum", "datatype": "FP64", "shape": [1], "data": [3.0]}],
}


def build_repository(root: Path) -> Path:
    versioned = {"parameters": {"version": "2"}}
    write_custom_model(root / "reports", SOURCE, "Reports", module="shop", **versioned)
    write_custom_model(root / "twin", SOURCE, "Twin", module="shop")
    write_custom_model(root / "plain", SOURCE, "Plain", module="shop")
    return root


@pytest.fixture(scope="module", params=SETUPS)
def server(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workers, implementation = request.param
    repository = build_repository(tmp_path_factory.mktemp("endpoints"))
    with running_server(
        repository, workers, "--access-log", "--metrics-port", "0", implementation=implementation
    ) as running:
        running.workers = workers
        yield running


@pytest.fixture(scope="module")
def channel(server: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_address) as opened:
        yield opened


def metrics(server: Server) -> str:
    return httpx.get(f"{server.url}/metrics").text


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- REST -----------------------------------------------------------------------------------
def test_get_with_query_and_headers(server: Server) -> None:
    reply = httpx.get(f"{server.url}/v2/models/reports/status?x=1&y=two", headers={"X-Probe": "p"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-request-id"]
    document = reply.json()
    assert document["model"] == "reports" and document["method"] == "GET"
    assert document["query"] == "x=1&y=two" and document["probe"] == "p"


def test_handler_sets_status_content_type_and_headers(server: Server) -> None:
    reply = httpx.post(f"{server.url}/v2/models/reports/reports/latest", json={"rows": 2})
    assert reply.status_code == 201, reply.text
    assert reply.headers["content-type"] == "text/csv"
    assert reply.headers["x-report-rows"] == "2"
    assert reply.headers["cache-control"] == "no-store"
    assert reply.text == "id,value\n0,0\n1,2\n"
    got = httpx.get(f"{server.url}/v2/models/reports/reports/latest")
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.content == b"\x00binary"


def test_versioned_path(server: Server) -> None:
    reply = httpx.get(f"{server.url}/v2/models/reports/versions/2/status")
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == "2"
    missing = httpx.get(f"{server.url}/v2/models/reports/versions/9/status")
    assert missing.status_code == 404
    assert "reports" in missing.json()["error"]


def test_unknown_path_is_404_and_wrong_method_405(server: Server) -> None:
    unknown = httpx.get(f"{server.url}/v2/models/reports/nothing/here")
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "model 'reports' has no endpoint '/nothing/here'"}
    odd = httpx.get(f"{server.url}/v2/models/reports/.hidden")
    assert odd.status_code == 404 and odd.json() == {"error": "no endpoint '/.hidden'"}
    wrong = httpx.post(f"{server.url}/v2/models/reports/status")
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "GET"
    assert "answers GET, not POST" in wrong.json()["error"]
    # The protocol's own routes keep their 405.
    infer = httpx.get(f"{server.url}/v2/models/reports/infer")
    assert infer.status_code == 405 and infer.headers["allow"] == "POST"
    live = httpx.post(f"{server.url}/v2/health/live")
    assert live.status_code == 405 and live.headers["allow"] == "GET, HEAD"
    metadata = httpx.post(f"{server.url}/v2/models/reports/versions/2")
    assert metadata.status_code == 405 and "error" in metadata.json()
    nobody = httpx.get(f"{server.url}/v2/models/nobody/status")
    assert nobody.status_code == 404


def test_handler_errors(server: Server) -> None:
    forbidden = httpx.post(f"{server.url}/v2/models/reports/forbidden")
    assert forbidden.status_code == 403 and forbidden.json() == {"error": "not for you"}
    broken = httpx.post(f"{server.url}/v2/models/reports/broken")
    assert broken.status_code == 500
    assert "ZeroDivisionError" in broken.json()["error"]
    bad = httpx.post(f"{server.url}/v2/models/reports/bad-header")
    assert bad.status_code == 500
    assert "X-Bad" in bad.json()["error"]
    not_json = httpx.post(f"{server.url}/v2/models/reports/reports/latest", content=b"{")
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]


def test_redirect_status_goes_out_as_set(server: Server) -> None:
    reply = httpx.get(f"{server.url}/v2/models/reports/moved", follow_redirects=False)
    assert reply.status_code == 302 and reply.headers["location"] == "/v2"


def test_dict_api_keeps_working(server: Server) -> None:
    reply = httpx.post(f"{server.url}/v2/models/twin/legacy", content=b"abcd")
    assert reply.status_code == 200 and reply.json() == {"length": 4}
    assert httpx.get(f"{server.url}/v2/models/twin/legacy").status_code == 405


def test_bare_path_of_one_model_and_conflict(server: Server) -> None:
    only = httpx.get(f"{server.url}/status")
    assert only.status_code == 200, only.text  # reports opted in, plain did not
    assert only.json()["model"] == "reports"
    conflict = httpx.get(f"{server.url}/shared")
    assert conflict.status_code == 409
    assert conflict.json() == {
        "error": "/shared is served by models 'reports' and 'twin'; call "
        "/v2/models/{name}/shared to choose one"
    }
    assert httpx.get(f"{server.url}/v2/models/twin/shared").text == "twin"
    nothing = httpx.get(f"{server.url}/no/such/path")
    assert nothing.status_code == 404 and nothing.json() == {"error": "no route /no/such/path"}
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_server_metadata_lists_the_extensions(server: Server) -> None:
    extensions = httpx.get(f"{server.url}/v2").json()["extensions"]
    assert {"custom_endpoints", "feedback"} <= set(extensions)


def test_handlers_run_in_the_workers(server: Server) -> None:
    pids = {httpx.get(f"{server.url}/v2/models/reports/status").json()["pid"] for _ in range(8)}
    if server.workers == 0:
        assert pids == {server.process.pid}
    else:
        assert server.process.pid not in pids


def test_access_log_and_metrics_name_the_path(server: Server) -> None:
    httpx.get(f"{server.url}/v2/models/reports/status?probe=log")
    server.expect_lines([r"REST GET /v2/models/reports/status .*model=reports .*status=200"])
    for index in range(3):
        httpx.get(f"{server.url}/v2/models/reports/random-{index}")
    text = metrics(server)
    labels = {"model": "reports", "version": "2", "protocol": "rest", "method": "POST"}
    assert sample(text, "inferpool_model_endpoint_requests_total", **labels,
                  path="/reports/latest", code="201") >= 1  # fmt: skip
    assert "random-" not in text  # unknown paths never become label values


# -- gRPC -----------------------------------------------------------------------------------
def test_grpc_call(server: Server, channel: grpc.Channel) -> None:
    stub = CustomServiceStub(channel)
    answer = stub.Call(
        ext.CallRequest(
            model_name="reports", path="/reports/latest", method="POST", body=b'{"rows": 1}'
        )
    )
    assert answer.status_code == 201
    assert answer.content_type == "text/csv"
    assert answer.headers["x-report-rows"] == "1"
    assert answer.body == b"id,value\n0,0\n"
    status = stub.Call(
        ext.CallRequest(
            model_name="reports",
            model_version="2",
            path="status",
            method="GET",
            metadata={"X-Probe": "grpc"},
            query="a=b",
        )
    )
    assert status.status_code == 200
    assert b'"probe":"grpc"' in status.body and b'"query":"a=b"' in status.body
    legacy = stub.Call(ext.CallRequest(model_name="twin", path="legacy", body=b"xyz"))
    assert legacy.body == b'{"length":3}'
    server.expect_lines([r"gRPC Call /reports/latest .*model=reports .*status=OK"])
    text = metrics(server)
    assert sample(text, "inferpool_model_endpoint_requests_total", model="reports",
                  protocol="grpc", path="/reports/latest", code="201") >= 1  # fmt: skip


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (ext.CallRequest(model_name="nobody", path="status"), "NOT_FOUND", "nobody"),
        (
            ext.CallRequest(model_name="reports", path="nothing"),
            "NOT_FOUND",
            "model 'reports' has no endpoint '/nothing'",
        ),
        (
            ext.CallRequest(model_name="reports", path="status", method="POST"),
            "UNIMPLEMENTED",
            "answers GET, not POST",
        ),
        (ext.CallRequest(model_name="reports", path="forbidden"), "PERMISSION_DENIED", "not for"),
        (ext.CallRequest(model_name="reports", path="broken"), "INTERNAL", "ZeroDivisionError"),
    ],
)
def test_grpc_call_errors(channel: grpc.Channel, request_, code: str, message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        CustomServiceStub(channel).Call(request_, timeout=10)
    assert caught.value.code() == grpc.StatusCode[code]
    assert message in caught.value.details()


# -- feedback -------------------------------------------------------------------------------
def test_default_feedback_is_200_and_counted(server: Server) -> None:
    before = sample(metrics(server), "inferpool_model_feedback_total", model="plain")
    body = {"request": FEEDBACK_REQUEST, "response": FEEDBACK_RESPONSE, "reward": 0.5}
    reply = httpx.post(f"{server.url}/v2/models/plain/feedback", json=body)
    assert reply.status_code == 200 and reply.json() == {}
    reply = httpx.post(f"{server.url}/v2/models/plain/feedback", json={**body, "reward": 2})
    assert reply.status_code == 200
    text = metrics(server)
    assert sample(text, "inferpool_model_feedback_total", model="plain") == before + 2
    assert sample(text, "inferpool_model_feedback_reward_sum", model="plain") >= 2.5


def test_overridden_feedback_receives_typed_structs(server: Server) -> None:
    truth = {"outputs": [{"name": "sum", "datatype": "FP64", "shape": [1], "data": [4.0]}]}
    body = {"request": FEEDBACK_REQUEST, "response": FEEDBACK_RESPONSE, "reward": -1,
            "truth": truth}  # fmt: skip
    reply = httpx.post(f"{server.url}/v2/models/reports/versions/2/feedback", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "inputs": ["x"], "data": [[1.0, 2.0]], "outputs": ["sum"], "reward": -1.0,
        "truth": [[4.0]],
    }  # fmt: skip
    plain_truth = httpx.post(
        f"{server.url}/v2/models/reports/feedback", json={**body, "truth": "cat"}
    )
    assert plain_truth.json()["truth"] == "cat"
    assert sample(metrics(server), "inferpool_model_feedback_reward_sum", model="reports") < 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "is not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"request": {}, "response": {}}', "needs 'reward'"),
        (b'{"request": 1, "response": {}, "reward": 1}', "must be V2 JSON objects"),
        (b'{"request": {"inputs": []}, "response": {"outputs": []}, "reward": 1}', "inputs"),
        (
            b'{"request": {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], '
            b'"data": [1]}]}, "response": {"outputs": []}, "reward": "high"}',
            "'reward' must be a finite number",
        ),
        (b'{"request": {}, "response": {}, "reward": 1, "extra": 1}', "unknown member(s) extra"),
    ],
)
def test_bad_feedback_is_400(server: Server, body: bytes, message: str) -> None:
    reply = httpx.post(f"{server.url}/v2/models/plain/feedback", content=body)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]


def test_feedback_of_unknown_model_is_404(server: Server) -> None:
    reply = httpx.post(f"{server.url}/v2/models/nobody/feedback", json={})
    assert reply.status_code == 404


def grpc_feedback(model: str, reward: float, truth: bool = False) -> ext.ModelFeedbackRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP64", shape=[1, 2]).contents.fp64_contents.extend(
        [1.0, 2.0]
    )
    response = pb.ModelInferResponse(model_name=model)
    response.outputs.add(name="sum", datatype="FP64", shape=[1]).contents.fp64_contents.append(3)
    message = ext.ModelFeedbackRequest(
        model_name=model, request=request, response=response, reward=reward
    )
    if truth:
        message.truth.CopyFrom(response)
    return message


def test_grpc_feedback(server: Server, channel: grpc.Channel) -> None:
    stub = FeedbackServiceStub(channel)
    before = sample(metrics(server), "inferpool_model_feedback_total", model="plain")
    assert stub.ModelFeedback(grpc_feedback("plain", 1.0)) == ext.ModelFeedbackResponse()
    stub.ModelFeedback(grpc_feedback("reports", 3.0, truth=True))
    assert sample(metrics(server), "inferpool_model_feedback_total", model="plain") == before + 1
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelFeedback(ext.ModelFeedbackRequest(model_name="plain", reward=1))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "needs both 'request' and 'response'" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelFeedback(grpc_feedback("plain", float("nan")))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelFeedback(grpc_feedback("nobody", 1.0))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
