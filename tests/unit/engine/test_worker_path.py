"""The one worker path (``run_group``): a single request is a group of one, every failure
is answered through the error tree, and ``failure_reason`` tells load errors apart by class."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import orjson
import pytest

from inferpool.engine.inprocess import InProcessClient
from inferpool.engine.ipc.messages import Kind, Reply, RequestHeader
from inferpool.engine.worker import inference
from inferpool.engine.worker.model import LoadedModel, failure_reason
from inferpool.engine.worker.path import Job, run_group
from inferpool.errors import BadRequest, ModelLoadError, RuntimeNotFound
from inferpool.protocol.endpoints import call_body as custom_body
from inferpool.protocol.endpoints import read_answer
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ServerSettings
from tests.support.runtimes import RowSums, loaded_sums_model


class Sums(RowSums):
    """Sums each row. Refuses negative values as a library's input check would
    (``input_errors``); has custom endpoints."""

    input_errors = (ValueError,)

    def custom_endpoints(self):
        return {"double": self.double, "raw": lambda body: body[::-1], "fail": self.fail}

    def double(self, body: bytes):
        return {"doubled": np.asarray(orjson.loads(body)) * 2}

    def fail(self, body: bytes):
        if body == b"bad":
            raise BadRequest("fail: that body is refused")
        return 1 / 0


def make_model(max_batch_size: int = 8) -> LoadedModel:
    return loaded_sums_model(Sums, max_batch_size)


def rest(request_id: str, rows) -> bytes:
    array = np.asarray(rows, dtype=float)
    tensor = {"name": "x", "shape": list(array.shape), "datatype": "FP64",
              "data": array.ravel().tolist()}  # fmt: skip
    return orjson.dumps({"id": request_id, "inputs": [tensor]})


def grpc(request_id: str, rows) -> bytes:
    array = np.asarray(rows, dtype=float)
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP64", shape=list(array.shape),
        contents=pb.InferTensorContents(fp64_contents=array.ravel().tolist()),
    )  # fmt: skip
    request = pb.ModelInferRequest(model_name="sums", id=request_id, inputs=[tensor])
    return request.SerializeToString()


def job(body: bytes, kind: int = Kind.REST, deadline_ns: int = 0, waited_ns: int = 1000) -> Job:
    # Sent ``waited_ns`` ago, so that the queue time is never 0.
    enqueued = time.monotonic_ns() - waited_ns
    return Job(RequestHeader(7, 1, kind, None, deadline_ns, enqueued, len(body)), body)


def sums(reply: Reply) -> list[float]:
    assert reply.status == 200, reply.body
    return orjson.loads(reply.body)["outputs"][0]["data"]


def test_a_single_request_and_a_batch_answer_the_same_bytes() -> None:
    bodies = [(Kind.REST, rest("a", [[1, 2]])), (Kind.GRPC, grpc("b", [[3, 4], [5, 6]])),
              (Kind.REST, rest("c", [[7, 8]]))]  # fmt: skip
    model = make_model()
    alone = [run_group(model, [job(body, kind)])[0] for kind, body in bodies]
    assert model.runtime.calls == [1, 2, 1]
    batched = run_group(model, [job(body, kind) for kind, body in bodies])
    assert model.runtime.calls[3:] == [4]  # REST and gRPC payloads joined: one predict
    assert [r.status for r in batched] == [200, 200, 200]
    assert [r.body for r in batched] == [r.body for r in alone]
    assert [r.json_length for r in batched] == [r.json_length for r in alone]
    response = pb.ModelInferResponse.FromString(batched[1].body)
    assert response.id == "b" and list(response.outputs[0].contents.fp64_contents) == [7, 11]


@pytest.mark.parametrize("size", [1, 3])
def test_every_stage_is_timed_for_one_request_and_for_a_batch(size: int) -> None:
    replies = run_group(make_model(), [job(rest(str(i), [[i, 1]])) for i in range(size)])
    for reply in replies:
        times = reply.times
        assert times is not None
        assert times.queue >= 1000
        assert times.compute_input > 0 and times.compute_infer > 0 and times.compute_output > 0
    # A batch's members share one predict, so one compute_infer.
    assert len({reply.times.compute_infer for reply in replies if reply.times}) == 1


def test_an_expired_job_is_504_and_the_others_are_answered() -> None:
    model = make_model()
    expired = job(rest("late", [[1, 1]]), deadline_ns=time.monotonic_ns() - 1)
    replies = run_group(model, [job(rest("a", [[1, 1]])), expired, job(rest("b", [[2, 2]]))])
    assert [r.status for r in replies] == [200, 504, 200]
    assert replies[1].body == b"the request's deadline passed while it was queued"
    assert sums(replies[0]) == [2.0] and sums(replies[2]) == [4.0]
    assert model.runtime.calls == [2]
    # Alone, and a deadline not yet passed.
    now = time.monotonic_ns()
    (alone,) = run_group(model, [job(rest("x", [[1, 1]]), deadline_ns=now - 1)])
    assert alone.status == 504
    (later,) = run_group(model, [job(rest("y", [[1, 1]]), deadline_ns=now + 10**10)])
    assert later.status == 200


def test_custom_endpoints_go_through_the_same_entry(caplog: pytest.LogCaptureFixture) -> None:
    model = make_model()
    jobs = [
        job(custom_body("double", b"[1, 2.5]"), Kind.CUSTOM),
        job(custom_body("raw", b"abc"), Kind.CUSTOM),
        job(rest("a", [[1, 1]])),
        job(custom_body("missing", b"{}"), Kind.CUSTOM),
        job(custom_body("fail", b"{}"), Kind.CUSTOM),
        job(custom_body("fail", b"bad"), Kind.CUSTOM),
        job(custom_body("double", b"[1]"), Kind.CUSTOM, deadline_ns=time.monotonic_ns() - 1),
    ]
    with caplog.at_level(logging.ERROR):
        replies = run_group(model, jobs)
    assert [r.status for r in replies] == [200, 200, 200, 404, 500, 400, 504]
    answers = [read_answer(reply.body, reply.json_length) for reply in replies]
    assert orjson.loads(answers[0][1]) == {"doubled": [2.0, 5.0]}
    # The dict API answers JSON whatever the bytes (MLflow's scoring endpoint relies on it).
    head, body = answers[1]
    assert body == b"cba" and head.content_type == "application/json"
    assert sums(replies[2]) == [2.0]
    assert answers[3] is None  # an error: the message alone
    assert replies[3].body == b"model 'sums' has no endpoint '/missing'"
    assert replies[4].body == b"model 'sums' raised ZeroDivisionError: division by zero"
    assert replies[5].body == b"fail: that body is refused"
    # The endpoint's bug is logged with its traceback; the refusal is the client's error.
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [ZeroDivisionError]
    times = replies[0].times
    assert times is not None and times.queue >= 1000 and times.compute_infer > 0


def test_explain_is_answered_by_the_runtime_or_refused_with_the_reason() -> None:
    class OwnExplain(Sums):
        def custom_endpoints(self):
            return {"explain": lambda body: {"own": True}}

    body = custom_body("explain", rest("a", [[1, 1]]))
    (refused,) = run_group(make_model(), [job(body, Kind.CUSTOM)])
    assert refused.status == 400
    assert refused.body == b"model 'sums' cannot explain: the custom runtime has no explainer"
    (own,) = run_group(loaded_sums_model(OwnExplain), [job(body, Kind.CUSTOM)])
    answer = read_answer(own.body, own.json_length)
    assert own.status == 200 and answer is not None and orjson.loads(answer[1]) == {"own": True}


def test_a_request_the_model_rejects_is_400_and_the_rest_of_its_batch_is_200() -> None:
    model = make_model()
    replies = run_group(model, [job(rest("a", [[1, 1]])), job(rest("b", [[-1, 2]])),
                                job(rest("c", [[3, 3], [4, 4]]))])  # fmt: skip
    assert [r.status for r in replies] == [200, 400, 200]
    assert replies[1].body == b"model 'sums' rejected input 'x': Input contains negative values."
    assert sums(replies[0]) == [2.0] and sums(replies[2]) == [6.0, 8.0]
    assert model.runtime.calls == [4, 1, 1, 2]  # joined once, then each alone
    (alone,) = run_group(model, [job(rest("d", [[-1, 2]]))])
    assert (alone.status, alone.body) == (400, replies[1].body)


def test_an_unexpected_exception_while_encoding_is_a_logged_500(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    respond = inference.respond

    def broken(model, request, result):
        if request.id == "b":
            raise RuntimeError("the encoder broke")
        return respond(model, request, result)

    monkeypatch.setattr(inference, "respond", broken)
    with caplog.at_level(logging.ERROR):
        replies = run_group(make_model(), [job(rest("a", [[1, 1]])), job(rest("b", [[2, 2]]))])
    assert [r.status for r in replies] == [200, 500]
    assert replies[1].body == b"internal error: RuntimeError: the encoder broke"
    assert replies[1].times is None
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [RuntimeError]


def test_an_unknown_wire_format_is_a_500_for_that_request_only() -> None:
    replies = run_group(make_model(), [job(b"?", kind=99), job(rest("a", [[1, 1]]))])
    assert replies[0].status == 500
    assert replies[0].body == (
        b"internal error: UnknownWireFormat: no wire format for request kind 99: no such kind"
    )
    assert sums(replies[1]) == [2.0]


def test_without_batching_each_request_is_predicted_alone() -> None:
    model = make_model(max_batch_size=1)
    replies = run_group(model, [job(rest(str(i), [[i, i]])) for i in range(3)])
    assert [sums(r) for r in replies] == [[0.0], [2.0], [4.0]]
    assert model.runtime.calls == [1, 1, 1]


def test_workers_0_runs_the_same_path() -> None:
    client = InProcessClient(ServerSettings(workers=0))
    client.models["sums"] = make_model()
    body = rest("a", [[1, 2]])
    reply = asyncio.run(client._infer("sums", Kind.REST, body, None, None))
    assert reply.body == run_group(make_model(), [job(body)])[0].body
    assert reply.times is not None and reply.times.compute_infer > 0
    late = asyncio.run(client._infer("sums", Kind.REST, body, None, time.monotonic() - 1))
    assert late.status == 504


class NotOurs(Exception):
    """Named like the tree's RuntimeNotFound, but not in the tree."""


NotOurs.__name__ = "RuntimeNotFound"


class MissingArtefact(ModelLoadError):
    pass


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ModelLoadError("model 'm': corrupt artefact\ndetails"), "model 'm': corrupt artefact"),
        (RuntimeNotFound("no model artefact in /m"), "no model artefact in /m"),
        (MissingArtefact("no model.joblib"), "no model.joblib"),
        (NotOurs("no runtime"), "RuntimeNotFound: no runtime"),
        (ValueError("\n bad pickle\nmore"), "ValueError: bad pickle"),
        (ImportError(), "ImportError"),
    ],
)  # fmt: skip
def test_failure_reason_tells_errors_apart_by_class(error: Exception, reason: str) -> None:
    assert failure_reason(error) == reason
