"""The REST API's documentation routes: the OpenAPI documents and Swagger UI.

``GET /v2/docs/dataplane.json`` answers the server's OpenAPI document, built on the first
request from the app's final route list and kept as bytes; ``GET /v2/models/{name}
[/versions/{v}]/docs/dataplane.json`` a model's (``openapi.model_document``), built once
per model version and rebuilt when the version reloads (a reload gives it new metadata);
an unknown model is 404 ``{"error": ...}``. Nothing here runs on the inference path.

``GET /v2/docs`` and ``GET /v2/models/{name}[/versions/{v}]/docs`` answer a Swagger UI
page over the matching document. The page's script and style are swagger-ui's dist files
from the ``swagger-ui-bundle`` package (the ``swagger`` extra), served by Starlette's
static files under ``/v2/docs/assets``: the page loads nothing from another host, so it
works offline. Without the extra the pages answer 501 saying how to install it; the
documents are served either way.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from inferpool.engine.client import EngineClient
from inferpool.engine.states import ModelKey
from inferpool.errors import InferpoolError
from inferpool.frontends.rest.openapi import (
    MODEL,
    VERSIONED,
    RouteEntry,
    model_document,
    model_path,
    server_document,
)
from inferpool.protocol.endpoints import Announced

ASSETS = "/v2/docs/assets"
DOCUMENT = "/docs/dataplane.json"
INSTALL = "pip install 'inferpool[swagger]'"
JSON = "application/json"


class SwaggerMissing(InferpoolError):
    """Swagger UI's page asked for while its files (the ``swagger`` extra) are not installed."""

    status = 501


def swagger_assets() -> Path | None:
    """swagger-ui's dist folder as the ``swagger-ui-bundle`` package installs it, or None."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return None
    path = Path(str(swagger_ui_path))
    return path if (path / "swagger-ui-bundle.js").is_file() else None


def swagger_page(title: str, document_url: str, assets: str) -> str:
    """The Swagger UI page over ``document_url``; scripts and style from ``assets``.
    ``validatorUrl: null``: swagger-ui would otherwise fetch a badge from its online
    validator."""
    config = json.dumps({"url": document_url, "dom_id": "#swagger-ui", "validatorUrl": None})
    config = config.replace("</", "<\\/")  # no "</script>" can end the script early
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="{html.escape(assets)}/swagger-ui.css">
<link rel="icon" type="image/png" href="{html.escape(assets)}/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{html.escape(assets)}/swagger-ui-bundle.js"></script>
<script>
const config = {config};
config.presets = [SwaggerUIBundle.presets.apis];
config.deepLinking = true;
window.ui = SwaggerUIBundle(config);
</script>
</body>
</html>
"""


class Documents:
    """Each document built once: the server's, and each model version's until it reloads."""

    def __init__(self, client: EngineClient, routes: Callable[[], list[RouteEntry]]) -> None:
        self.client = client
        self.routes = routes  # read on first use: the app's list is complete by then
        self._server: bytes | None = None
        # (version's key, URL names the version) -> (metadata, endpoints, the document)
        self._models: dict[tuple[ModelKey, bool], tuple[Any, Announced, bytes]] = {}

    def server(self) -> bytes:
        if self._server is None:
            self._server = orjson.dumps(server_document(self.routes()))
        return self._server

    def model(self, name: str, version: str | None) -> bytes:
        """The document of the version that answers ``name`` (and ``version``); 404 if
        unknown. A reload sets a new metadata dict: the identity check sees it."""
        table = self.client.table
        status = table.find(name, version)
        key = (status.key, version is not None)
        cached = self._models.get(key)
        if cached is not None and cached[0] is status.metadata and cached[1] is status.endpoints:
            return cached[2]
        version = status.version if version is not None else None
        built = model_document(
            self.routes(), status.name, version, status.metadata, status.endpoints
        )
        document = orjson.dumps(built)
        for stale in [k for k in self._models if table.get(k[0]) is None]:
            del self._models[stale]  # versions no longer listed
        self._models[key] = (status.metadata, status.endpoints, document)
        return document


def route_entries(routes: list[BaseRoute]) -> list[RouteEntry]:
    """(path, methods) of the app's routes, as the documents read them (mounts left out)."""
    return [(r.path, r.methods or ()) for r in routes if isinstance(r, Route)]


def docs_routes(client: EngineClient, routes: Callable[[], list[RouteEntry]]) -> list[BaseRoute]:
    """The documents' and pages' routes, and the assets' mount (501 without the extra);
    they must come before the custom endpoints' catch-all routes."""
    documents = Documents(client, routes)
    assets = swagger_assets()

    async def server_json(request: Request) -> Response:
        return Response(documents.server(), media_type=JSON)

    async def model_json(request: Request) -> Response:
        params = request.path_params
        return Response(documents.model(params["name"], params.get("version")), media_type=JSON)

    def page(request: Request, title: str, document: str) -> Response:
        if assets is None:
            raise SwaggerMissing(
                f"Swagger UI is not installed: {INSTALL} to serve it here (the OpenAPI "
                f"document is served at {document} all the same)"
            )
        root = request.scope.get("root_path", "")
        return HTMLResponse(swagger_page(title, root + document, root + ASSETS))

    async def server_page(request: Request) -> Response:
        return page(request, "inferpool: REST API", "/v2" + DOCUMENT)

    async def model_page(request: Request) -> Response:
        params = request.path_params
        name, version = params["name"], params.get("version")
        status = client.table.find(name, version)  # 404 for an unknown model
        label = f"model '{status.name}'" + (f" version '{version}'" if version else "")
        return page(request, f"inferpool: {label}", model_path(name, version) + DOCUMENT)

    found: list[BaseRoute] = [
        Route("/v2/docs", server_page),
        Route("/v2" + DOCUMENT, server_json),
    ]
    for prefix in (MODEL, VERSIONED):
        found += [Route(prefix + "/docs", model_page), Route(prefix + DOCUMENT, model_json)]
    # Mounted either way, so that the routes do not depend on what is installed.
    files = missing if assets is None else StaticFiles(directory=assets)
    found.append(Mount(ASSETS, app=files, name="swagger-ui"))
    return found


async def missing(scope: Scope, receive: Receive, send: Send) -> None:
    """The assets' mount without the extra: 501 saying how to install it."""
    message = f"Swagger UI is not installed: {INSTALL}"
    await Response(orjson.dumps({"error": message}), 501, media_type=JSON)(scope, receive, send)
