"""The control messages of a runtime's call to another model (``inferpool/calls.py``).

A worker sends ``Call`` when a runtime it runs calls a model; the frontend runs it as
any request and answers ``CallReply`` with the callee's status and body (its V2 JSON
response, or the error's message). ``parents`` are the ring ids of the requests the
caller is running (its worker's running record): the frontend finds through them the
chain of calls they belong to, to refuse a cycle or a chain too deep. A thread other
than the worker's loop sends its calls on a socket of its own (``CallChannel``).
"""

from __future__ import annotations

from inferpool.engine.ipc.ops import Control, Op


class Call(Control, frozen=True):
    op = Op.CALL
    call_id: int  # the worker's, echoed in the reply
    model: str
    version: str | None
    body: bytes  # a V2 REST request
    caller: str  # the calling model's name ("" when unknown)
    parents: list[int]  # ring ids of the requests the caller is running
    timeout: float  # seconds
    json_length: int = -1  # of the body's JSON part when binary tensors follow (-1: none)


class CallChannel(Control, frozen=True):
    """Sent with one end of a socketpair: the calls of one thread of the worker that is
    not its loop (a runtime's own, a stream's) travel on it, and their answers, so that
    they never wait for the worker's loop, which may be busy in the very predict that
    waits for them."""

    op = Op.CALL_CHANNEL


class CallReply(Control, frozen=True):
    op = Op.CALL_REPLY
    call_id: int
    status: int
    body: bytes  # 200: the V2 REST response; else the error's message
    json_length: int = -1  # of the body's JSON part when binary tensors follow (-1: none)
