"""The frontend's side of a runtime's calls (``engine/call_server.py``), with a stand-in
engine client: the callee's request id carries its chain, cycles and chains too deep are
refused before anything runs, a call is cut at its timeout and never outlives the call
that made it, and nothing is left behind."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from inferpool.calls import MAX_DEPTH
from inferpool.engine.call_server import CallServer
from inferpool.engine.ipc.messages import Reply
from inferpool.errors import ModelNotFound
from inferpool.request_ids import current_request_id


class Client:
    """Runs each model as ``behaviour[model](request_id)``, noting the request ids."""

    def __init__(self) -> None:
        self.server = CallServer(self)  # type: ignore[arg-type]
        self.behaviour: dict[str, Any] = {}
        self.seen: list[tuple[str, str | None, float | None]] = []

    async def infer(self, model, version, kind, body, json_length, deadline) -> Reply:
        request_id = current_request_id.get()
        self.seen.append((model, request_id, deadline))
        if model not in self.behaviour:
            raise ModelNotFound(f"model '{model}' not found")
        return await self.behaviour[model](request_id)


def serve(client: Client, model: str, caller: str, parents, timeout: float = 5.0):
    return client.server.serve(model, None, b"{}", None, caller, parents, timeout)


def test_a_callee_calling_back_up_its_chain_is_refused_naming_the_chain() -> None:
    client = Client()
    answers: list[tuple[int, bytes, int | None]] = []

    async def b(request_id: str) -> Reply:  # b's predict calls c, whose predict calls a
        answers.append(await serve(client, "c", "b", [request_id]))
        return Reply(200, b"{}")

    async def c(request_id: str) -> Reply:
        answers.append(await serve(client, "a", "c", [request_id]))
        return Reply(200, b"{}")

    client.behaviour = {"b": b, "c": c}
    assert asyncio.run(serve(client, "b", "a", ["outer"])) == (200, b"{}", None)
    status, message, _ = answers[0]  # c's call to a (answered first)
    assert status == 400
    assert message.decode().startswith("call cycle 'a' -> 'b' -> 'c' -> 'a'")
    assert [(model, request_id) for model, request_id, _ in client.seen] == [
        ("b", "outer/b-1"),
        ("c", "outer/b-1/c-2"),
    ]
    assert client.server.chains == {}


def test_a_chain_past_the_limit_is_refused() -> None:
    client = Client()
    ran: list[str] = []

    async def relay(request_id: str) -> Reply:
        model = f"m{len(ran) + 1}"
        ran.append(model)
        status, body, _ = await serve(client, f"m{len(ran) + 1}", model, [request_id])
        return Reply(status, body)

    client.behaviour = {f"m{number}": relay for number in range(1, MAX_DEPTH + 2)}
    status, body, _ = asyncio.run(serve(client, "m1", "m0", [None]))
    assert status == 400
    assert f"calls nest deeper than {MAX_DEPTH} models: 'm0' -> 'm1'" in body.decode()
    assert len(ran) == MAX_DEPTH - 1  # m0 is the client's model; m8 never runs
    assert client.server.chains == {}


def test_an_unknown_model_answers_its_status() -> None:
    client = Client()
    assert asyncio.run(serve(client, "nope", "a", [None])) == (
        404,
        b"model 'nope' not found",
        None,
    )


def test_a_call_is_cut_at_its_timeout_and_its_callees_calls_with_it() -> None:
    client = Client()
    inner: list[tuple[int, bytes, int | None]] = []

    async def hang(request_id: str) -> Reply:
        await asyncio.sleep(10)
        return Reply(200, b"{}")

    async def relay(request_id: str) -> Reply:
        # Asks for 60 s, gets what is left of the 0.2 s of the call that made it.
        inner.append(await serve(client, "hang", "relay", [request_id], timeout=60))
        return Reply(200, b"{}")

    client.behaviour = {"hang": hang, "relay": relay}
    started = time.monotonic()
    status, body, _ = asyncio.run(serve(client, "relay", "a", [None], timeout=0.2))
    assert time.monotonic() - started < 2
    assert status == 504 and b"model 'relay' did not answer" in body
    (_, _, relay_deadline), (_, _, hang_deadline) = client.seen
    assert hang_deadline is not None and relay_deadline is not None
    assert hang_deadline <= relay_deadline + 0.001
    assert client.server.chains == {}
