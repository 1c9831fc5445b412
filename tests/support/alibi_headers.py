"""The ``x-seldon-alibi-*`` headers an alibi runtime's answer carries, read where MLServer
sends them: HTTP response headers, gRPC trailing metadata; never the body's parameters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

PREFIX = "x-seldon-alibi-"


def alibi_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The alibi headers among name → value pairs (HTTP headers, gRPC metadata)."""
    return {name.lower(): value for name, value in pairs if name.lower().startswith(PREFIX)}


def answer_with_headers(response: httpx.Response) -> dict:
    """A 200 answer's JSON, with its alibi HTTP headers under ``alibi_headers``: they must
    have left the body (``parameters.headers``), as MLServer moves them."""
    assert response.status_code == 200, response.text
    document = response.json()
    assert "headers" not in document.get("parameters", {}), document["parameters"]
    document["alibi_headers"] = alibi_headers(response.headers.items())
    return document


def reply_with_headers(stub: Any, request: Any, timeout: float) -> tuple[Any, dict[str, str]]:
    """A gRPC ModelInfer's reply and its alibi headers (trailing metadata): they must have
    left the reply's parameters, as MLServer moves them (``answer_with_headers`` over
    gRPC)."""
    reply, call = stub.ModelInfer.with_call(request, timeout=timeout)
    assert "headers" not in reply.parameters, dict(reply.parameters)
    return reply, alibi_headers(call.trailing_metadata())
