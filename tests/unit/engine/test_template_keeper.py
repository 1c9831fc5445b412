"""The template keeper (engine/template_keeper.py) over a fake template process: what it
preloads, what it never shares, and how a template that dies loading a model is restarted
without it, the model failing with one sentence from then on."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.pool import template_keeper as keeper_module
from inferpool.engine.pool.crashes import ExitStatuses
from inferpool.engine.pool.outages import Outages
from inferpool.engine.pool.template_keeper import TemplateKeeper, document_key
from inferpool.errors import ModelLoadError, NotReady, WorkerLost

Answer = Callable[[dict[str, Any]], messages.PreloadResult]


def shared(document: dict[str, Any]) -> messages.PreloadResult:
    return messages.PreloadResult(document["name"], None, True, "", 1024)


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.killed = False

    def kill(self) -> None:
        self.killed = True


class FakeTemplate:
    """A template process: answers each preload with ``answer``, or hangs when told (all
    its loads, or those of the models named in ``hang_on``) until it dies."""

    started: list[FakeTemplate] = []
    answer: Answer = staticmethod(shared)
    hang = False
    hang_on: frozenset[str] = frozenset()

    def __init__(self, reported: Any, gone: Callable[[FakeTemplate], None], python: Any) -> None:
        self.gone = gone
        self.process = FakeProcess(2000 + len(FakeTemplate.started))
        self.loading: messages.Loading | None = None
        self.loading_since = 0.0
        self.hung: float | None = None
        self.asked: list[list[str]] = []
        self.status = 0
        self.pending: list[asyncio.Future[None]] = []
        FakeTemplate.started.append(self)

    async def preload(self, documents: list[dict[str, Any]]) -> list[messages.PreloadResult]:
        self.asked.append([document["name"] for document in documents])
        if FakeTemplate.hang or FakeTemplate.hang_on & set(self.asked[-1]):
            self.loading = messages.Loading(documents[0]["name"], None)
            self.loading_since = time.monotonic()
            pending = asyncio.get_running_loop().create_future()
            self.pending.append(pending)
            await pending  # WorkerLost once it dies
        return [FakeTemplate.answer(document) for document in documents]

    def die(self, status: int, loading: str | None = None) -> None:
        """It exits (its channel's EOF), in the middle of loading ``loading``."""
        self.status = status
        self.loading = (
            None if loading is None else messages.Loading(loading, None, "m.pkl", "joblib")
        )
        for pending in self.pending:
            pending.set_exception(WorkerLost("the worker template process exited"))
        self.gone(self)

    async def reap(self) -> int:
        return self.status

    async def stop(self, timeout: float) -> None:
        pass


class Served:
    """The models served now (a restarted template preloads them)."""

    def __init__(self) -> None:
        self.documents: list[dict[str, Any]] = []
        self.started = True

    def shared_documents(self) -> list[dict[str, Any]]:
        return list(self.documents)


@pytest.fixture(autouse=True)
def fake_template(monkeypatch) -> None:
    FakeTemplate.started = []
    FakeTemplate.answer = staticmethod(shared)
    FakeTemplate.hang = False
    FakeTemplate.hang_on = frozenset()
    monkeypatch.setattr(keeper_module, "TemplateProcess", FakeTemplate)
    monkeypatch.setattr(keeper_module, "WATCH_INTERVAL", 0.01)


def make(served: Served | None = None, load_timeout: float = 0.0) -> TemplateKeeper:
    tasks: list[asyncio.Task[Any]] = []

    def keep(work: Coroutine[Any, Any, Any]) -> None:
        tasks.append(asyncio.ensure_future(work))

    return TemplateKeeper(
        ExitStatuses(), Outages(1), served or Served(), lambda: False, keep, lambda: None,
        load_timeout=load_timeout,
    )  # fmt: skip


def doc(name: str, version: str | None = None) -> dict[str, Any]:
    return {"name": name, "parameters": {"version": version}}


def test_the_template_is_up_once_it_preloaded_the_repository() -> None:
    async def scenario() -> None:
        keeper = make()
        keeper.start([doc("a"), doc("b")])
        template = await keeper.running()
        assert template is FakeTemplate.started[0]
        assert template.asked == [["a", "b"]]

    asyncio.run(scenario())


def test_a_model_whose_load_started_a_thread_is_never_shared_and_the_template_restarts() -> None:
    def threads(document: dict[str, Any]) -> messages.PreloadResult:
        forked = document["name"] == "torch"
        return messages.PreloadResult(
            document["name"], None, True, "threads", 1, forked_threads=forked
        )

    FakeTemplate.answer = staticmethod(threads)

    async def scenario() -> None:
        served = Served()
        served.started = False
        keeper = make(served)
        keeper.start([doc("torch"), doc("a")])
        await asyncio.sleep(0.05)
        assert "torch" in keeper.unshareable
        first = FakeTemplate.started[0]
        first.die(0)  # it exits after answering, having threads now
        template = await keeper.running()
        assert template is FakeTemplate.started[1]
        # Restarted before start-up ended: the repository's models, but the unshareable one.
        assert template.asked == [["a"]]
        assert keeper.restarts == 1
        assert await keeper.preload(doc("torch")) is None  # each worker loads it
        assert template.asked == [["a"]]  # not asked again

    asyncio.run(scenario())


def test_a_preload_answers_the_copy_or_none_when_the_template_does_not_hold_it() -> None:
    def answer(document: dict[str, Any]) -> messages.PreloadResult:
        return messages.PreloadResult(
            document["name"], None, True, "", 5, shareable=document["name"] != "gpu"
        )

    FakeTemplate.answer = staticmethod(answer)

    async def scenario() -> None:
        keeper = make()
        keeper.start([])
        result = await keeper.preload(doc("a"))
        assert result is not None and result.size == 5
        assert await keeper.preload(doc("gpu")) is None

    asyncio.run(scenario())


def test_a_model_that_kills_the_template_fails_with_a_sentence_and_is_never_asked_again() -> None:
    async def scenario() -> None:
        served = Served()
        served.documents = [doc("good")]
        keeper = make(served)
        keeper.start([doc("good")])
        await keeper.running()
        FakeTemplate.hang_on = frozenset({"bad"})
        asking = asyncio.ensure_future(keeper.preload(doc("bad")))
        await asyncio.sleep(0.05)
        FakeTemplate.started[0].die(signal.SIGSEGV, loading="bad")
        with pytest.raises(ModelLoadError, match=r"crashed \(SIGSEGV\)"):
            await asking
        restarted = await keeper.running()
        assert restarted is FakeTemplate.started[1]
        assert restarted.asked == [["good"]]  # the served models, without the culprit
        FakeTemplate.hang_on = frozenset()
        with pytest.raises(ModelLoadError, match=r"crashed \(SIGSEGV\)"):
            await keeper.preload(doc("bad"))
        assert restarted.asked == [["good"]]
        # Another version is other files: it may be tried.
        assert await keeper.preload(doc("bad", "2")) is not None

    asyncio.run(scenario())


def test_a_load_hung_past_the_load_timeout_kills_the_template() -> None:
    FakeTemplate.hang = True

    async def scenario() -> None:
        keeper = make(load_timeout=0.05)
        keeper.start([doc("slow")])
        template = FakeTemplate.started[0]
        for _ in range(200):
            if template.process.killed:
                break
            await asyncio.sleep(0.01)
        assert template.process.killed and template.hung == 0.05

    asyncio.run(scenario())


def test_a_template_that_never_comes_up_is_not_ready(monkeypatch) -> None:
    FakeTemplate.hang = True
    monkeypatch.setattr(keeper_module, "START_TIMEOUT", 0.05)

    async def scenario() -> None:
        keeper = make()
        keeper.start([doc("slow")])
        FakeTemplate.started[0].loading_since = 0.0  # no progress since long ago
        with pytest.raises(NotReady, match=r"template process did not come up within 0\.05s"):
            await keeper.running()

    asyncio.run(scenario())


def test_a_template_lost_while_loading_another_model_is_asked_again(monkeypatch) -> None:
    async def scenario() -> None:
        keeper = make()
        keeper.start([])
        first = await keeper.running()
        answers = iter([WorkerLost("template exited"), None])

        async def preload_once_lost(documents: list[dict[str, Any]]) -> list[Any]:
            error = next(answers)
            if error is not None:
                first.die(0)  # it died loading nothing of ours: restarted at once
                raise error
            return [shared(document) for document in documents]

        monkeypatch.setattr(first, "preload", preload_once_lost)
        result = await keeper.preload(doc("a"))
        assert result is not None and result.name == "a"
        assert keeper.restarts == 1

    asyncio.run(scenario())


def test_document_key_names_the_version() -> None:
    assert document_key(doc("m")) == "m"
    assert document_key(doc("m", "2")) == "m\x002"
