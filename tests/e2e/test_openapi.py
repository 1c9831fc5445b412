"""The OpenAPI documents and Swagger UI on a live server (rest/docs.py): the server's and
each model's document fetched over HTTP and validated as OpenAPI 3.0, a model's schemas
against its metadata (and a real request and answer against them), custom endpoints with
their methods, 404s, a reload that changes a model's inputs, and the page and its assets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

from tests.support import Server, iris_data, write_custom_model, write_sklearn_model

SOURCE = """
import numpy as np

import inferpool
from inferpool import EndpointRequest, custom_endpoint


class Reports(inferpool.Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        return {outputs[0]: np.asarray(payload).sum(axis=1)}

    @custom_endpoint("/status", methods=["GET"])
    def status(self, request: EndpointRequest):
        return {"model": self.name}

    @custom_endpoint("/reports/latest", methods=["GET", "POST"])
    def latest(self, request: EndpointRequest):
        return {"rows": 0}
"""


def tensors(inputs: int) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, inputs]}],
        "outputs": [{"name": "total", "datatype": "FP32", "shape": [-1]}],
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("openapi")
    X, y = iris_data()
    write_sklearn_model(root / "iris", LogisticRegression(max_iter=1000).fit(X, y))
    write_custom_model(
        root / "reports", SOURCE, "Reports", parameters={"version": "v1"}, **tensors(3)
    )
    write_custom_model(root / "mutable", SOURCE, "Reports", module="mutable_rt", **tensors(2))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[Server]:
    with Server(repository, "--workers", "1") as running:
        running.wait_ready(120)
        yield running


def fetch_document(url: str) -> dict[str, Any]:
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    validate(document)  # a valid OpenAPI 3.0 document, or it raises saying why
    return document


def validator(document: dict[str, Any], name: str) -> OAS30Validator:
    schema = {**document["components"]["schemas"][name], "components": document["components"]}
    return OAS30Validator(schema)


def test_the_server_document_describes_the_v2_api(server):
    document = fetch_document(server.url + "/v2/docs/dataplane.json")
    assert document["openapi"].startswith("3.0")
    paths = document["paths"]
    for path, method in [
        ("/v2/health/live", "get"),
        ("/v2/health/ready", "get"),
        ("/v2", "get"),
        ("/v2/models/{model_name}", "get"),
        ("/v2/models/{model_name}/versions/{model_version}/ready", "get"),
        ("/v2/models/{model_name}/infer", "post"),
        ("/v2/models/{model_name}/infer_stream", "post"),
        ("/v2/models/{model_name}/generate", "post"),
        ("/v2/repository/index", "post"),
        ("/v2/repository/models/{model_name}/unload", "post"),
        ("/v2/models/{model_name}/{endpoint}", "get"),
    ]:
        assert method in paths[path], (path, method)
    for name in ("InferenceRequest", "InferenceResponse", "MetadataModelResponse", "Error"):
        assert name in document["components"]["schemas"]
    # What the server answers fits what the document says it answers.
    metadata = httpx.get(server.url + "/v2/models/iris", timeout=30).json()
    validator(document, "MetadataModelResponse").validate(metadata)
    missing = httpx.get(server.url + "/v2/models/nope", timeout=30)
    assert missing.status_code == 404
    validator(document, "Error").validate(missing.json())


def test_a_model_document_has_its_metadata_as_schemas(server):
    metadata = httpx.get(server.url + "/v2/models/iris", timeout=30).json()
    document = fetch_document(server.url + "/v2/models/iris/docs/dataplane.json")
    schemas = document["components"]["schemas"]
    for i, tensor in enumerate(metadata["inputs"]):
        properties = schemas[f"Input{i}"]["properties"]
        assert properties["name"]["enum"] == [tensor["name"]]
        assert properties["datatype"]["enum"] == [tensor["datatype"]]
        assert properties["shape"]["minItems"] == len(tensor["shape"])
        assert properties["shape"]["maxItems"] == len(tensor["shape"])
    names = [schemas[f"Output{i}"]["properties"]["name"]["enum"][0] for i in range(3)]
    assert names == [tensor["name"] for tensor in metadata["outputs"]]
    assert not any(path.startswith("/v2/models/reports") for path in document["paths"])
    # The document's example request is one the model takes, and its answer fits the
    # document's response schema.
    example = schemas["ModelInferenceRequest"]["example"]
    request = validator(document, "ModelInferenceRequest")
    request.validate(example)
    answer = httpx.post(server.url + "/v2/models/iris/infer", json=example, timeout=30)
    assert answer.status_code == 200, answer.text
    validator(document, "ModelInferenceResponse").validate(answer.json())
    wrong_rank = {"inputs": [{**example["inputs"][0], "shape": [4], "data": [0, 0, 0, 0]}]}
    assert not request.is_valid(wrong_rank)


def test_a_version_document_and_custom_endpoints(server):
    for url in ("/v2/models/reports", "/v2/models/reports/versions/v1"):
        document = fetch_document(server.url + url + "/docs/dataplane.json")
        paths = document["paths"]
        assert set(paths[url + "/reports/latest"]) == {"get", "post"}
        assert set(paths[url + "/status"]) == {"get"}
        assert "post" in paths[url + "/infer"]
        input0 = document["components"]["schemas"]["Input0"]["properties"]
        assert input0["name"]["enum"] == ["x"] and input0["shape"]["maxItems"] == 2
        # every path the document lists for the model is one the server routes
        status = httpx.get(server.url + url + "/status", timeout=30)
        assert status.status_code == 200 and status.json() == {"model": "reports"}
    assert all(p.startswith("/v2/models/reports/versions/v1/") for p in paths if p != url)


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v2/models/nope/docs/dataplane.json", "model 'nope' not found"),
        ("/v2/models/nope/docs", "model 'nope' not found"),
        (
            "/v2/models/reports/versions/v9/docs/dataplane.json",
            "model 'reports' has no version 'v9'",
        ),
        ("/v2/models/reports/versions/v9/docs", "model 'reports' has no version 'v9'"),
    ],
)
def test_an_unknown_model_or_version_is_404(server, path, error):
    response = httpx.get(server.url + path, timeout=30)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": error}


def test_swagger_ui_and_its_assets_are_served_from_here(server):
    for page, document in [
        ("/v2/docs", "/v2/docs/dataplane.json"),
        ("/v2/models/iris/docs", "/v2/models/iris/docs/dataplane.json"),
        (
            "/v2/models/reports/versions/v1/docs",
            "/v2/models/reports/versions/v1/docs/dataplane.json",
        ),
    ]:
        response = httpx.get(server.url + page, timeout=30)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        assert f'"url": {json.dumps(document)}' in response.text
        assert "https://" not in response.text and "http://" not in response.text
    for asset, kind in [
        ("swagger-ui-bundle.js", "text/javascript"),
        ("swagger-ui.css", "text/css"),
        ("favicon-32x32.png", "image/png"),
    ]:
        response = httpx.get(f"{server.url}/v2/docs/assets/{asset}", timeout=30)
        assert response.status_code == 200, asset
        assert response.headers["content-type"].startswith(kind)
    assert httpx.get(server.url + "/v2/docs/assets/nope.js", timeout=30).status_code == 404


def test_a_reload_rebuilds_the_model_document(server, repository):
    url = server.url + "/v2/models/mutable/docs/dataplane.json"
    before = fetch_document(url)["components"]["schemas"]["Input0"]["properties"]
    assert before["shape"]["maxItems"] == 2
    assert fetch_document(url)["components"]["schemas"]["Input0"]["properties"] == before
    settings_file = repository / "mutable" / "model-settings.json"
    settings = json.loads(settings_file.read_text())
    settings["inputs"] = [{"name": "wide", "datatype": "FP64", "shape": [-1, 5, 2]}]
    settings_file.write_text(json.dumps(settings))
    reloaded = httpx.post(server.url + "/v2/repository/models/mutable/load", timeout=120)
    assert reloaded.status_code == 200, reloaded.text
    after = fetch_document(url)["components"]["schemas"]["Input0"]["properties"]
    assert after["name"]["enum"] == ["wide"] and after["datatype"]["enum"] == ["FP64"]
    assert after["shape"]["minItems"] == 3 == after["shape"]["maxItems"]
