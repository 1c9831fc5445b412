"""The REST infer routes as a raw ASGI callable, in front of the Starlette app.

``POST /v2/models/{name}[/versions/{version}]/infer`` is most of a server's traffic, and
Starlette's path costs more than the route itself: two middlewares (its error and
exception layers), a regular-expression match per route until the infer route, a
``Request``, a ``Response`` with its header list. ``InferRoutes`` recognises the infer
paths with two string tests and a split, runs the inference and writes its answer with
pre-built headers (``answer.py``); every other request (and an infer path it does not
recognise) goes to the Starlette app unchanged, so routing, 404 and 405 stay Starlette's.

The scope gets ``path_params`` as Starlette would set them, for the access log and the
spans (``access_log.RestObserver``), which wrap this callable when they are on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from inferpool.engine.client import EngineClient
from inferpool.engine.ipc.messages import Kind
from inferpool.engine.shared_memory import MARKER
from inferpool.errors import InferpoolError
from inferpool.frontends.access_log import REQUEST_ID
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.rest.answer import answered, failed, header_lines, write
from inferpool.frontends.rest.body import (
    PRIORITY,
    alignment,
    json_length,
    read_body,
    read_head,
)
from inferpool.frontends.rest.cloudevents import CloudEvents, served_namespace
from inferpool.frontends.rest.gzip import answer_gzip
from inferpool.frontends.rest.reply import await_reply
from inferpool.protocol.priority import LEVEL
from inferpool.protocol.request_headers import headers_block, http_headers, unwrap

logger = logging.getLogger("inferpool.http")

_PREFIX = "/v2/models/"
_SUFFIX = "/infer"


def infer_target(path: str, root_path: str) -> tuple[str, str | None] | None:
    """``(name, version)`` of an infer path (version None when unversioned), or None for
    any other path. ``root_path``: the ASGI mount prefix (Ray Serve's route prefix), which
    Starlette strips before it matches a route."""
    if root_path and path.startswith(root_path):
        path = path[len(root_path) :]
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    inner = path[len(_PREFIX) : -len(_SUFFIX)]
    if not inner:
        return None
    if "/" not in inner:
        return inner, None
    parts = inner.split("/")
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


class InferRoutes:
    """ASGI: the infer routes answered here, everything else by ``app``.

    ``direct``: answers may be written by the protocol in one piece (no middleware around
    this callable needs to see the ASGI messages)."""

    def __init__(self, app: Any, client: EngineClient, plane: DataPlane, direct: bool) -> None:
        self.app = app
        self.direct = direct
        self.max_body = client.settings.max_body_bytes
        self.default_timeout = client.settings.request_timeout
        self.find = client.table.find
        self.infer = plane.infer
        settings = client.settings
        # Answers of gzip_min_bytes or more, gzipped for clients that accept it (or None).
        self.gzip = answer_gzip(settings)
        self.cloudevents = CloudEvents(served_namespace()) if settings.cloudevents else None
        # Triton's system shared memory: the registry, and its regions (a dict changed in
        # place, so that a request's check is one truth test while none is registered).
        self.shared_memory = client.shared_memory
        self.shm_regions = client.shared_memory.regions

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            target = infer_target(scope["path"], scope.get("root_path", ""))
            if target is not None:
                name, version = target
                params = {"name": name} if version is None else {"name": name, "version": version}
                scope["path_params"] = params
                await self._infer(scope, receive, send, name, version, self.direct)
                return
        await self.app(scope, receive, send)

    def starlette_endpoint(self) -> Any:
        """The same route as an ASGI endpoint for Starlette's router (which has set
        ``path_params``): for paths this callable did not take itself."""
        return _RoutedByStarlette(self)

    async def _infer(
        self,
        scope: Any,
        receive: Any,
        send: Any,
        name: str,
        version: str | None,
        direct: bool,
    ) -> None:
        try:
            try:
                answer = await self._answer(scope, receive, name, version)
            except InferpoolError as exc:
                answer = failed(scope, exc)
        except Exception:
            # A bug of ours: logged with its traceback, answered without one.
            logger.exception("unexpected error serving %s", scope["path"])
            answer = failed(scope, InferpoolError("internal server error"))
        gzip = self.gzip
        if gzip is not None and len(answer[2]) >= gzip.min_bytes:
            answer = await gzip.compress(scope, answer)
        await write(scope, send, answer, direct)

    async def _answer(
        self, scope: Any, receive: Any, name: str, version: str | None
    ) -> tuple[int, bytes, bytes]:
        content_length, binary, timeout, encoding = read_head(scope, self.default_timeout)
        kind: int = Kind.REST
        exchanges = self.find(name, version).exchanges_headers
        # A large binary body (a million bytes or more) is read behind padding that
        # aligns its first tensor; a small one as it is.
        large = binary is not None and content_length is not None and len(content_length) > 6
        if exchanges:  # a user's runtime (or alibi's): the headers go in front of the body
            headers = http_headers(scope["headers"])
            block = headers_block(headers)
            if large and (pad := alignment(len(block), binary)):
                block = headers_block(headers, pad)
            body = await read_body(receive, content_length, self.max_body, encoding, block)
            header_length = json_length(binary, len(body) - len(block))
            kind = Kind.REST_HEADERS
        elif large and (pad := alignment(0, binary)):
            body = await read_body(receive, content_length, self.max_body, encoding, b" " * pad)
            length = json_length(binary, len(body) - pad)
            header_length = None if length is None else pad + length
        else:
            body = await read_body(receive, content_length, self.max_body, encoding)
            header_length = json_length(binary, len(body))
        if self.shm_regions and MARKER in body:  # some tensors are in shared memory
            kind, body = self.shared_memory.tagged(kind, body)
        deadline = None if timeout is None else time.monotonic() + timeout
        call = self.infer(name, version, kind, body, header_length, deadline)
        level = scope.get(PRIORITY)
        if level is None:
            reply = await await_reply(scope, receive, call, timeout)
        else:  # set in this task only (a connection's next request may run in it)
            token = LEVEL.set(level)
            try:
                reply = await await_reply(scope, receive, call, timeout)
            finally:
                LEVEL.reset(token)
        extra = b""
        if exchanges and reply.status == 200:
            # The headers the runtime's response set (parameters.headers), as MLServer
            # sends them: HTTP response headers, no longer in the JSON body.
            headers, reply.body = unwrap(reply.body, view=True)
            extra = header_lines(headers)
        status, head, body = answered(scope, reply)
        if self.cloudevents is not None and status == 200:
            extra += self.cloudevents.lines(name, scope[REQUEST_ID].encode())
        return status, head + extra if extra else head, body


class _RoutedByStarlette:
    """An ASGI endpoint (a class instance, so Starlette does not wrap it as a request
    handler); Starlette's middlewares see its messages, so it never writes directly."""

    def __init__(self, routes: InferRoutes) -> None:
        self.routes = routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        params = scope["path_params"]
        name, version = params["name"], params.get("version")
        await self.routes._infer(scope, receive, send, name, version, direct=False)
