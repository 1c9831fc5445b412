"""Which message ``ModelStreamInfer`` answers with (``frontends/grpc/stream_message.py``),
read back with protobuf's own classes: the setting, the first request's tensors (typed
contents or raw), the model's runtime, and the wrapped answers and errors."""

from __future__ import annotations

import pytest

from inferpool.frontends.grpc.stream_message import (
    AUTO,
    MLSERVER,
    TRITON,
    response_message,
    speaks_mlserver,
    stream_error,
)
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb


def typed() -> bytes:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    return request.SerializeToString()


def raw() -> bytes:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\x00\x00\x80?")
    return request.SerializeToString()


@pytest.mark.parametrize(
    ("setting", "first", "mlmodel", "expected"),
    [
        (MLSERVER, raw(), False, True),  # the setting decides alone
        (TRITON, typed(), True, False),
        (AUTO, typed(), True, True),  # typed contents to an MLModel: MLServer's client
        (AUTO, typed(), None, True),  # to no model it knows: its error ends the call
        (AUTO, typed(), False, False),  # inferpool's own runtime keeps Triton's message
        (AUTO, raw(), True, False),  # raw contents: Triton's clients
        (AUTO, pb.ModelInferRequest(model_name="m").SerializeToString(), True, False),
        (AUTO, b"\xff\xff\xff", True, False),  # malformed: reported by routing, not here
    ],
)
def test_the_message_is_chosen_by_setting_request_and_model(
    setting: str, first: bytes, mlmodel: bool | None, expected: bool
) -> None:
    assert speaks_mlserver(setting, first, mlmodel) is expected


def test_tritons_message_wraps_the_answer_and_carries_errors() -> None:
    answer = pb.ModelInferResponse(model_name="m", id="r" * 300)  # a length over one byte
    body = answer.SerializeToString()
    assert response_message(body, mlserver=True) == body
    wrapped = pb.ModelStreamInferResponse.FromString(response_message(body, mlserver=False))
    assert wrapped.infer_response == answer and wrapped.error_message == ""
    error = pb.ModelStreamInferResponse.FromString(stream_error("model 'm' not found"))
    assert error.error_message == "model 'm' not found"
