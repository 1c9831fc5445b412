"""The OpenAPI 3.0 documents of the REST API: the server's, and one per model version.

``server_document`` describes every route of the app (given as ``(path, methods)``
pairs, in the app's order) through the table of ``openapi_paths``, with the V2 schemas of
``openapi_schemas``; a model route is listed under both ``/v2/models/{model_name}`` and
``/v2/models/{model_name}/versions/{model_version}`` (MLServer's parameter names). The
custom endpoints, which only a loaded model knows, are one generic path there.

``model_document`` narrows it to one model (or one of its versions): its routes with the
name (and version) filled in, its inputs and outputs as the schemas of its inference
request and response (from its metadata), the metadata itself as the metadata route's
example, and the custom endpoints its runtime registered, with their methods.

Both are plain dicts built from tables; ``docs.py`` builds each once and caches it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import inferpool
from inferpool.frontends.rest.openapi_paths import (
    CUSTOM,
    ERRORS,
    EVERY_MODEL,
    JSON,
    OPERATIONS,
    Op,
)
from inferpool.frontends.rest.openapi_schemas import (
    COMPONENTS,
    Schema,
    example_tensor,
    tensor_schema,
)
from inferpool.protocol.endpoints import Announced

OPENAPI = "3.0.3"
MODEL = "/v2/models/{name}"
VERSIONED = "/v2/models/{name}/versions/{version}"
# The app's catch-all routes: a model's custom endpoints, and bare ones at the root.
MODEL_ENDPOINTS = "{model}/{path:path}"
BARE_ENDPOINTS = "/{path:path}"
_PARAMETER = {"name": "model_name", "version": "model_version"}
_DOCUMENT_SCHEMA: Schema = {"type": "object", "description": "an OpenAPI 3.0 document"}

RouteEntry = tuple[str, Iterable[str]]


def route_key(path: str) -> str:
    """A route's key in ``OPERATIONS``: a model route's prefix replaced by ``{model}``."""
    for prefix in (VERSIONED, MODEL):
        if path == prefix or path.startswith(prefix + "/"):
            return "{model}" + path[len(prefix) :]
    return path


def _openapi_path(path: str) -> str:
    return path.replace("{name}", "{model_name}").replace("{version}", "{model_version}")


def _path_parameters(path: str) -> list[Schema]:
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", path)
    ]


def _operation_id(method: str, path: str) -> str:
    return method + re.sub(r"[^A-Za-z0-9]+", "_", path).rstrip("_")


def _content(media: str, schema: Schema) -> dict[str, Any]:
    return {media: {"schema": schema}}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(op: Op, schema: Schema | None, example: Any) -> dict[str, Any]:
    if op.answer == "":
        return {"description": "done (empty body)"}
    if schema is None:
        schema = _ref(op.answer) if op.answer else {"type": "string"} if op.media != JSON else {}
    content = _content(op.media, schema)
    if example is not None:
        content[op.media]["example"] = example
    return {"description": "OK", "content": content}


def operation(
    op: Op,
    method: str,
    path: str,
    body: Schema | None = None,
    answer: Schema | None = None,
    example: Any = None,
) -> dict[str, Any]:
    """The Operation Object of ``op`` at ``path`` (OpenAPI's form); ``body``, ``answer``:
    schemas in place of the table's (a model's own), ``example``: of the 200 answer."""
    responses: dict[str, Any] = {"200": _answer(op, answer, example)}
    for status in op.errors:
        schema = _ref(op.answer) if op.health and status == 503 and op.answer else _ref("Error")
        responses[str(status)] = {
            "description": ERRORS[status],
            "content": _content(JSON, schema),
        }
    document: dict[str, Any] = {
        "summary": op.summary,
        "tags": [op.tag],
        "operationId": _operation_id(method, path),
        "responses": responses,
    }
    parameters = _path_parameters(path)
    if parameters:
        document["parameters"] = parameters
    if op.body == "":
        document["requestBody"] = {"content": _content("*/*", {})}
    elif op.body is not None:
        document["requestBody"] = {
            "required": not op.optional_body,
            "content": _content(JSON, body or _ref(op.body)),
        }
    return document


def _info(title: str, description: str) -> dict[str, Any]:
    return {"title": title, "version": inferpool.__version__, "description": description}


def server_document(routes: Iterable[RouteEntry]) -> dict[str, Any]:
    """The server's document: every route of ``routes`` that ``OPERATIONS`` describes, and
    each model's own endpoints under the model routes; the bare catch-all is not listed."""
    paths: dict[str, Any] = {}
    for route_path, methods in routes:
        key = route_key(route_path)
        if key == MODEL_ENDPOINTS:
            prefix = route_path[: -len("/{path:path}")]
            for endpoint, op in EVERY_MODEL.items():
                path = _openapi_path(f"{prefix}/{endpoint}")
                paths[path] = {"post": operation(op, "post", path)}
            path = _openapi_path(prefix + "/{endpoint}")
            generic = {m.lower(): operation(CUSTOM, m.lower(), path) for m in _custom(methods)}
            paths[path] = generic
            continue
        ops = OPERATIONS.get(key)
        if ops is None:
            continue
        path = _openapi_path(route_path)
        paths[path] = {method: operation(op, method, path) for method, op in ops.items()}
    return {
        "openapi": OPENAPI,
        "info": _info(
            "inferpool data plane",
            "The Open Inference Protocol (KServe V2) over REST, with the extensions "
            "inferpool serves. Each model's own document, with its inputs and outputs and its "
            "custom endpoints: /v2/models/{model_name}/docs/dataplane.json.",
        ),
        "paths": paths,
        "components": {"schemas": {**COMPONENTS, "OpenAPIDocument": _DOCUMENT_SCHEMA}},
    }


def model_path(name: str, version: str | None) -> str:
    """``/v2/models/{name}[/versions/{version}]`` filled in, each part quoted for a URL."""
    path = f"/v2/models/{quote(name, safe='')}"
    return path if version is None else f"{path}/versions/{quote(version, safe='')}"


def _custom(methods: Iterable[str]) -> list[str]:
    return sorted({m for m in methods if m not in ("HEAD", "OPTIONS")})


def model_document(
    routes: Iterable[RouteEntry],
    name: str,
    version: str | None,
    metadata: dict[str, Any],
    announced: Announced,
) -> dict[str, Any]:
    """The document of model ``name`` (its ``version`` when the URL names one): its routes
    with the name filled in, schemas from its V2 ``metadata``, and its custom endpoints."""
    prefix = MODEL if version is None else VERSIONED
    filled = model_path(name, version)
    schemas = _model_schemas(metadata)
    request = schemas.get("ModelInferenceRequest") and _ref("ModelInferenceRequest")
    response = schemas.get("ModelInferenceResponse") and _ref("ModelInferenceResponse")
    paths: dict[str, Any] = {}
    for route_path, _methods in routes:
        if not (route_path == prefix or route_path.startswith(prefix + "/")):
            continue
        key = route_key(route_path)
        if route_path.startswith(VERSIONED) and prefix == MODEL:
            continue
        if key == MODEL_ENDPOINTS:
            for endpoint, op in EVERY_MODEL.items():
                path = f"{filled}/{endpoint}"
                model_op = operation(op, "post", path, request, response)
                paths[path] = {"post": model_op}
            for endpoint, methods in sorted(announced.paths.items()):
                _add_custom(paths, f"{filled}/{endpoint}", methods)
                if announced.bare:
                    _add_custom(paths, f"/{endpoint}", methods)
            continue
        ops = OPERATIONS.get(key)
        if ops is None:
            continue
        path = filled + key[len("{model}") :]
        paths[path] = {
            method: _model_operation(op, method, path, request, response, metadata)
            for method, op in ops.items()
        }
    label = f"model '{name}'" + (f" version '{version}'" if version is not None else "")
    return {
        "openapi": OPENAPI,
        "info": _info(
            f"inferpool: {label}",
            f"The REST endpoints of {label}, its inputs and outputs from its metadata.",
        ),
        "paths": paths,
        "components": {"schemas": {**COMPONENTS, "OpenAPIDocument": _DOCUMENT_SCHEMA, **schemas}},
    }


def _model_operation(
    op: Op,
    method: str,
    path: str,
    request: Schema | None,
    response: Schema | None,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    body = request if op.body == "InferenceRequest" else None
    answer = response if op.answer == "InferenceResponse" else None
    example = metadata if op.answer == "MetadataModelResponse" and metadata else None
    return operation(op, method, path, body, answer, example)


def _add_custom(paths: dict[str, Any], path: str, methods: Iterable[str]) -> None:
    paths[path] = {m.lower(): operation(CUSTOM, m.lower(), path) for m in methods}


def _model_schemas(metadata: dict[str, Any]) -> dict[str, Schema]:
    """``Input<i>``, ``Output<i>`` and the model's request and response, from its
    metadata's tensors; none for a model whose metadata declares no inputs."""
    inputs = [t for t in metadata.get("inputs") or [] if isinstance(t, dict)]
    outputs = [t for t in metadata.get("outputs") or [] if isinstance(t, dict)]
    if not inputs:
        return {}
    schemas = {f"Input{i}": tensor_schema(t) for i, t in enumerate(inputs)}
    schemas |= {f"Output{i}": tensor_schema(t, output=True) for i, t in enumerate(outputs)}
    request: Schema = {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": _ref("Parameters"),
            "inputs": {
                "type": "array",
                "minItems": 1,
                "items": {"oneOf": [_ref(f"Input{i}") for i in range(len(inputs))]},
            },
            "outputs": {"type": "array", "items": _requested_output(outputs)},
        },
    }
    examples = [example_tensor(t) for t in inputs]
    if all(examples):
        request["example"] = {"inputs": examples}
    schemas["ModelInferenceRequest"] = request
    items = {"oneOf": [_ref(f"Output{i}") for i in range(len(outputs))]} if outputs else {}
    schemas["ModelInferenceResponse"] = {
        "allOf": [
            _ref("InferenceResponse"),
            {"type": "object", "properties": {"outputs": {"type": "array", "items": items}}},
        ]
    }
    return schemas


def _requested_output(outputs: list[dict[str, Any]]) -> Schema:
    names = [str(t.get("name", "")) for t in outputs]
    schema: Schema = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "parameters": _ref("Parameters")},
    }
    if names:
        schema["properties"]["name"]["enum"] = names
    return schema
