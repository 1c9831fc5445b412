"""Correctness before speed: send a payload once and check status and predictions.

A scenario measures only after its exact request bytes came back 200/OK carrying the
expected predictions; the response size is kept (h2load infers gRPC errors from it).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import numpy as np

from benchmarks import native_peers
from benchmarks.payloads import (
    Payload,
    decode_grpc_response,
    decode_rest_response,
    grpc_unframe,
    predictions_match,
)
from benchmarks.servers import RunningServer
from benchmarks.shm_payload import register


class CheckFailed(Exception):
    """The server answered the scenario's request wrongly; the message says how."""


def check_rest(
    base_url: str,
    payload: Payload,
    timeout: float = 30.0,
    decode: Callable[[dict[str, str], bytes], np.ndarray] = decode_rest_response,
) -> int:
    """Post the payload; return the response body size. ``decode`` reads the predictions
    (a V2 response unless told otherwise: a native peer's own JSON)."""
    try:
        response = httpx.post(
            base_url + payload.path, content=payload.body, headers=payload.headers, timeout=timeout
        )
    except httpx.HTTPError as exc:
        raise CheckFailed(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise CheckFailed(f"HTTP {response.status_code}: {response.text[:300]}")
    try:
        got = decode(dict(response.headers), response.content)
    except (ValueError, KeyError) as exc:
        raise CheckFailed(f"undecodable response ({exc}): {response.content[:300]!r}") from exc
    compare(got, payload)
    return len(response.content)


def check_grpc(address: str, payload: Payload, timeout: float = 30.0) -> int:
    """Call ModelInfer with the payload's message; return the response frame size."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(payload.path)  # no serializers: raw bytes both ways
        try:
            message = call(grpc_unframe(payload.body), timeout=timeout)
        except grpc.RpcError as exc:
            raise CheckFailed(f"gRPC {exc.code().name}: {exc.details()}") from exc
    compare(decode_grpc_response(message), payload)
    return 5 + len(message)  # as framed on the wire, which h2load counts as DATA


def compare(got: object, payload: Payload) -> None:
    if not predictions_match(got, payload.expected):
        raise CheckFailed(
            f"wrong predictions: got {list(got)[:5]}..., expected {list(payload.expected)[:5]}..."
        )


def check(server: RunningServer, payload: Payload) -> int:
    """Check one payload against a server; return its response size on the wire."""
    if payload.transport == "grpc":
        address = f"{server.target.host}:{server.target.grpc_port}"
        if payload.region is not None:  # grpc-shm: the region its message names
            register(address, payload.region)
        return check_grpc(address, payload)
    if server.spec.kind in native_peers.PEERS:
        return check_rest(server.http_base, payload, decode=native_peers.decode_answer)
    return check_rest(server.http_base, payload)
