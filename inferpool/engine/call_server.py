"""The frontend's side of a runtime's calls to other models (``inferpool/calls.py``).

``CallServer.serve`` runs one call as any request of the engine client (``infer``: the
model table, readiness, rate limits, the dispatcher's least-loaded worker, statistics)
and answers ``(status, body, json_length)``. It refuses, before anything runs, a call
that would close a cycle (a model calling itself, or one that called it) or nest deeper
than ``MAX_DEPTH``: it knows the chain of models behind each call it runs by the request id
it gives the callee's request (``request_ids.current_request_id``, which the
dispatcher records for the callee's worker and which that worker's own calls name
through their parents' ring ids); a request that came from a client starts a chain.
Past its timeout a call is cancelled (its request is dropped if it has not started)
and answered 504; a call made by a callee gets at most what is left of its caller's.

``InProcessCalls`` is the backend of ``--workers 0``: a runtime's predict runs in a
predict thread (``predict_threads.py``), which hands the call to the event loop and
waits, while the predict threads grow by one so that the callee finds a free thread.
Worker processes send their calls over their control channel (``PoolClient``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from inferpool import calls
from inferpool.engine.ipc.messages import Kind
from inferpool.errors import InferpoolError
from inferpool.request_ids import current_request_id

if TYPE_CHECKING:
    from inferpool.engine.client import EngineClient
    from inferpool.engine.predict_threads import PredictThreads

logger = logging.getLogger(__name__)

# Seconds a caller waits past its call's timeout for the frontend's answer (which comes
# at the timeout) before it gives up on its own.
GRACE = 5.0
_ON_THE_LOOP = (
    b"calls to other models need predict threads: with --workers 0 and "
    b"--stall-threshold 0 a predict runs on the event loop, which cannot wait for one"
)


class CallServer:
    """Runs runtimes' calls through one engine client, bounding their chains."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        # The chain of models behind each call running now, and its deadline (monotonic),
        # by its request id.
        self.chains: dict[str, tuple[tuple[str, ...], float]] = {}
        self._numbers = itertools.count(1)

    def chain_of(self, request_ids: Iterable[str | None]) -> tuple[tuple[str, ...], float]:
        """The longest chain of calls any of these requests belongs to (a client's: none),
        and the earliest deadline among those calls (infinity: none)."""
        known = [self.chains[request_id] for request_id in request_ids if request_id in self.chains]
        chain = max((chain for chain, _ in known), key=len, default=())
        return chain, min((deadline for _, deadline in known), default=math.inf)

    async def serve(
        self,
        model: str,
        version: str | None,
        body: bytes,
        json_length: int | None,
        caller: str,
        parents: list[str | None],
        timeout: float,
    ) -> tuple[int, bytes, int | None]:
        """The callee's status, body (its V2 REST response, or the error's message) and
        the length of the body's JSON part when binary tensors follow (else None)."""
        chain, outer_deadline = self.chain_of(parents)
        chain += (caller,) if caller else ()
        if model in chain:
            path = " -> ".join(f"'{name}'" for name in (*chain, model))
            message = f"call cycle {path}: a model may not call itself or a model that called it"
            return 400, message.encode(), None
        if len(chain) >= calls.MAX_DEPTH:
            path = " -> ".join(f"'{name}'" for name in (*chain, model))
            return 400, f"calls nest deeper than {calls.MAX_DEPTH} models: {path}".encode(), None
        # A call made by a callee never outlives the call that made it.
        timeout = min(timeout, outer_deadline - time.monotonic())
        if timeout <= 0:
            return 504, b"the call that made this one ran out of time", None
        outer = next((request_id for request_id in parents if request_id), None) or "call"
        request_id = f"{outer}/{model}-{next(self._numbers)}"
        deadline = time.monotonic() + timeout
        self.chains[request_id] = (chain, deadline)
        token = current_request_id.set(request_id)
        try:
            async with asyncio.timeout(timeout):
                reply = await self.client.infer(
                    model, version, Kind.REST, body, json_length, deadline
                )
        except TimeoutError:
            message = f"model '{model}' did not answer within the call's timeout ({timeout:g} s)"
            return 504, message.encode(), None
        except InferpoolError as exc:
            return exc.status, exc.message.encode(), None
        except Exception as exc:  # a bug of ours: the caller still gets an answer
            logger.exception("call to model %r failed", model)
            return 500, f"internal error: {type(exc).__name__}: {exc}".encode(), None
        finally:
            current_request_id.reset(token)
            del self.chains[request_id]
        return reply.status, reply.body, reply.json_length


class InProcessCalls:
    """``--workers 0``: calls from the predict threads, run on the event loop."""

    def __init__(
        self, server: CallServer, loop: asyncio.AbstractEventLoop, threads: PredictThreads | None
    ) -> None:
        self.server = server
        self.loop = loop
        self.threads = threads

    def call(
        self, model: str, version: str | None, body: bytes, json_length: int | None, timeout: float
    ) -> tuple[int, bytes, int | None]:
        if self.threads is None or _on_a_loop():
            return 500, _ON_THE_LOOP, None
        caller = (self.threads.current_key() or "").partition("\x00")[0]  # (a ModelKey)
        parent = current_request_id.get()  # the predict's own request (copied into its thread)
        serving = self.server.serve(model, version, body, json_length, caller, [parent], timeout)
        with self.threads.blocked():
            future = asyncio.run_coroutine_threadsafe(serving, self.loop)
            try:
                return future.result(timeout + GRACE)
            except TimeoutError:
                future.cancel()
                return 504, f"model '{model}' did not answer within {timeout:g} s".encode(), None
            except concurrent.futures.CancelledError:  # the loop is closing
                return 503, b"the server is shutting down", None


def _on_a_loop() -> bool:
    """This thread runs an event loop (a predict on the loop: ``--stall-threshold 0``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
