"""ModelStreamInfer as MLServer serves it: the call's whole stream to one ``predict_stream``.

A model whose runtime takes a client's whole stream (an MLServer custom runtime with its
own ``predict_stream``: ``Announced.stream_input``) gets, at a call's first request, one
``predict_stream`` call whose payloads are that request and then each one the client
sends, as it sends it (``Kind.GRPC_STREAM_IN``; ``engine/stream_feed.py`` feeds them).
Its responses go out as they come, in the call's message (``stream_message.py``), every
one under the first request's id. The call ends when the runtime's generator ends, having
taken every request or not (MLServer's). Facts kept from MLServer 1.7.1: the model is the
one the first request names; an error ends the call. Where inferpool differs: a later
request that names another model (or version) is refused, ending the call with
INVALID_ARGUMENT, where MLServer would silently run it on the first one's model (a
request without ``model_name`` joins the stream's model). With Triton's message the error
is one ``error_message`` and the call then ends (the stream cannot go on without its
``predict_stream``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from inferpool.engine.ipc.messages import Kind
from inferpool.errors import HTTP_OF_GRPC, BadRequest, InferpoolError, from_status
from inferpool.frontends.grpc.stream_message import response_message, stream_error
from inferpool.protocol.protowire import scan_fields

if TYPE_CHECKING:
    from inferpool.engine.client import EngineClient

# ModelInferRequest: model_name (1), model_version (2).
_NAME, _VERSION = 1, 2


async def stream_messages(
    client: EngineClient,
    body: bytes,
    route: Callable[[bytes], tuple[str, str | None, str | None]],
    deadline: float | None,
    mlserver: bool,
    requests: AsyncIterator[bytes] | None = None,
) -> AsyncIterator[bytes]:
    """The call's messages answering ``body`` (its model read by ``route``): its chunks,
    or its one response. ``requests``: the call's later requests, fed to the same
    ``predict_stream`` (the module's text); None: ``body`` alone, Triton's semantics. An
    error is raised with MLServer's message (the call ends with its status), one
    ``error_message`` with Triton's."""
    try:
        name, version, _ = route(body)
        kind, more = Kind.GRPC_STREAM, None
        if requests is not None:
            kind, more = Kind.GRPC_STREAM_IN, _same_model(requests, name, version)
        replies = client.infer_stream(name, version, kind, body, None, deadline, more)
        try:
            async for reply in replies:
                if reply.status != 200:
                    raise from_status(reply.status, reply.body.decode("utf-8", "replace"))
                if reply.body:
                    yield response_message(reply.body, mlserver)
        finally:
            await replies.aclose()
    except InferpoolError as exc:
        if mlserver:
            raise  # MLServer's: the call ends with the error's status
        yield stream_error(exc.message)


async def _same_model(
    requests: AsyncIterator[bytes], name: str, version: str | None
) -> AsyncIterator[bytes]:
    """The call's later requests, each refused (400) if it names another model. The
    call's own failure (h2's ``CallError``: a flood past ``max_body_bytes``, a message cut
    short) keeps its gRPC status."""
    position = 1
    while True:
        try:
            body = await anext(requests)
        except StopAsyncIteration:
            return
        except (InferpoolError, asyncio.CancelledError):
            raise
        except Exception as exc:
            status = HTTP_OF_GRPC.get(getattr(exc, "code", "INTERNAL"), 500)
            raise from_status(status, str(exc)) from None
        position += 1
        try:
            fields = scan_fields(body, (_NAME, _VERSION))
        except ValueError:
            raise BadRequest(f"request {position} of the stream is no ModelInferRequest") from None
        other = fields.get(_NAME, b"").decode("utf-8", "replace")
        other_version = fields.get(_VERSION, b"").decode("utf-8", "replace") or None
        if (other and other != name) or (other_version and other_version != version):
            named = f"'{other or name}'" + (f" version {other_version}" if other_version else "")
            raise BadRequest(
                f"request {position} of the stream names model {named}, but this stream "
                f"runs model '{name}'"
                + (f" version {version}" if version else "")
                + ": one ModelStreamInfer call streams to one model"
            )
        yield body
