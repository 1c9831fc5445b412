"""A ``Kind.CUSTOM`` job in the worker (``engine/worker/endpoints.py``): what a handler's
answer becomes (status, content type, headers, or the 500 naming what cannot go out), the
methods an endpoint answers, and a feedback's body over REST and gRPC."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from inferpool import EndpointRequest, EndpointResponse, custom_endpoint
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.worker.endpoints import call_custom
from inferpool.engine.worker.model import LoadedModel
from inferpool.errors import BadRequest, InferpoolError, ModelNotFound
from inferpool.protocol.endpoints import (
    FEEDBACK_GRPC,
    FEEDBACK_JSON,
    Answer,
    MethodNotAllowed,
    read_answer,
)
from inferpool.protocol.endpoints import call_body as custom_body
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated import inferpool_ext_pb2 as ext
from tests.support.runtimes import RowSums, loaded_sums_model


class Answers(RowSums):
    """Endpoints that answer whatever the test puts in ``result``; a feedback hook that
    keeps what it was given."""

    result: Any = None
    given: tuple[Any, ...] = ()

    @custom_endpoint("answer", methods=("GET", "POST"))
    def answer(self, request: EndpointRequest) -> Any:
        self.given = (request.method, request.query, dict(request.headers), request.body)
        return self.result

    def feedback(self, request: Any, response: Any, reward: float, truth: Any = None) -> Any:
        self.given = (request, response, reward, truth)
        return self.result


def model() -> LoadedModel:
    return loaded_sums_model(Answers)


def call(loaded: LoadedModel, body: bytes) -> tuple[Reply, Answer, bytes]:
    now = time.monotonic_ns()
    reply = call_custom(loaded, body, now - 1000, now)
    answered = read_answer(reply.body, reply.json_length)
    assert answered is not None
    return reply, answered[0], answered[1]


@pytest.mark.parametrize(
    ("result", "content_type", "body"),
    [
        (b"\x00raw", "application/octet-stream", b"\x00raw"),
        ("text", "text/plain; charset=utf-8", b"text"),
        ({"a": [1, 2]}, "application/json", b'{"a":[1,2]}'),
        (EndpointResponse("<p/>", content_type="text/html"), "text/html", b"<p/>"),
    ],
)
def test_each_kind_of_body_goes_out_with_its_content_type(
    result: Any, content_type: str, body: bytes
) -> None:
    loaded = model()
    loaded.runtime.result = result  # type: ignore[attr-defined]
    reply, answer, out = call(loaded, custom_body("answer", b"in", "GET", "q=1", [("X-A", "b")]))
    assert reply.status == 200 and out == body and answer.content_type == content_type
    assert loaded.runtime.given == ("GET", "q=1", {"x-a": "b"}, b"in")  # type: ignore[attr-defined]
    assert reply.rows == reply.execution == 1 and reply.times is not None


def test_a_response_s_own_status_and_headers_go_out_lower_cased() -> None:
    loaded = model()
    loaded.runtime.result = EndpointResponse(  # type: ignore[attr-defined]
        {"made": True}, status=201, headers={"Location": "/x", "X-Trace": "a\tb"}
    )
    reply, answer, out = call(loaded, custom_body("answer", b""))
    assert reply.status == 201 and orjson.loads(out) == {"made": True}
    assert answer.headers == [("location", "/x"), ("x-trace", "a\tb")]
    assert answer.reward is None


@pytest.mark.parametrize(
    ("result", "says"),
    [
        (EndpointResponse(status=99), "status 99 is not an HTTP status from 200 to 599"),
        (EndpointResponse(status=True), "status True is not an HTTP status"),
        (EndpointResponse(headers={"bad name": "x"}), "'bad name' is not a valid HTTP header"),
        (EndpointResponse(headers={"x-a": "one\ntwo"}), "must be text on one line"),
        (EndpointResponse(headers={"x-a": 3}), "must be text on one line"),
        (EndpointResponse(headers={"Content-Type": "x"}), "is the server's own"),
        (EndpointResponse(b"", content_type="a\nb"), "content type 'a\\nb' must be text"),
        ({"not": object()}, "answered badly"),
    ],
)
def test_an_answer_that_cannot_go_out_is_a_500_naming_the_endpoint(result: Any, says: str) -> None:
    loaded = model()
    loaded.runtime.result = result  # type: ignore[attr-defined]
    with pytest.raises(InferpoolError) as raised:
        call(loaded, custom_body("answer", b""))
    assert raised.value.status == 500
    assert raised.value.message.startswith("custom endpoint '/answer' of model 'sums' answered")
    assert says in raised.value.message


def test_a_method_the_endpoint_does_not_answer_is_refused_with_those_it_does() -> None:
    with pytest.raises(MethodNotAllowed) as raised:
        call(model(), custom_body("answer", b"", "DELETE"))
    assert raised.value.message == (
        "custom endpoint '/answer' of model 'sums' answers GET, POST, not DELETE"
    )


def test_a_path_no_one_answers_is_404() -> None:
    with pytest.raises(ModelNotFound, match="model 'sums' has no endpoint '/nothing/here'"):
        call(model(), custom_body("nothing/here", b""))


def test_a_malformed_call_is_400() -> None:
    with pytest.raises(BadRequest, match="malformed custom endpoint call"):
        call(model(), b"\xff\x00\x00\x00")


# -- feedback -----------------------------------------------------------------------------
REQUEST = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1, 2]}]}
SUM = {"name": "sum", "shape": [1], "datatype": "FP64", "data": [3]}
RESPONSE = {"model_name": "sums", "outputs": [SUM]}
BOTH = {"request": REQUEST, "response": RESPONSE}


def feedback_json(**document: Any) -> bytes:
    return custom_body(FEEDBACK_JSON, orjson.dumps(document))


def test_a_rest_feedback_reaches_the_hook_decoded_and_its_reward_is_answered() -> None:
    loaded = model()
    truth = {"model_name": "sums", "outputs": [SUM]}
    reply, answer, out = call(loaded, feedback_json(**BOTH, reward=0.5, truth=truth))
    assert reply.status == 200 and out == b"{}" and answer.reward == 0.5
    request, response, reward, got_truth = loaded.runtime.given  # type: ignore[attr-defined]
    assert request.inputs[0].name == "x" and response.outputs[0].name == "sum"
    assert reward == 0.5 and got_truth.outputs[0].name == "sum"


def test_a_truth_that_is_no_v2_response_reaches_the_hook_as_sent() -> None:
    loaded = model()
    call(loaded, feedback_json(**BOTH, reward=1, truth=[1, 0]))
    assert loaded.runtime.given[2:] == (1.0, [1, 0])  # type: ignore[attr-defined]


def test_a_hook_s_own_answer_goes_out_with_the_reward() -> None:
    loaded = model()
    loaded.runtime.result = EndpointResponse({"thanks": 1}, status=202)  # type: ignore[attr-defined]
    reply, answer, out = call(loaded, feedback_json(**BOTH, reward=2))
    assert reply.status == 202 and orjson.loads(out) == {"thanks": 1} and answer.reward == 2.0


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (BOTH, "the feedback body needs 'reward'"),
        ({**BOTH, "reward": 1, "extra": 1}, "unknown member(s) extra"),
        ({**BOTH, "request": [], "reward": 1}, "must be V2 JSON objects"),
        ({**BOTH, "reward": "1"}, "must be a finite number, not '1'"),
        ({**BOTH, "reward": True}, "must be a finite number"),
    ],
)
def test_a_rest_feedback_that_is_wrong_is_400_saying_why(document: Any, says: str) -> None:
    with pytest.raises(BadRequest) as raised:
        call(model(), feedback_json(**document))
    assert says in raised.value.message


def grpc_feedback(reward: float = 1.0, truth: bool = False, response: bool = True) -> bytes:
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="x",
        datatype="FP64",
        shape=[1, 2],
        contents=pb.InferTensorContents(fp64_contents=[1, 2]),
    )
    output = pb.ModelInferResponse.InferOutputTensor(
        name="sum", datatype="FP64", shape=[1], contents=pb.InferTensorContents(fp64_contents=[3])
    )
    answered = pb.ModelInferResponse(model_name="sums", outputs=[output])
    request = pb.ModelInferRequest(model_name="sums", inputs=[tensor])
    message = ext.ModelFeedbackRequest(model_name="sums", request=request, reward=reward)
    if response:
        message.response.CopyFrom(answered)
    if truth:
        message.truth.CopyFrom(answered)
    return custom_body(FEEDBACK_GRPC, message.SerializeToString())


def test_a_grpc_feedback_reaches_the_hook_as_the_rest_one_does() -> None:
    loaded = model()
    reply, answer, _ = call(loaded, grpc_feedback(0.25, truth=True))
    assert reply.status == 200 and answer.reward == 0.25
    request, response, reward, truth = loaded.runtime.given  # type: ignore[attr-defined]
    assert request.inputs[0].name == "x" and response.outputs[0].name == "sum"
    assert reward == 0.25 and truth.outputs[0].name == "sum"
    call(loaded, grpc_feedback())
    assert loaded.runtime.given[3] is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (custom_body(FEEDBACK_GRPC, b"\xff\xff\xff"), "not a valid inferpool.ModelFeedbackRequest"),
        (grpc_feedback(response=False), "needs both 'request' and 'response'"),
        (grpc_feedback(reward=float("nan")), "must be a finite number, not nan"),
    ],
)
def test_a_grpc_feedback_that_is_wrong_is_400_saying_why(body: bytes, says: str) -> None:
    with pytest.raises(BadRequest) as raised:
        call(model(), body)
    assert says in raised.value.message


def test_a_hook_that_raises_is_the_model_s_500_unless_it_refused() -> None:
    loaded = model()

    def broken(*args: Any) -> None:
        raise KeyError("oops")

    loaded.runtime.feedback = broken  # type: ignore[method-assign]
    with pytest.raises(InferpoolError) as raised:
        call(loaded, feedback_json(**BOTH, reward=1))
    assert raised.value.status == 500 and "KeyError" in raised.value.message

    def refuses(*args: Any) -> None:
        raise BadRequest("no reward for that")

    loaded.runtime.feedback = refuses  # type: ignore[method-assign]
    with pytest.raises(BadRequest, match="no reward for that"):
        call(loaded, feedback_json(**BOTH, reward=1))
