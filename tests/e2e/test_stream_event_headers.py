"""REST stream events carry the ``parameters.headers`` MLServer puts in each
InferenceResponse (``frontends/rest/stream_headers.py``): the model's own headers and the
CloudEvents ones, over ``infer_stream`` and ``generate_stream`` with MLServer's streaming
example's request; Triton's flat generate events stay as they are."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.support import Server, write_custom_model

# MLServer's streaming example's model, plus a header of its own on every response.
TEXT_MODEL = """
    from inferpool.mlserver import MLModel
    from inferpool.mlserver.codecs import StringCodec
    from inferpool.mlserver.types import InferenceResponse, Parameters


    class TextModel(MLModel):
        async def predict_stream(self, payloads):
            payload = [_ async for _ in payloads][0]
            text = StringCodec.decode_input(payload.inputs[0])[0]
            for i, word in enumerate(text.split(" ")):
                yield InferenceResponse(
                    model_name=self._settings.name,
                    parameters=Parameters(headers={"x-word": str(i)}),
                    outputs=[StringCodec.encode_output("output", [word], use_bytes=True)],
                )
"""
# MLServer's docs/examples/streaming/generate-request.json
REQUEST = {
    "inputs": [
        {
            "name": "prompt",
            "shape": [1],
            "datatype": "BYTES",
            "data": ["What is the capital of France?"],
            "parameters": {"content_type": "str"},
        }
    ],
    "outputs": [{"name": "output"}],
}
CE_KEYS = {
    "Ce-Specversion",
    "Ce-Source",
    "Ce-Type",
    "Ce-Modelid",
    "Ce-Inferenceservicename",
    "Ce-Endpoint",
    "Ce-Id",
    "Ce-Requestid",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("event-headers")
    write_custom_model(root / "text-model", TEXT_MODEL, "TextModel", module="text_model")
    with Server(root, "--workers", "0") as running:
        running.wait_ready()
        yield running


def events(server: Server, route: str, body: dict) -> list[dict]:
    url = f"{server.url}/v2/models/text-model/{route}"
    response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == 200, response.text
    return [
        orjson.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]


@pytest.mark.parametrize("route", ["infer_stream", "generate_stream"])
def test_each_event_has_mlservers_headers(server: Server, route: str) -> None:
    received = events(server, route, {**REQUEST, "id": "req-1"})
    assert len(received) == 6
    for i, event in enumerate(received):
        headers = event["parameters"]["headers"]
        assert set(headers) == CE_KEYS | {"x-word"}
        assert headers["x-word"] == str(i)  # the model's own, kept
        assert headers["Ce-Type"] == "io.seldon.serving.inference.response"
        assert headers["Ce-Modelid"] == headers["Ce-Endpoint"] == "text-model"
        assert headers["Ce-Id"] == headers["Ce-Requestid"] == "req-1"
        assert headers["Ce-Specversion"] == "0.3"


def test_a_request_without_id_gets_the_calls_id(server: Server) -> None:
    url = f"{server.url}/v2/models/text-model/infer_stream"
    response = httpx.post(url, json=REQUEST, timeout=30)
    given = response.headers["x-request-id"]
    first = orjson.loads(response.text.splitlines()[0][len("data: ") :])
    assert first["parameters"]["headers"]["Ce-Id"] == first.get("id", given)


def test_flat_generate_events_are_left_alone(server: Server) -> None:
    received = events(server, "generate_stream", {"prompt": "a b"})
    assert [event["output"] for event in received] == ["a", "b"]
    assert all("parameters" not in event for event in received)
