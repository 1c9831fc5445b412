"""Admission from the headers (REST) and from a ModelInfer's first bytes (gRPC): which
requests the frontends ask the engine about, and what they answer for a refusal."""

from __future__ import annotations

from types import SimpleNamespace

from inferpool.engine.ipc.messages import Kind
from inferpool.errors import InferpoolError, ModelNotFound, Overloaded
from inferpool.frontends.grpc.early import CallAdmission, peek_route
from inferpool.frontends.rest.early import TARGETS_KEPT, HeaderAdmission, header_admission
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.transport.http2_streams import Stream


def client(
    refused: dict[tuple[str, str | None], InferpoolError],
) -> tuple[object, list[tuple[str, str | None, int]]]:
    """A stand-in engine client whose ``inference.refusal`` refuses what ``refused`` says,
    recording every question."""
    asked: list[tuple[str, str | None, int]] = []

    def refusal(name: str, version: str | None, kind: int) -> InferpoolError | None:
        asked.append((name, version, kind))
        return refused.get((name, version))

    return SimpleNamespace(inference=SimpleNamespace(refusal=refusal)), asked


def test_only_infer_paths_are_asked_about_and_refusals_carry_retry_after_and_id() -> None:
    fake, asked = client({("m", None): Overloaded("m is overloaded"), ("m", "2"): None})  # type: ignore[dict-item]
    admission = HeaderAdmission(fake)  # type: ignore[arg-type]
    for url in (b"/v2/models/m/ready", b"/v2/health/live", b"/v2/models/m/versions/2/infer"):
        assert admission(url, []) is None
    assert admission(b"/v2/models/m/infer?x=1", [(b"x-request-id", b"abc")]) == (
        503,
        "m is overloaded",
        b"retry-after: 1\r\nx-request-id: abc\r\n",
    )
    assert asked == [("m", "2", Kind.REST), ("m", None, Kind.REST)]
    asked.clear()
    admission(b"/v2/models/a%20b/infer", [])  # percent-decoded as the app's path is
    assert asked == [("a b", None, Kind.REST)]
    # An unusable client id is replaced by a new one (the usual path would answer 400).
    status, _, lines = admission(b"/v2/models/m/infer", [(b"x-request-id", b"\x01")]) or (
        0,
        "",
        b"",
    )
    assert status == 503 and b"x-request-id: \x01" not in lines and b"x-request-id: " in lines


def test_request_targets_read_are_remembered_within_a_bound() -> None:
    fake, asked = client({})
    admission = HeaderAdmission(fake)  # type: ignore[arg-type]
    for index in range(TARGETS_KEPT + 10):
        assert admission(b"/v2/models/m%d/infer" % index, []) is None
    assert len(admission.targets) <= TARGETS_KEPT
    assert admission(b"/v2/models/m5/infer", []) is None and asked[-1][0] == "m5"


def test_no_header_admission_where_keys_or_middleware_must_see_the_request() -> None:
    fake, _ = client({})
    assert header_admission(fake, middleware=True, keys=None) is None  # type: ignore[arg-type]
    assert header_admission(fake, middleware=False, keys=object()) is None  # type: ignore[arg-type]
    assert header_admission(fake, middleware=False, keys=None) is not None  # type: ignore[arg-type]


def framed(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def test_the_route_is_peeked_from_the_first_bytes_of_a_model_infer_request() -> None:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1000])
    whole = pb.ModelInferRequest(
        model_name="iris", model_version="3", inputs=[tensor], raw_input_contents=[b"\0" * 4000]
    ).SerializeToString()
    assert peek_route(framed(whole)) == ("iris", "3")
    assert peek_route(framed(whole)[:20]) == ("iris", "3")
    assert peek_route(framed(whole)[:9]) is None  # the name not whole yet
    unversioned = pb.ModelInferRequest(model_name="iris", inputs=[tensor]).SerializeToString()
    assert peek_route(framed(unversioned)) == ("iris", None)
    named_only = pb.ModelInferRequest(model_name="iris").SerializeToString()
    assert peek_route(framed(named_only)) == ("iris", None)  # the whole message
    assert peek_route(framed(named_only + b"\x12\x01")) is None  # a version cut short
    compressed = b"\x01" + framed(whole)[1:]
    assert peek_route(compressed) is None
    no_name = pb.ModelInferRequest(inputs=[tensor]).SerializeToString()
    assert peek_route(framed(no_name)) is None


def test_a_refused_model_infer_is_answered_trailers_only_with_its_status() -> None:
    refused = {("gone", None): ModelNotFound("model 'gone' not found")}
    fake, asked = client(refused)  # type: ignore[arg-type]
    admission = CallAdmission(fake, b"/inference.GRPCInferenceService/ModelInfer")  # type: ignore[arg-type]
    stream = Stream(1, 65535)
    stream.headers = [(b":path", b"/inference.GRPCInferenceService/ModelInfer")]
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1000])
    request = pb.ModelInferRequest(
        model_name="gone", inputs=[tensor], raw_input_contents=[b"0" * 4000]
    )
    message = framed(request.SerializeToString())
    block = admission(stream, message[:100])  # its first frame: more of it to come
    assert block is not None and b"grpc-status" in block and b"x-request-id" in block
    # Whole in its first frame: nothing to drop unread, the usual path answers it.
    assert admission(stream, message) is None
    stream.headers = [(b":path", b"/inference.GRPCInferenceService/ModelReady")]
    assert admission(stream, message[:100]) is None  # only ModelInfer
    assert asked == [("gone", None, Kind.GRPC)]
