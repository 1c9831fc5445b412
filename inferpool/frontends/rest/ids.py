"""A REST request's id: taken from its ``x-request-id`` header at arrival, else settled
once the reply is in (``answer.answered``), in one place for every route.

The id lives in the scope (the answer, the access log and the span read it there) and in
``current_request_id`` (``inferpool.request_ids``: log records).
"""

from __future__ import annotations

from typing import Any

from inferpool.frontends.access_log import REQUEST_ID
from inferpool.frontends.request_context import from_header, generate
from inferpool.request_ids import current_request_id


def take_header_id(scope: Any, header: bytes | None) -> None:
    """The id from ``x-request-id`` (``header``, its raw value), if given (400 if
    unusable): known from arrival on."""
    request_id = from_header(header)
    if request_id is None:
        scope[REQUEST_ID] = None  # resolved once the reply is in (``answer.answered``)
    else:
        settle_id(scope, request_id)


def settle_id(scope: Any, request_id: str) -> str:
    """The one place a REST request's id is set, once known."""
    scope[REQUEST_ID] = request_id
    current_request_id.set(request_id)
    return request_id


def final_id(scope: Any) -> str:
    """The id an answer goes out with: the one known, else a new one (settled)."""
    return settle_id(scope, scope.get(REQUEST_ID) or generate())
