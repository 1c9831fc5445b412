"""Custom endpoints and feedback as both frontends route them, protocol-neutral.

``EndpointRouter`` resolves a call before anything reaches a worker: the model (the
table's ``ModelStatus``), then the path among the endpoints its load announced (404 for
an unknown path, 405 naming the methods for a known path asked with another method), or
for a bare path (``/path`` at the root) the one loaded model that opted in to serving it
there (409 naming them when several do). It starts the engine call and counts what came
back in the version's statistics: per registered path, method and status, and each
feedback with its reward (``/metrics`` reads them). The frontends only read their
request and write the answer.

``explain`` of a model whose settings name an explainer model (``parameters.extra.explainer``,
an alibi explainer: docs/runtimes/alibi-explain.md) is that explainer's inference of the
same V2 request body, answered as the endpoint's answer: run from here, the explainer's
calls to the model are a chain of their own (from the model's worker they would close a
cycle).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from inferpool.engine.ipc.messages import Kind, Reply
from inferpool.engine.states import ModelState, ModelStatus
from inferpool.errors import InferpoolError, ModelNotFound
from inferpool.frontends.dataplane import DataPlane
from inferpool.protocol.endpoints import (
    EXPLAIN,
    Answer,
    MethodNotAllowed,
    answer_head,
    call_body,
    normalize,
    read_answer,
)
from inferpool.protocol.mlflow_endpoints import INVOCATIONS
from inferpool.protocol.request_headers import unwrap, wrap

# Every model answers MLflow's JSON scoring endpoint (``codecs.mlflow_scoring``) and
# ``explain`` (``engine/worker/explain.py``: 400 from a model that cannot explain).
_EVERY_MODEL = {INVOCATIONS: ["POST"], EXPLAIN: ["POST"]}
# The key of a model's parameters.extra naming the model that answers its ``explain``.
EXPLAINER = "explainer"


class Conflict(InferpoolError):
    """A bare path that more than one loaded model serves."""

    status = 409


class EndpointRouter:
    """Routes custom endpoint calls and feedbacks over one data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.client = plane.client

    def route(self, name: str, version: str | None, path: str, method: str) -> ModelStatus:
        """The version that answers ``path`` (normalized) for ``method``; raises 404/405.

        A version that is not READY is returned as it is: the engine call answers as an
        inference would (``ModelStatus.refusal``; its endpoints are unknown until it loads)."""
        status = self.client.table.find(name, version)
        if status.state is not ModelState.READY:
            return status
        methods = status.endpoints.paths.get(path) or _EVERY_MODEL.get(path)
        if methods is None:
            raise ModelNotFound(f"model '{status.name}' has no endpoint '/{path}'")
        if method not in methods:
            raise MethodNotAllowed(
                f"endpoint '/{path}' of model '{status.name}' answers {', '.join(methods)}, "
                f"not {method}",
                methods,
            )
        return status

    def bare(self, path: str, method: str) -> ModelStatus:
        """The one loaded model serving ``path`` at the root; 404 if none, 409 if several."""
        owners = [
            status
            for status in self.client.table.all()
            if status.state is ModelState.READY
            and status.endpoints.bare
            and path in status.endpoints.paths
        ]
        names = sorted({status.name for status in owners})
        if not names:
            raise ModelNotFound(f"no route /{path}")
        if len(names) > 1:
            quoted = " and ".join(f"'{name}'" for name in names)
            raise Conflict(
                f"/{path} is served by models {quoted}; call "
                f"/v2/models/{{name}}/{path} to choose one"
            )
        served = self.client.table.find(names[0], None)
        version = served.version if path in served.endpoints.paths else owners[0].version
        return self.route(names[0], version, path, method)

    def call(
        self,
        status: ModelStatus,
        path: str,
        method: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes,
        deadline: float | None,
    ) -> Coroutine[Any, Any, Reply]:
        """The engine call of an endpoint ``route`` (or ``bare``) resolved."""
        explainer = explainer_of(status) if path == EXPLAIN else None
        if explainer is not None:
            return self._explained(status.name, explainer, body, deadline)
        payload = call_body(path, body, method, query, headers)
        return self.plane.infer(status.name, status.version, Kind.CUSTOM, payload, None, deadline)

    async def _explained(
        self, model: str, explainer: str, body: bytes, deadline: float | None
    ) -> Reply:
        """The explainer's answer to the request, as a handler's answer (its head in front):
        the headers an alibi explainer answers (``x-seldon-alibi-*``) are the answer's
        headers, as its ``/infer`` sends them."""
        try:
            exchanges = self.client.table.find(explainer, None).exchanges_headers
            kind, payload = (Kind.REST_HEADERS, wrap({}, body)) if exchanges else (Kind.REST, body)
            reply = await self.plane.infer(explainer, None, kind, payload, None, deadline)
        except InferpoolError as exc:
            message = f"model '{model}' names explainer '{explainer}': {exc.message}"
            return Reply(exc.status, message.encode())
        if reply.status != 200:
            return reply  # an error's reply: its message
        answered: bytes = reply.body
        headers: dict[str, str] = {}
        if exchanges:
            headers, answered = unwrap(reply.body)
        if reply.json_length is None:
            head = answer_head(Answer(headers=list(headers.items())))
        else:  # binary outputs asked for: Triton's binary form, as /infer answers it
            length = [("inference-header-content-length", str(reply.json_length))]
            head = answer_head(Answer("application/octet-stream", length + list(headers.items())))
        return Reply(200, head + answered, len(head), reply.times, reply.rows, reply.execution)

    def feedback(
        self, name: str, version: str | None, kind: str, body: bytes, deadline: float | None
    ) -> Coroutine[Any, Any, Reply]:
        """The engine call of a feedback (``kind``: ``FEEDBACK_JSON`` or ``FEEDBACK_GRPC``)."""
        return self.plane.infer(name, version, Kind.CUSTOM, call_body(kind, body), None, deadline)

    def count(
        self, status: ModelStatus, protocol: str, path: str, method: str, reply: Reply
    ) -> None:
        """Count a call's outcome under its registered ``path``."""
        stats = self.client.stats.get(status.key)
        if stats is not None:
            key = (protocol, path, method, reply.status)
            stats.endpoint_codes[key] = stats.endpoint_codes.get(key, 0) + 1

    def count_feedback(self, name: str, version: str | None, reply: Reply) -> None:
        """Count a feedback the model took (a 2xx answer) and its reward."""
        answer = read_answer(reply.body, reply.json_length)
        if answer is None or not 200 <= reply.status < 300 or answer[0].reward is None:
            return
        stats = self.client.stats.get(self.client.table.find(name, version).key)
        if stats is not None:
            stats.feedback_count += 1
            stats.feedback_reward += answer[0].reward


def explainer_of(status: ModelStatus) -> str | None:
    """The explainer model a model's settings name (``parameters.extra.explainer``)."""
    settings = status.settings
    named = settings.parameters.extra.get(EXPLAINER) if settings is not None else None
    return named if isinstance(named, str) and named else None


def endpoint_path(path: str) -> str:
    """A requested path as the table holds it; a path no endpoint can have is a 404."""
    try:
        return normalize(path)
    except ValueError:
        raise ModelNotFound(f"no endpoint '/{path.strip('/')}'") from None


def headers_of(pairs: Any) -> list[tuple[str, str]]:
    """A request's headers (ASGI's bytes pairs, or gRPC metadata) as text pairs."""
    return [
        (
            name.decode("latin-1") if isinstance(name, bytes) else name,
            value.decode("latin-1") if isinstance(value, bytes) else value,
        )
        for name, value in pairs
        if not (name.startswith(b":") if isinstance(name, bytes) else name.startswith(":"))
    ]
