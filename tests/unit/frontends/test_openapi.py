"""The OpenAPI documents (rest/openapi.py, openapi_paths.py, openapi_schemas.py) and their
routes (rest/docs.py): every route of the app described and valid OpenAPI 3.0, a model's
tensors as schemas that accept what its metadata allows and refuse the rest, each document
built once and rebuilt when its model version reloads, Swagger UI's page and its absence."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate
from starlette.routing import Mount, Route

from inferpool.engine.inprocess import InProcessClient
from inferpool.engine.states import ModelState, ModelStatus
from inferpool.errors import ModelNotFound
from inferpool.frontends.metrics import build_metrics_app
from inferpool.frontends.rest import docs
from inferpool.frontends.rest.app import build_app
from inferpool.frontends.rest.docs import Documents, route_entries, swagger_page
from inferpool.frontends.rest.openapi import (
    BARE_ENDPOINTS,
    MODEL_ENDPOINTS,
    model_document,
    route_key,
    server_document,
)
from inferpool.frontends.rest.openapi_paths import OPERATIONS
from inferpool.frontends.rest.openapi_schemas import EXAMPLE_ELEMENTS
from inferpool.protocol.endpoints import Announced
from inferpool.settings import ServerSettings

METADATA = {
    "name": "iris",
    "versions": ["2"],
    "platform": "sklearn",
    "inputs": [
        {"name": "features", "datatype": "FP64", "shape": [-1, 4]},
        {"name": "flag", "datatype": "BOOL", "shape": [-1]},
    ],
    "outputs": [
        {"name": "predict", "datatype": "INT64", "shape": [-1]},
        {"name": "predict_proba", "datatype": "FP64", "shape": [-1, 3]},
    ],
}


def app_routes(tmp_path: Path, metrics_here: bool = False) -> list:
    """The app's routes (with /metrics as the server adds it for --metrics-port 0)."""
    settings = ServerSettings(model_repository=tmp_path, workers=0, gzip_enabled=False)
    client = InProcessClient(settings)
    extra = build_metrics_app(client).routes if metrics_here else []
    return build_app(client, None, extra).app.routes  # type: ignore[attr-defined]


def test_every_route_of_the_app_is_in_the_table_with_its_methods(tmp_path):
    described = {MODEL_ENDPOINTS, BARE_ENDPOINTS}
    for route in app_routes(tmp_path, metrics_here=True):
        if isinstance(route, Mount):
            assert route.path == docs.ASSETS
            continue
        key = route_key(route.path)
        if key in described:
            continue
        assert key in OPERATIONS, f"{route.path} has no line in openapi_paths.OPERATIONS"
        methods = {m.lower() for m in route.methods or ()} - {"head"}
        assert methods == set(OPERATIONS[key]), route.path


def test_the_server_document_is_valid_and_lists_every_route(tmp_path):
    routes = route_entries(app_routes(tmp_path, metrics_here=True))
    document = server_document(routes)
    validate(document)  # raises on an invalid OpenAPI 3.0 document
    paths = document["paths"]
    for path in (
        "/v2/health/ready",
        "/v2",
        "/v2/repository/index",
        "/v2/repository/models/{model_name}/load",
        "/v2/models/{model_name}/infer",
        "/v2/models/{model_name}/versions/{model_version}/infer",
        "/v2/models/{model_name}/generate_stream",
        "/v2/models/{model_name}/explain",
        "/v2/models/{model_name}/{endpoint}",
        "/v2/docs/dataplane.json",
        "/v2/models/{model_name}/versions/{model_version}/docs",
        "/invocations",
        "/metrics",
    ):
        assert path in paths, path
    infer = paths["/v2/models/{model_name}/infer"]["post"]
    schema = infer["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/InferenceRequest"}
    assert set(infer["responses"]) >= {"200", "400", "404", "500", "503"}
    error = infer["responses"]["404"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/Error"}
    # health answers 503 with its own document, not an error
    ready = paths["/v2/health/ready"]["get"]["responses"]["503"]
    assert ready["content"]["application/json"]["schema"]["$ref"].endswith("/ReadyResponse")
    # without --metrics-port 0, /metrics is not on the REST port: not in the document
    assert "/metrics" not in server_document(route_entries(app_routes(tmp_path)))["paths"]


def schema_validator(document: dict[str, Any], name: str) -> OAS30Validator:
    """A validator of ``#/components/schemas/<name>`` that resolves the document's refs."""
    schema = {**document["components"]["schemas"][name], "components": document["components"]}
    return OAS30Validator(schema)


def test_a_model_document_takes_its_tensors_from_the_metadata(tmp_path):
    routes = route_entries(app_routes(tmp_path))
    announced = Announced(paths={"status": ["GET"], "reports/latest": ["GET", "POST"]}, bare=True)
    document = model_document(routes, "iris", None, METADATA, announced)
    validate(document)
    schemas = document["components"]["schemas"]
    features, flag = schemas["Input0"], schemas["Input1"]
    assert features["properties"]["name"]["enum"] == ["features"]
    assert features["properties"]["datatype"]["enum"] == ["FP64"]
    assert (
        features["properties"]["shape"]["minItems"]
        == 2
        == features["properties"]["shape"]["maxItems"]
    )
    assert flag["properties"]["shape"]["maxItems"] == 1
    assert schemas["Output1"]["properties"]["name"]["enum"] == ["predict_proba"]
    paths = document["paths"]
    assert "/v2/models/iris/infer" in paths and "/v2/models/iris/versions/2/infer" not in paths
    assert not any("{" in path for path in paths)  # the name is filled in everywhere
    assert set(paths["/v2/models/iris/reports/latest"]) == {"get", "post"}
    assert set(paths["/status"]) == {"get"}  # bare: served at the root too
    metadata = paths["/v2/models/iris"]["get"]["responses"]["200"]["content"]
    assert metadata["application/json"]["example"] == METADATA
    infer = paths["/v2/models/iris/infer"]["post"]["requestBody"]["content"]["application/json"]
    assert infer["schema"] == {"$ref": "#/components/schemas/ModelInferenceRequest"}

    request = schema_validator(document, "ModelInferenceRequest")
    example = schemas["ModelInferenceRequest"]["example"]
    assert example["inputs"][0] == {
        "name": "features", "shape": [1, 4], "datatype": "FP64", "data": [0, 0, 0, 0]
    }  # fmt: skip
    request.validate(example)
    good = {
        "inputs": [
            {"name": "features", "shape": [2, 4], "datatype": "FP64", "data": [[1.5] * 4] * 2}
        ]
    }
    request.validate(good)
    bad_requests = [
        {"inputs": [{**good["inputs"][0], "datatype": "FP32"}]},  # another datatype
        {"inputs": [{**good["inputs"][0], "shape": [8]}]},  # another rank
        {"inputs": [{**good["inputs"][0], "name": "x"}]},  # no such input
        {"inputs": [{**good["inputs"][0], "data": ["a"]}]},  # strings for FP64
        {"inputs": [{"name": "flag", "shape": [1], "datatype": "BOOL", "data": [1.5]}]},
        {"inputs": []},
        {**good, "outputs": [{"name": "nope"}]},  # no such output
    ]
    for bad in bad_requests:
        assert not request.is_valid(bad), bad


def test_a_versioned_document_lists_the_versioned_routes_only(tmp_path):
    routes = route_entries(app_routes(tmp_path))
    document = model_document(routes, "iris", "2", METADATA, Announced())
    validate(document)
    paths = list(document["paths"])
    assert "/v2/models/iris/versions/2/infer" in paths
    assert all(path.startswith("/v2/models/iris/versions/2") for path in paths), paths
    assert document["info"]["title"] == "inferpool: model 'iris' version '2'"


def test_a_model_without_metadata_gets_the_protocol_schemas(tmp_path):
    routes = route_entries(app_routes(tmp_path))
    document = model_document(routes, "odd/name", None, {}, Announced())
    validate(document)
    assert "/v2/models/odd%2Fname/infer" in document["paths"]  # a name quoted into the path
    infer = document["paths"]["/v2/models/odd%2Fname/infer"]["post"]["requestBody"]
    assert infer["content"]["application/json"]["schema"]["$ref"].endswith("/InferenceRequest")
    assert "ModelInferenceRequest" not in document["components"]["schemas"]


def test_odd_metadata_from_a_runtime_still_gives_a_valid_document(tmp_path):
    metadata = {
        "inputs": [
            {"name": "a", "datatype": "FOO", "shape": ["x", None, 3, True]},
            {"name": 7, "shape": "wide"},
            "not a tensor",
        ],
        "outputs": "none",
    }
    document = model_document(route_entries(app_routes(tmp_path)), "m", None, metadata, Announced())
    validate(document)
    shape = document["components"]["schemas"]["Input0"]["properties"]["shape"]
    assert shape["maxItems"] == 4 and shape["example"] == [1, 1, 3, 1]
    assert document["components"]["schemas"]["Input1"]["properties"]["name"]["enum"] == ["7"]
    request = schema_validator(document, "ModelInferenceRequest")
    request.validate(document["components"]["schemas"]["ModelInferenceRequest"]["example"])


def test_a_huge_input_gets_no_example(tmp_path):
    metadata = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [EXAMPLE_ELEMENTS + 1]}]}
    document = model_document(route_entries(app_routes(tmp_path)), "m", None, metadata, Announced())
    validate(document)
    assert "example" not in document["components"]["schemas"]["ModelInferenceRequest"]


def test_documents_are_built_once_and_again_after_a_reload(tmp_path):
    client = InProcessClient(ServerSettings(model_repository=tmp_path, workers=0))
    routes = route_entries(app_routes(tmp_path))
    documents = Documents(client, lambda: routes)
    assert documents.server() is documents.server()
    client.table.set(ModelStatus("iris", None, ModelState.READY, metadata=dict(METADATA)))
    first = documents.model("iris", None)
    assert documents.model("iris", None) is first  # cached: the same bytes
    # a reload sets a new status with new metadata: the document follows it
    reloaded = {**METADATA, "inputs": [{"name": "wide", "datatype": "FP32", "shape": [-1, 9]}]}
    client.table.set(ModelStatus("iris", None, ModelState.READY, metadata=reloaded))
    second = orjson.loads(documents.model("iris", None))
    assert second["components"]["schemas"]["Input0"]["properties"]["name"]["enum"] == ["wide"]
    with pytest.raises(ModelNotFound):
        documents.model("nope", None)
    with pytest.raises(ModelNotFound):
        documents.model("iris", "7")


def test_the_page_escapes_what_it_is_given():
    page = swagger_page(
        "a </title><script>", "/v2/models/x</script>/docs/dataplane.json", "/v2/docs/assets"
    )
    assert "</title><script>" not in page and "x</script>" not in page
    assert 'src="/v2/docs/assets/swagger-ui-bundle.js"' in page
    assert "//" not in page.replace("http://", "")  # no other host: nothing from a CDN


def get(app: Any, *paths: str) -> list[httpx.Response]:
    async def fetch() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return [await http.get(path) for path in paths]

    return asyncio.run(fetch())


def test_without_the_extra_the_pages_say_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(docs, "swagger_assets", lambda: None)
    client = InProcessClient(ServerSettings(model_repository=tmp_path, workers=0))
    page, asset, document = get(
        build_app(client), "/v2/docs", "/v2/docs/assets/swagger-ui.css", "/v2/docs/dataplane.json"
    )
    assert page.status_code == 501 == asset.status_code
    assert "pip install 'inferpool[swagger]'" in page.json()["error"]
    assert "/v2/docs/dataplane.json" in page.json()["error"]
    assert document.status_code == 200  # the document needs nothing installed
    validate(document.json())


def test_with_the_extra_the_page_and_its_assets_are_served(tmp_path):
    assert docs.swagger_assets() is not None, "the test extra installs swagger-ui-bundle"
    client = InProcessClient(ServerSettings(model_repository=tmp_path, workers=0))
    page, script, style, unknown = get(
        build_app(client),
        "/v2/docs",
        "/v2/docs/assets/swagger-ui-bundle.js",
        "/v2/docs/assets/swagger-ui.css",
        "/v2/models/nope/docs",
    )
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '"url": "/v2/docs/dataplane.json"' in page.text
    assert script.status_code == 200 and "SwaggerUIBundle" in script.text
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert unknown.status_code == 404 and unknown.json() == {"error": "model 'nope' not found"}


def test_the_routes_come_before_the_catch_alls(tmp_path):
    paths = [r.path for r in app_routes(tmp_path) if isinstance(r, Route | Mount)]
    for route in ("/v2/models/{name}/docs", "/v2/models/{name}/docs/dataplane.json", docs.ASSETS):
        assert paths.index(route) < paths.index("/v2/models/{name}/{path:path}")
        assert paths.index(route) < paths.index("/{path:path}")
