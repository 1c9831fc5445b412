"""``/v2/models/{model}/explain`` of a model whose settings name an explainer model
(``parameters.extra.explainer``, ``frontends/endpoints.py``): the explainer's inference of
the same request body, on an in-process engine (``--workers 0``) over REST and gRPC's
CustomService. The explainer here is a custom runtime that calls the model it explains
(as an alibi explainer does: tests/environments/test_alibi_explain.py), so the chain
"client -> explainer -> model" runs through the engine and is not refused as a cycle."""

from __future__ import annotations

import asyncio
import json
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
from tests.support import build_iris_repository, write_custom_model

EXPLAINER = """
    import json

    import numpy as np

    from inferpool import Runtime
    from inferpool.calls import infer
    from inferpool.runtimes.base import Answer


    class Explainer(Runtime):
        accepts = "request"

        def load(self):
            pass

        def predict(self, request, outputs):
            rows = np.asarray(request.inputs[0].data).reshape(request.inputs[0].shape)
            answer = infer("iris-logreg", {"x": rows}, outputs=["predict_proba"])
            proba = answer["outputs"][0]["data"].tolist()
            # An alibi explainer's headers (parameters.headers, as MLServer's sets them).
            headers = {"x-seldon-alibi-type": "explanation"}
            return Answer({"explanation": [json.dumps({"explained": proba})]}, {"headers": headers})
"""

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
FLAT = [value for row in ROWS for value in row]
BODY = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [2, 4], "data": FLAT}]}


def name_explainer(folder: Any, explainer: str) -> None:
    settings = {"name": folder.name, "parameters": {"extra": {"explainer": explainer}}}
    (folder / "model-settings.json").write_text(json.dumps(settings))


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = build_iris_repository(tmp_path_factory.mktemp("forwarding"))
    write_custom_model(root / "explainer", EXPLAINER, "Explainer")
    name_explainer(root / "iris-logreg", "explainer")
    name_explainer(root / "iris-rf", "no-such-explainer")

    async def main() -> dict[str, Any]:
        settings = ServerSettings(model_repository=root, workers=0, load_probe=False)
        client = InProcessClient(settings)
        await client.start()
        try:
            transport = httpx.ASGITransport(app=build_app(client))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                out: dict[str, Any] = {}
                for model in ("iris-logreg", "iris-rf", "explainer"):
                    out[model] = await http.post(f"/v2/models/{model}/explain", json=BODY)
                binary = {**BODY, "parameters": {"binary_data_output": True}}
                out["binary"] = await http.post("/v2/models/iris-logreg/explain", json=binary)
                out["direct"] = await http.post("/v2/models/iris-logreg/infer", json={
                    **BODY, "outputs": [{"name": "predict_proba"}]})  # fmt: skip
                services = ExtensionServices(DataPlane(client))
                request = ext.CallRequest(
                    model_name="iris-logreg", path="explain", body=json.dumps(BODY).encode()
                )
                out["grpc"] = await services.call(request, None)
                try:
                    request.model_name = "iris-rf"
                    out["grpc missing"] = await services.call(request, None)
                except InferpoolError as exc:
                    out["grpc missing"] = (exc.status, exc.message)
                return out
        finally:
            await client.close()

    return asyncio.run(main())


def test_explain_is_the_named_explainers_inference(answers: dict[str, Any]) -> None:
    answer = answers["iris-logreg"]
    assert answer.status_code == 200, answer.text
    document = answer.json()
    assert document["model_name"] == "explainer"  # answered by the explainer
    # The headers it set are HTTP headers, as /infer sends them, not in the JSON.
    assert answer.headers["x-seldon-alibi-type"] == "explanation"
    assert "headers" not in document.get("parameters", {})
    assert answers["binary"].headers["x-seldon-alibi-type"] == "explanation"
    [output] = document["outputs"]
    assert output["name"] == "explanation"
    # The explainer called the model it explains: its probabilities, through the engine.
    direct = answers["direct"].json()["outputs"][0]["data"]
    explained = json.loads(output["data"][0])["explained"]
    assert [p for row in explained for p in row] == pytest.approx(direct)


def test_binary_outputs_come_in_tritons_form_as_from_infer(answers: dict[str, Any]) -> None:
    answer = answers["binary"]
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/octet-stream"
    length = int(answer.headers["inference-header-content-length"])
    [output] = json.loads(answer.content[:length])["outputs"]
    size = output["parameters"]["binary_data_size"]
    assert len(answer.content) == length + size
    # One BYTES element: its 4-byte length, then the explanation's JSON.
    explanation = answer.content[length + 4 :]
    assert json.loads(explanation) == json.loads(
        answers["iris-logreg"].json()["outputs"][0]["data"][0]
    )


def test_grpc_custom_service_forwards_the_same(answers: dict[str, Any]) -> None:
    reply = answers["grpc"]
    assert reply.status_code == 200 and reply.content_type == "application/json"
    assert reply.headers["x-seldon-alibi-type"] == "explanation"  # the explainer's
    grpc_output = json.loads(reply.body)["outputs"][0]
    assert grpc_output == answers["iris-logreg"].json()["outputs"][0]


def test_a_missing_explainer_is_a_404_naming_it(answers: dict[str, Any]) -> None:
    answer = answers["iris-rf"]
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error.startswith("model 'iris-rf' names explainer 'no-such-explainer': ")
    status, message = answers["grpc missing"]
    assert status == 404 and "names explainer 'no-such-explainer'" in message


def test_a_model_naming_no_explainer_keeps_its_own_explain(answers: dict[str, Any]) -> None:
    # The explainer (a custom runtime) names none: its own runtime's answer, a 400 saying why.
    answer = answers["explainer"]
    assert answer.status_code == 400, answer.text
    assert "cannot explain" in answer.json()["error"]
