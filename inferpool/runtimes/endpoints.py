"""A runtime's custom endpoints: the ``custom_endpoint`` decorator, what a handler
receives (``EndpointRequest``) and may return (``EndpointResponse``), and the table of a
loaded runtime's endpoints (``endpoint_table``).

A handler is a method of the runtime::

    @custom_endpoint("/reports/latest", methods=["GET"])
    def latest(self, request: EndpointRequest) -> Any: ...

served at ``/v2/models/{name}[/versions/{v}]/reports/latest`` over REST and through
``inferpool.CustomService/Call`` over gRPC, in the process that holds the model. It
returns a body (bytes, str, or anything JSON-able) or an ``EndpointResponse`` that sets
the status, content type and headers too. The older ``Runtime.custom_endpoints()`` dict
(name → callable(raw body)) keeps working: each entry is a POST endpoint answering JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from inferpool.errors import BadRequest, ModelLoadError
from inferpool.protocol.endpoints import check_methods, normalize

if TYPE_CHECKING:
    from inferpool.runtimes.base import Runtime

_ATTRIBUTE = "__inferpool_endpoint__"
Handler = TypeVar("Handler", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class EndpointRequest:
    """A call of a custom endpoint: REST's request, or gRPC's ``Call`` (``metadata`` as
    headers). Header names are lower-case."""

    method: str
    path: str  # as registered: "reports/latest"
    query: str = ""  # the raw query string ("" over gRPC)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def text(self) -> str:
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest(f"/{self.path}: the body is not UTF-8 text") from None

    def json(self) -> Any:
        """The body as JSON; a 400 when it is not."""
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise BadRequest(f"/{self.path}: the body is not valid JSON ({exc})") from None


@dataclass(slots=True)
class EndpointResponse:
    """A handler's answer with its own status, content type and headers. ``body``: bytes,
    str (sent as UTF-8 text), or anything JSON-able (sent as JSON)."""

    body: Any = b""
    status: int = 200
    content_type: str | None = None  # None: JSON for a JSON-able body, else octet-stream/text
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint of a loaded runtime: its methods and how to call it."""

    methods: tuple[str, ...]
    call: Callable[[EndpointRequest], Any]


def custom_endpoint(path: str, methods: Sequence[str] = ("POST",)) -> Callable[[Handler], Handler]:
    """Register a runtime method as a custom endpoint at ``path`` (one or more segments)
    for ``methods`` (GET, POST, PUT, PATCH, DELETE). A bad path or method is refused when
    the class is defined."""
    normalized = normalize(path)
    allowed = check_methods(methods, path)

    def register(function: Handler) -> Handler:
        setattr(function, _ATTRIBUTE, (normalized, allowed))
        return function

    return register


def endpoint_table(runtime: Runtime) -> dict[str, Endpoint]:
    """Every endpoint of a loaded runtime by path: its decorated methods, then the entries
    of its ``custom_endpoints()`` dict (POST, the raw body in). A ModelLoadError names a
    path registered twice or a dict name that is not a usable path."""
    table: dict[str, Endpoint] = {}
    for name in dir(type(runtime)):
        declared = getattr(getattr(type(runtime), name, None), _ATTRIBUTE, None)
        if declared is None:
            continue
        path, methods = declared
        if path in table:
            raise ModelLoadError(f"custom endpoint '/{path}' is registered twice")
        table[path] = Endpoint(methods, getattr(runtime, name))
    for name, function in runtime.custom_endpoints().items():
        try:
            path = normalize(name)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        if path in table:
            raise ModelLoadError(f"custom endpoint '/{path}' is registered twice")
        table[path] = Endpoint(("POST",), _raw_body(function))
    return table


def _raw_body(function: Callable[[bytes], Any]) -> Callable[[EndpointRequest], Any]:
    """A ``custom_endpoints()`` entry as a handler: it takes the raw body only, and its
    answer is JSON (bytes as they are: JSON already, as MLflow's scoring endpoint's)."""

    def handler(request: EndpointRequest) -> EndpointResponse:
        result = function(request.body)
        if not isinstance(result, bytes):
            result = orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        return EndpointResponse(result, content_type="application/json")

    return handler
