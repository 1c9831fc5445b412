"""The REST side of ``--api-keys-file``: every request but the open ones needs a key.

``KeyGuard`` wraps the REST app (inside CORS and the access log, so that a preflight is
answered without a key and a refusal is logged): it reads the path (``api_keys.rest_scope``)
and the ``Authorization``/``X-API-Key`` header, and answers 401 (no key, a wrong one) with
``WWW-Authenticate``, 403 (a key limited to other models) or 429 (a key over its rate,
with ``Retry-After``) with ``{"error": ...}`` before the request reaches a route. The
key's label goes into the scope for the access log (``access_log.API_KEY``); the key
itself goes nowhere.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferpool.errors import InferpoolError, Unauthorized
from inferpool.frontends.access_log import API_KEY
from inferpool.frontends.api_keys import KEY_RATE_LIMIT, NO_KEY, REALM, ApiKeys, rest_scope
from inferpool.frontends.metrics_server import count_rejected


class KeyGuard:
    """ASGI: ``app`` behind the API keys of ``keys``."""

    def __init__(self, app: Any, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            needed, model, admin = rest_scope(path)
            if needed and not (admin and self.keys.admin_token):
                try:
                    scope[API_KEY] = self.keys.check(scope["headers"], model, admin)
                except InferpoolError as exc:
                    await _refuse(send, exc, scope.get("http_version", "1.1"))
                    return
        await self.app(scope, receive, send)


async def _refuse(send: Any, exc: InferpoolError, http_version: str) -> None:
    headers = [(b"content-type", b"application/json")]
    if http_version != "2":
        # The request's body is left unread: over HTTP/1.1 the connection then cannot carry
        # another request (Hypercorn drops it), so the client is told not to reuse it.
        headers.append((b"connection", b"close"))
    if exc.retry_after:  # over the key's rate limit (api_keys.py)
        count_rejected("rest", KEY_RATE_LIMIT)
        headers.append((b"retry-after", str(exc.retry_seconds).encode()))
    if isinstance(exc, Unauthorized):
        # RFC 6750: a request that sent no key gets the scheme, a wrong key its error.
        challenge = REALM if exc.message == NO_KEY else REALM + ', error="invalid_token"'
        headers.append((b"www-authenticate", challenge.encode()))
    body = orjson.dumps({"error": exc.message})
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
