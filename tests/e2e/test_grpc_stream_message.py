"""ModelStreamInfer answers Triton's clients with ``ModelStreamInferResponse`` and
MLServer's with bare ``ModelInferResponse`` messages (``frontends/grpc/stream_message.py``):
tritonclient's ``start_stream``/``async_stream_infer`` and a plain grpcio client written as
MLServer's streaming example is (typed contents, responses parsed as ModelInferResponse),
against the example's text model, on both gRPC servers; inferpool's own runtimes keeping
Triton's message for typed contents; ``--grpc-stream-response`` forcing either message."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton

from inferpool.frontends.grpc.stream_message import speaks_mlserver
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, write_custom_model
from tests.support.grpc import needs_pool

STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"

# MLServer's streaming example (docs/examples/streaming/text_model.py), its imports on
# inferpool.mlserver: one word of the prompt per response.
TEXT_MODEL = """
    import asyncio
    from typing import AsyncIterator
    from inferpool.mlserver import MLModel
    from inferpool.mlserver.types import InferenceRequest, InferenceResponse
    from inferpool.mlserver.codecs import StringCodec


    class TextModel(MLModel):

        async def predict_stream(
            self, payloads: AsyncIterator[InferenceRequest]
        ) -> AsyncIterator[InferenceResponse]:
            payload = [_ async for _ in payloads][0]
            text = StringCodec.decode_input(payload.inputs[0])[0]
            words = text.split(" ")

            split_text = []
            for i, word in enumerate(words):
                split_text.append(word if i == 0 else " " + word)

            for word in split_text:
                await asyncio.sleep(0.01)
                yield InferenceResponse(
                    model_name=self._settings.name,
                    outputs=[
                        StringCodec.encode_output(
                            name="output",
                            payload=[word],
                            use_bytes=True,
                        ),
                    ],
                )
"""
PROMPT = "What is the capital of France?"
WORDS = ["What", " is", " the", " capital", " of", " France?"]


# The README's streaming runtime: an inferpool Runtime, one word per chunk.
WORDS_MODEL = """
    import numpy as np

    from inferpool import Runtime


    class Words(Runtime):
        def load(self):
            pass

        def predict(self, payload, outputs):
            return {"text_output": np.array([" ".join(payload)], dtype=object)}

        async def predict_stream(self, payloads):
            async for payload in payloads:
                for word in payload[0].split(" "):
                    yield {"text_output": np.array([word], dtype=object)}
"""


def repository(root):
    write_custom_model(root / "text-model", TEXT_MODEL, "TextModel", module="text_model")
    spec = {"name": "text_input", "datatype": "BYTES", "shape": [-1]}
    inputs = [{**spec, "parameters": {"content_type": "str"}}]
    outputs = [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]
    write_custom_model(
        root / "words", WORDS_MODEL, "Words", module="words", inputs=inputs, outputs=outputs
    )
    return root


# Both gRPC servers; the model's runtime kind reaches the frontend in-process and from a
# worker pool.
SETUPS = [
    pytest.param(("builtin", 0), id="builtin-w0"),
    pytest.param(("grpcio", 2), id="grpcio-w2", marks=needs_pool),
]


@pytest.fixture(scope="module", params=SETUPS)
def server(request, tmp_path_factory) -> Iterator[Server]:
    root = repository(tmp_path_factory.mktemp("stream-message"))
    implementation, workers = request.param
    flags = ("--workers", str(workers), "--grpc-implementation", implementation)
    with Server(root, *flags) as running:
        running.wait_ready()
        yield running


def mlserver_request(model: str = "text-model") -> pb.ModelInferRequest:
    """What MLServer's ModelInferRequestConverter makes of the example's request: typed
    ``bytes_contents``, no raw contents."""
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="prompt", datatype="BYTES", shape=[1])
    tensor.parameters["content_type"].string_param = "str"
    tensor.contents.bytes_contents.append(PROMPT.encode())
    request.outputs.add(name="output")
    return request


def raw_request() -> pb.ModelInferRequest:
    """The same request as Triton's clients send it: BYTES serialized in raw contents."""
    request = pb.ModelInferRequest(model_name="text-model")
    request.inputs.add(name="prompt", datatype="BYTES", shape=[1])
    encoded = PROMPT.encode()
    request.raw_input_contents.append(len(encoded).to_bytes(4, "little") + encoded)
    return request


def call(server: Server, requests: list[pb.ModelInferRequest], message) -> list:
    """The messages a ModelStreamInfer call answers, each parsed as ``message``."""
    with grpc.insecure_channel(server.grpc_address) as channel:
        method = channel.stream_stream(
            STREAM_METHOD,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=message.FromString,
        )
        return list(method(iter(requests), timeout=30))


def words_of(response: pb.ModelInferResponse) -> str:
    (output,) = response.outputs
    if output.contents.bytes_contents:
        return output.contents.bytes_contents[0].decode()
    raw = response.raw_output_contents[0]
    return raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode()


def test_mlserver_clients_get_model_infer_responses(server: Server) -> None:
    # As MLServer's example: the stub's response type is ModelInferResponse.
    answers = call(server, [mlserver_request()], pb.ModelInferResponse)
    assert [words_of(answer) for answer in answers] == WORDS
    assert all(answer.model_name == "text-model" for answer in answers)


def test_tritonclient_gets_model_stream_infer_responses(server: Server) -> None:
    results: queue.Queue = queue.Queue()
    client = triton.InferenceServerClient(server.grpc_address)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        prompt = triton.InferInput("prompt", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
        client.async_stream_infer("text-model", [prompt])
        # The example's predict_stream reads the whole stream (MLServer's semantics: one
        # call per client stream) before it answers: the client ends its stream first.
        client.stop_stream()
        received = [results.get(timeout=30) for _ in WORDS]
    finally:
        client.stop_stream()
        client.close()
    assert [error for _, error in received] == [None] * len(WORDS)
    words = [result.as_numpy("output").ravel()[0].decode() for result, _ in received]
    assert words == WORDS


def test_an_mlserver_call_that_fails_ends_with_its_status(server: Server) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        call(server, [mlserver_request("nope")], pb.ModelInferResponse)
    assert failure.value.code() == grpc.StatusCode.NOT_FOUND
    assert "nope" in failure.value.details()


def test_a_triton_call_that_fails_answers_an_error_message(server: Server) -> None:
    request = raw_request()
    request.model_name = "nope"
    (answer,) = call(server, [request], pb.ModelStreamInferResponse)
    assert answer.error_message == "model 'nope' not found"


@pytest.mark.parametrize(
    ("setting", "request_of", "message"),
    [
        ("mlserver", raw_request, pb.ModelInferResponse),
        ("triton", mlserver_request, pb.ModelStreamInferResponse),
    ],
)
def test_the_setting_forces_one_message(tmp_path, setting, request_of, message) -> None:
    root = repository(tmp_path)
    with Server(root, "--workers", "0", "--grpc-stream-response", setting) as running:
        running.wait_ready()
        answers = call(running, [request_of()], message)
    if message is pb.ModelStreamInferResponse:
        assert not any(answer.error_message for answer in answers)
        answers = [answer.infer_response for answer in answers]
    assert [words_of(answer) for answer in answers] == WORDS


def test_auto_reads_the_first_requests_contents_and_model() -> None:
    typed, raw = mlserver_request().SerializeToString(), raw_request().SerializeToString()
    assert speaks_mlserver("auto", typed, True)
    assert speaks_mlserver("auto", typed, None)  # an unknown model: its error ends the call
    assert not speaks_mlserver("auto", typed, False)  # inferpool's own runtimes: Triton's
    assert not speaks_mlserver("auto", raw, True)
    # No inputs, or bytes that are no message: Triton's (the error is reported in it).
    empty = pb.ModelInferRequest(model_name="m").SerializeToString()
    assert not speaks_mlserver("auto", empty, True)
    assert not speaks_mlserver("auto", b"\xff\xff", None)
    assert speaks_mlserver("mlserver", raw, False)
    assert not speaks_mlserver("triton", typed, True)


def test_inferpools_own_runtimes_keep_tritons_message(server: Server) -> None:
    # The README's client: typed contents, Triton's message, to an inferpool Runtime.
    request = mlserver_request("words")
    request.inputs[0].name = "text_input"
    del request.outputs[:]
    answers = call(server, [request], pb.ModelStreamInferResponse)
    assert not any(answer.error_message for answer in answers)
    assert [words_of(answer.infer_response) for answer in answers] == PROMPT.split(" ")
