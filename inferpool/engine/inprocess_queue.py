"""``workers=0``'s batching: the requests of a batching version that reached the engine in
one turn of the loop run as one predict (``InProcessClient._run_queued``), as a worker
joins what it drained; each request is answered from the execution that ran it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.states import ModelKey

if TYPE_CHECKING:
    from inferpool.engine.worker.model import LoadedModel
    from inferpool.engine.worker.path import Job


class Queue:
    """The requests of one batching version waiting to run together: they run at the
    loop's next turn (every request that reached the engine in this turn joins them), or
    after the model's ``max_batch_time`` when it sets one, or at once when they are as
    many as its rows (``batching.Batcher``'s rule for the workers); in predict threads,
    not before the version's previous joined predict has ended."""

    __slots__ = ("due", "model", "timer", "waiting")

    def __init__(self, model: LoadedModel, run: Callable[[ModelKey], None], key: ModelKey) -> None:
        self.model = model
        # Its time came while the version's previous predict ran: it runs when that ends.
        self.due = False
        self.waiting: list[tuple[Job, asyncio.Future[Reply]]] = []
        loop = asyncio.get_running_loop()
        wait = model.batching.wait_ns / 1e9
        self.timer: asyncio.Handle = (
            loop.call_later(wait, run, key) if wait else loop.call_soon(run, key)
        )

    def add(self, job: Job, future: asyncio.Future[Reply]) -> None:
        self.waiting.append((job, future))

    def full(self) -> bool:
        batching = self.model.batching
        return batching.wait_ns > 0 and len(self.waiting) >= batching.rows


def run_first(model: LoadedModel, job: Job) -> Reply:
    """A group of one, in a predict thread."""
    from inferpool.engine.worker.path import run_group

    return run_group(model, [job])[0]


def run_all(model: LoadedModel, jobs: list[Job]) -> list[tuple[list[int], list[Reply]]]:
    """Every execution of a batching version's queued requests, in a predict thread."""
    from inferpool.engine.worker.path import run_executions

    return list(run_executions(model, jobs))


Waiting = list[tuple["Job", asyncio.Future[Reply]]]
# Each execution of a joined predict: the positions of its requests, and their replies.
Executions = list[tuple[list[int], list[Reply]]]


def answer_executions(
    waiting: Waiting, executions: Iterable[tuple[list[int], list[Reply]]]
) -> None:
    """Answer each waiting request from the executions that ran it."""
    for positions, replies in executions:
        for position, reply in zip(positions, replies, strict=True):
            future = waiting[position][1]
            if not future.done():
                future.set_result(reply)


def answer(waiting: Waiting, done: asyncio.Future[Executions]) -> None:
    """The queued requests' executions came back from a predict thread."""
    if done.cancelled():
        return
    error = done.exception()
    if error is None:
        answer_executions(waiting, done.result())
    else:  # a bug of the path: answer every caller, never hang one
        fail(waiting, error)


def fail(waiting: Waiting, error: BaseException) -> None:
    for _, future in waiting:
        if not future.done():
            future.set_exception(error)
