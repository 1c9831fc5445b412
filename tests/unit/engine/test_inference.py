"""The request path alone, over a fake runner: what it refuses, and how it counts every
outcome (answered, refused, past its deadline, cancelled) in the version's statistics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from types import SimpleNamespace

import pytest

from inferpool.engine.accounting import Accounting
from inferpool.engine.inference import Inference
from inferpool.engine.ipc.messages import Kind, Reply
from inferpool.engine.ipc.stream_ops import MORE
from inferpool.engine.pipelines.manager import Pipelines
from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.engine.stats import REST
from inferpool.errors import DeadlineExceeded, ModelLoading, ModelNotFound, Overloaded
from inferpool.settings import ModelSettings, ServerSettings


def path(
    *statuses: ModelStatus,
    hang: bool = False,
    model_timeout: float = 0,
    full: frozenset[str] = frozenset(),
) -> Inference:
    """``full``: the versions whose every queue is full (the overload check refuses)."""
    table = ModelTable()
    for status in statuses:
        table.set(status)
    settings = ServerSettings(model_timeout=model_timeout)

    async def run(key: str, kind: int, body: bytes, *_: object) -> Reply:
        if hang:
            await asyncio.sleep(60)
        return Reply(200, body, rows=1, execution=1)

    async def run_stream(key: str, kind: int, body: bytes, *_: object) -> AsyncGenerator[Reply]:
        yield Reply(200, b"1", flags=MORE)
        yield Reply(200, b"", rows=1, execution=1)

    pipelines = Pipelines(SimpleNamespace(table=table))  # type: ignore[arg-type]

    def overload(key: str) -> Overloaded | None:
        return Overloaded(f"{key} is full") if key in full else None

    accounting = Accounting(settings, table)
    return Inference(settings, table, accounting, pipelines, run, run_stream, overload)


def codes(inference: Inference, key: str) -> dict[int, int]:
    stats = inference.accounting.stats[key]
    assert stats.in_flight == 0
    return stats.codes[REST]


def test_a_ready_version_answers_and_is_counted() -> None:
    inference = path(ModelStatus("m", None, ModelState.READY))
    reply = asyncio.run(inference.infer("m", None, Kind.REST, b"x", None))
    assert (reply.status, reply.body) == (200, b"x")
    assert codes(inference, "m") == {200: 1}


def test_refusals_are_counted_except_an_unknown_model() -> None:
    inference = path(ModelStatus("m", None, ModelState.LOADING))
    with pytest.raises(ModelLoading):
        asyncio.run(inference.infer("m", None, Kind.REST, b"x", None))
    with pytest.raises(ModelNotFound):
        asyncio.run(inference.infer("nobody", None, Kind.REST, b"x", None))
    assert codes(inference, "m") == {503: 1} and list(inference.accounting.stats) == ["m"]


def test_a_passed_deadline_is_refused_before_running() -> None:
    inference = path(ModelStatus("m", None, ModelState.READY))
    with pytest.raises(DeadlineExceeded):
        asyncio.run(inference.infer("m", None, Kind.REST, b"x", None, time.monotonic() - 1))
    assert codes(inference, "m") == {504: 1}
    assert inference.accounting.stats["m"].failures == {"timeout": 1}


@pytest.mark.parametrize(("seconds", "code"), [(0.05, 504), (None, 499)])
def test_a_cancelled_request_is_a_timeout_at_its_deadline_else_cancelled(
    seconds: float | None, code: int
) -> None:
    inference = path(ModelStatus("m", None, ModelState.READY), hang=True)

    async def scenario() -> None:
        deadline = None if seconds is None else time.monotonic() + seconds
        task = asyncio.ensure_future(inference.infer("m", None, Kind.REST, b"x", None, deadline))
        await asyncio.sleep(0.1 if seconds is None else seconds + 0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert codes(inference, "m") == {code: 1}


def test_a_stream_is_counted_once_when_it_ends_or_the_caller_leaves() -> None:
    inference = path(ModelStatus("m", None, ModelState.READY))

    async def scenario(whole: bool) -> list[Reply]:
        replies = inference.infer_stream("m", None, Kind.REST_STREAM, b"", None)
        got = [await anext(replies)]
        if whole:
            got += [reply async for reply in replies]
        await replies.aclose()
        return got

    assert [r.flags & MORE for r in asyncio.run(scenario(True))] == [MORE, 0]
    assert codes(inference, "m") == {200: 1}
    asyncio.run(scenario(False))
    assert codes(inference, "m") == {200: 1, 499: 1}


def test_the_chunk_timeout_is_the_model_s_else_the_server_s() -> None:
    own = ModelStatus("m", None, settings=ModelSettings(name="m", timeout=2))
    bare = ModelStatus("n", None)
    assert path(model_timeout=7).chunk_timeout(own) == 2
    assert path(model_timeout=7).chunk_timeout(bare) == 7
    assert path(model_timeout=0).chunk_timeout(bare) is None  # 0: no limit


def test_the_early_refusal_decides_from_the_name_and_counts_what_it_refuses() -> None:
    """``refusal`` (a frontend asks it before reading a body): 404 unknown, 503 not READY
    or every queue full, each counted as ``infer`` counts it; None admits."""
    inference = path(
        ModelStatus("m", None, ModelState.READY),
        ModelStatus("full", None, ModelState.READY),
        ModelStatus("loading", None, ModelState.LOADING),
        full=frozenset({"full"}),
    )
    assert inference.refusal("m", None, Kind.REST) is None
    assert isinstance(inference.refusal("nobody", None, Kind.REST), ModelNotFound)
    assert isinstance(inference.refusal("loading", None, Kind.REST), ModelLoading)
    refused = inference.refusal("full", None, Kind.REST)
    assert isinstance(refused, Overloaded) and refused.status == 503
    assert codes(inference, "full") == {503: 1}
    assert inference.accounting.stats["full"].failures == {"overloaded": 1}
    assert codes(inference, "loading") == {503: 1}
    assert "m" not in inference.accounting.stats and "nobody" not in inference.accounting.stats
