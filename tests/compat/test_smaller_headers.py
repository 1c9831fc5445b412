"""Request headers in ``parameters.headers`` for a user's runtime (issue 13, smaller
breaks), as MLServer passes them: the HTTP headers over REST, the invocation metadata over
gRPC (both gRPC servers), replacing any ``headers`` the client put in the parameters, and
never echoed back in the response."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.support import Server, build_iris_repository, write_custom_model

# Answers the parameters.headers it was given, as one JSON document.
HEADERS_RUNTIME = """
    import json

    import numpy as np

    from inferpool import Runtime, TensorSpec


    class Headers(Runtime):
        accepts = "request"

        def load(self):
            pass

        def outputs(self):
            return [TensorSpec("headers", "BYTES", [1])]

        def predict(self, request, outputs):
            seen = request.parameters.get("headers")
            document = json.dumps(seen, sort_keys=True).encode()
            return {"headers": np.array([document], dtype=object)}
"""
X = {"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [5.1, 3.5, 1.4, 0.2]}


@pytest.fixture(scope="module", params=["builtin", "grpcio"])
def server(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = build_iris_repository(tmp_path_factory.mktemp("headers-repo"))
    write_custom_model(root / "headers", HEADERS_RUNTIME, "Headers")
    implementation = ("--grpc-implementation", request.param)
    with Server(root, "--workers", "1", *implementation) as server:
        server.wait_ready()
        yield server


def rest_headers(
    server: Server, headers: dict[str, str], parameters: dict | None = None
) -> tuple[dict, dict]:
    document: dict = {"inputs": [X]}
    if parameters:
        document["parameters"] = parameters
    response = httpx.post(
        server.url + "/v2/models/headers/infer", json=document, headers=headers, timeout=30
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    return json.loads(answer["outputs"][0]["data"][0]), answer.get("parameters", {})


def test_rest_headers_reach_the_runtime(server):
    seen, _ = rest_headers(server, {"X-Trace-Id": "abc-123", "Authorization": "Bearer t"})
    assert seen["x-trace-id"] == "abc-123"
    assert seen["authorization"] == "Bearer t"
    assert seen["content-type"] == "application/json"
    assert seen["host"] == f"127.0.0.1:{server.http_port}"


def test_client_sent_parameters_headers_are_replaced_and_never_echoed(server):
    seen, parameters = rest_headers(
        server, {"X-Real": "1"}, {"headers": {"x-forged": "yes"}, "tag": "kept"}
    )
    assert "x-forged" not in seen
    assert seen["x-real"] == "1"
    assert parameters == {"tag": "kept"}  # the other parameters echo as before


def test_binary_tensor_requests_carry_headers_too(server):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    x = triton.InferInput("x", [1, 4], "FP64")
    x.set_data_from_numpy(np.array([X["data"]]), binary_data=True)
    result = client.infer(
        "headers",
        [x],
        outputs=[triton.InferRequestedOutput("headers", binary_data=True)],
        headers={"x-binary": "yes"},
    )
    assert json.loads(result.as_numpy("headers")[0])["x-binary"] == "yes"


def test_grpc_metadata_reaches_the_runtime(server):
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(server.grpc_address)
    x = triton.InferInput("x", [1, 4], "FP64")
    x.set_data_from_numpy(np.array([X["data"]]))
    result = client.infer("headers", [x], headers={"x-trace-id": "grpc-7", "x-tenant": "acme"})
    seen = json.loads(result.as_numpy("headers")[0])
    assert seen["x-trace-id"] == "grpc-7"
    assert seen["x-tenant"] == "acme"
    assert not any(key.startswith(":") for key in seen)  # no HTTP/2 pseudo-headers
    assert "headers" not in result.get_response().parameters


def test_built_in_runtimes_answer_as_before(server):
    response = httpx.post(
        server.url + "/v2/models/iris-logreg/infer",
        json={"inputs": [X], "parameters": {"tag": "kept"}},
        headers={"X-Trace-Id": "abc"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["parameters"] == {"tag": "kept"}
    unknown = httpx.post(server.url + "/v2/models/nope/infer", json={"inputs": [X]})
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "model 'nope' not found"}
