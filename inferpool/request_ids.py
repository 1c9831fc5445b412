"""The request id of the request being handled: where every layer of the server process
finds it. A leaf: it imports nothing of inferpool's, so the engine (``dispatch``,
``handles``) and ``logs`` read it without loading the frontends, which resolve the id
(``frontends/request_context.py``: from a header, the V2 ``id``, or generated).

- ``current_request_id`` holds the resolved id while the server process handles an
  inference request, in that request's own task (so it never leaks to another request;
  in-process model code, ``--workers 0``, logs with it too). The frontends set it as soon
  as the id is known: REST in one place (``frontends/rest/ids.settle_id``), gRPC in one
  (``grpc/service.settle_id``). None otherwise. ``logs.ContextFilter`` reads it.
- ``resolve_internal(internal_id)``: the resolved id of the request the dispatcher sent to
  a worker under the ring header's ``request_id`` (one of the last ``RECENT`` it sent, so a
  worker's record that arrives after its reply still finds it); None when not known: its id
  was not resolved when it left (REST without ``x-request-id``), or it is long gone. The
  dispatcher calls ``track(internal_id)`` as it sends a request: a context variable read,
  and two list stores when the id is known.
"""

from __future__ import annotations

from contextvars import ContextVar

current_request_id: ContextVar[str | None] = ContextVar("inferpool_request_id", default=None)

# The ids of the last RECENT requests sent to workers, by ring request id modulo RECENT
# (the dispatcher numbers them 1, 2, 3, ...): fixed lists, nothing to remove or allocate.
RECENT = 4096
_internal_ids: list[int] = [0] * RECENT
_resolved: list[str | None] = [None] * RECENT


def resolve_internal(internal_id: int) -> str | None:
    """The resolved id of a request sent to a worker under ``internal_id``, if known."""
    slot = internal_id % RECENT
    return _resolved[slot] if _internal_ids[slot] == internal_id else None


def track(internal_id: int) -> None:
    """The dispatcher sends the current request to a worker as ``internal_id``."""
    request_id = current_request_id.get()
    if request_id is not None:
        slot = internal_id % RECENT
        _internal_ids[slot] = internal_id
        _resolved[slot] = request_id
