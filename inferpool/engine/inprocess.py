"""``workers=0``: models load and predict in the frontend process (embedding, debugging).

The worker path (``worker/path.py``) runs here on the event loop's thread; loads run
in a thread, one at a time, so the loop keeps answering health checks. A model that
batches (``worker/batching.py``) queues its requests until the loop's next turn, so
that the requests which reached the engine in one turn run as one predict, as a worker
joins what it drained; any other request runs at once. The embedded API
(``inferpool.Engine``) hands typed requests to ``infer_request``: no bytes at all, one
request per predict.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from inferpool import calls
from inferpool.engine.call_server import InProcessCalls
from inferpool.engine.client import EngineClient
from inferpool.engine.daemon_thread import in_daemon_thread
from inferpool.engine.environments.capabilities import here, importable_here
from inferpool.engine.environments.unpack import named_environment
from inferpool.engine.ipc.messages import Reply, RequestHeader
from inferpool.engine.load_probe import LoadProbe, probed
from inferpool.engine.pool.groups import lacking, runtime_library
from inferpool.engine.pool.placement_choice import PlacementError, place
from inferpool.engine.predict_threads import PredictThreads
from inferpool.engine.states import ModelKey, describe_key, model_key
from inferpool.errors import InferpoolError, ModelLoadError, from_status
from inferpool.protocol.types import InferenceRequest, InferenceResponse
from inferpool.settings import ModelSettings, ServerSettings

if TYPE_CHECKING:
    from inferpool.engine.worker.model import LoadedModel
    from inferpool.engine.worker.path import Job

logger = logging.getLogger(__name__)


class InProcessClient(EngineClient):
    """``workers=0``: models load and predict in the frontend process (embedding, debug)."""

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings)
        self.models: dict[ModelKey, LoadedModel] = {}  # per version
        # Requests of a batching version waiting for the loop's next turn (or for the
        # model's max_batch_time), per version.
        self._queued: dict[ModelKey, _Queue] = {}
        # Batching versions with a joined predict in a thread now: their next queue waits
        # for it to end, as a worker drains its ring only between predicts, so that the
        # requests arriving meanwhile join one predict rather than one each.
        self._predicting: set[ModelKey] = set()
        # Never the server process itself: it serves every model, and the API.
        if max(settings.worker_memory_limit, settings.worker_max_requests, settings.worker_max_rss):
            logger.warning(
                "--worker-memory-limit, --worker-max-requests and --worker-max-rss apply to "
                "worker processes; with --workers 0 there is none: nothing is limited or "
                "recycled"
            )
        # Predicts run off the loop, so that a hung one cannot stop it (predict_threads.py);
        # --stall-threshold 0: on the loop, as before.
        self.threads: PredictThreads | None = None
        if settings.stall_threshold > 0:
            self.threads = PredictThreads(1 + settings.max_standby_workers)
        self.probe = LoadProbe(settings.model_load_timeout)

    async def _start_workers(self) -> None:
        # A runtime's calls to other models, from its predict thread (call_server.py).
        self.calls = InProcessCalls(self.call_server, asyncio.get_running_loop(), self.threads)
        calls.install(self.calls)

    async def close(self) -> None:
        await super().close()
        await self.probe.close()
        calls.uninstall(getattr(self, "calls", None))

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        from inferpool.engine.worker.model import failure_reason, unload_model

        await self._check_capabilities(settings)
        if self.settings.load_probe and probed(settings):
            # A file that crashes its library fails here; meanwhile this process imports the
            # runtime's modules (what the probe's child does too), which cannot crash.
            imports = asyncio.ensure_future(in_daemon_thread(_import_runtime, settings))
            try:
                await self.probe.check(settings)
            finally:
                with contextlib.suppress(Exception):  # the load says why, if it must
                    await imports
        try:
            # A thread keeps the loop answering health checks while a model loads.
            model = await in_daemon_thread(_load_one_at_a_time, settings)
        except Exception as exc:
            raise InferpoolError(failure_reason(exc)) from None
        key = model_key(settings.name, settings.version)
        replaced = self.models.get(key)
        self.models[key] = model
        if replaced is not None:  # a reload: the old runtime's custom counters are kept
            await asyncio.to_thread(unload_model, replaced)
        predictor = model.runtime.predictor()
        if predictor:
            logger.info("%s: predicted by %s", describe_key(key), predictor)
        return model.announced()

    async def _check_capabilities(self, settings: ModelSettings) -> None:
        """The scheduler's capability filter, with this process as the one worker:
        ModelLoadError if the model names an environment or needs what is not here."""
        if named_environment(settings) is not None:
            raise ModelLoadError(
                f"model '{settings.name}' names an environment ({named_environment(settings)}): "
                "its replicas run in workers started with that environment's interpreter, "
                "and with --workers 0 there is none; start the server with --workers 1 or more"
            )
        tags = self.settings.worker_tags
        reason = await asyncio.to_thread(  # here() reads once, at the first that asks
            lacking,
            importable_here,
            lambda: here().with_tags(tags),
            settings.requirements,
            runtime_library(settings),
        )
        if reason is not None:
            refused = {reason: 1}
            try:
                place(settings.name, settings.replicas or 1, 0, [], None, refused)
            except PlacementError as exc:
                raise ModelLoadError(str(exc)) from None

    async def _unload(self, key: ModelKey) -> None:
        from inferpool.engine.worker.model import unload_model

        model = self.models.pop(key, None)
        if model is not None:  # off the loop: an MLServer model's unload() may take a while
            await asyncio.to_thread(unload_model, model)

    async def _infer(
        self, key: ModelKey, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        from inferpool.engine.worker.path import Job, run_group

        # The header a worker would have read.
        deadline_ns = 0 if deadline is None else int(deadline * 1e9)
        now = time.monotonic_ns()
        header = RequestHeader(0, 0, kind, json_length, deadline_ns, now, len(body))
        model = self.models[key]
        threads = self.threads
        if not model.batching.joins:  # a group of one, as a worker would run it
            if threads is None:
                return run_group(model, [Job(header, body)])[0]
            future = threads.submit(run_first, model, Job(header, body), key=key)
        else:
            future = asyncio.get_running_loop().create_future()
            queue = self._queued.get(key)
            if queue is None:
                queue = self._queued[key] = _Queue(model, self._run_queued, key)
            queue.add(Job(header, body), future)
            if queue.full():
                self._run_queued(key)
        if threads is None:
            return await future
        status = self.table.get(key)
        timeout = self.inference.chunk_timeout(status) if status is not None else None
        return await threads.wait(future, timeout, describe_key(key))

    async def _infer_stream(
        self,
        key: ModelKey,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None,
        more: AsyncIterator[bytes] | None = None,
    ) -> AsyncGenerator[Reply, None]:
        """A runtime's ``predict_stream`` on this loop (its consumer pulls each chunk: the
        back-pressure is the generator's own), fed ``more`` (``stream_feed``); any other
        runtime's one reply."""
        from inferpool.engine.stream_feed import local_replies
        from inferpool.engine.worker.path import Job
        from inferpool.engine.worker.streaming import stream_replies, streams

        model = self.models[key]
        if not streams(model.runtime):
            yield await self._infer(key, kind, body, json_length, deadline)
            return
        deadline_ns = 0 if deadline is None else int(deadline * 1e9)
        header = RequestHeader(0, 0, kind, json_length, deadline_ns, time.monotonic_ns(), len(body))
        job = Job(header, body)
        replies = local_replies(lambda bodies: stream_replies(model, job, bodies), more)
        try:
            async for reply in replies:
                yield reply
        finally:
            await replies.aclose()

    def _run_queued(self, key: ModelKey) -> None:
        """Run what is queued for a version, as a worker runs what it drained: joined up
        to the model's rows. A request whose caller went away meanwhile is left out."""
        from inferpool.engine.worker.path import run_executions

        queue = self._queued.get(key)
        if queue is None:
            return
        if key in self._predicting:  # run when that predict ends (_after_predict)
            queue.due = True
            return
        del self._queued[key]
        queue.timer.cancel()
        waiting = [(job, future) for job, future in queue.waiting if not future.done()]
        jobs = [job for job, _ in waiting]
        if self.threads is not None:
            done = self.threads.submit(run_all, queue.model, jobs, key=key, count=len(jobs))
            self._predicting.add(key)
            done.add_done_callback(lambda done: self._after_predict(key, waiting, done))
            return
        try:
            _answer_executions(waiting, run_executions(queue.model, jobs))
        except Exception as exc:  # a bug of the path: answer every caller, never hang one
            _fail(waiting, exc)

    def _after_predict(
        self, key: ModelKey, waiting: _Waiting, done: asyncio.Future[_Executions]
    ) -> None:
        """A joined predict came back: answer its requests, then run the queue that
        waited for it (if its own time has come)."""
        self._predicting.discard(key)
        _answer(waiting, done)
        queue = self._queued.get(key)
        if queue is not None and queue.due:
            self._run_queued(key)

    def running_requests(self) -> dict[ModelKey, int]:
        """In-flight requests that are running: those a predict thread runs now (the
        others wait for a thread or a batch); on the loop (``--stall-threshold 0``), those
        of a version without a queue right now (the loop runs a request from the moment
        it is accepted to its reply without yielding, unless it joins a batch)."""
        if self.threads is not None:
            return self.threads.running_by_key()
        running = super().running_requests()
        for key, queue in self._queued.items():
            left = running.get(key, 0) - len(queue.waiting)
            if left > 0:
                running[key] = left
            else:
                running.pop(key, None)
        return running

    async def infer_request(
        self, name: str, version: str | None, request: InferenceRequest
    ) -> InferenceResponse:
        """The typed path of the embedded API: no wire format at all.

        Errors raise what a worker's reply would rebuild (a fault of the server: a 500
        ``InferpoolError``); counted in the model's statistics as ``infer`` counts.
        """
        from inferpool.engine.worker.inference import infer

        key = self.table.ready_model(name, version).key
        started = time.perf_counter_ns()
        try:
            response = infer(self.models[key], request)
        except Exception as exc:
            self.accounting.record(key, False, started, None, error=exc)
            if isinstance(exc, InferpoolError):
                raise
            reply = Reply.from_error(exc, name)
            raise from_status(reply.status, reply.body.decode()) from exc
        # One execution of the request's rows: as many as each output has.
        outputs = response.outputs
        rows = outputs[0].shape[0] if outputs and outputs[0].shape else 1
        self.accounting.record(key, True, started, None, rows, rows)
        return response


class _Queue:
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


_Waiting = list[tuple["Job", asyncio.Future[Reply]]]
# Each execution of a joined predict: the positions of its requests, and their replies.
_Executions = list[tuple[list[int], list[Reply]]]


def _answer_executions(
    waiting: _Waiting, executions: Iterable[tuple[list[int], list[Reply]]]
) -> None:
    """Answer each waiting request from the executions that ran it."""
    for positions, replies in executions:
        for position, reply in zip(positions, replies, strict=True):
            future = waiting[position][1]
            if not future.done():
                future.set_result(reply)


def _answer(waiting: _Waiting, done: asyncio.Future[_Executions]) -> None:
    """The queued requests' executions came back from a predict thread."""
    if done.cancelled():
        return
    error = done.exception()
    if error is None:
        _answer_executions(waiting, done.result())
    else:  # a bug of the path: answer every caller, never hang one
        _fail(waiting, error)


def _fail(waiting: _Waiting, error: BaseException) -> None:
    for _, future in waiting:
        if not future.done():
            future.set_exception(error)


# Loads run in a thread (the loop keeps answering health checks), one at a time: a
# library's first import can happen inside any load (importing a runtime module,
# unpickling, a user's load()), and two threads importing one library at once see it
# half-initialised (sklearn: ImportError) or deadlock (LightGBM). Worker processes load
# one model at a time anyway.
_LOAD_LOCK = threading.Lock()


def _load_one_at_a_time(settings: ModelSettings) -> LoadedModel:
    from inferpool.engine.worker.model import load_model
    from inferpool.engine.worker.warmup import warm_up

    with _LOAD_LOCK:
        model = load_model(settings)
        warm_up(model, "in the server process")  # before it is stored and READY
        return model


def _import_runtime(settings: ModelSettings) -> None:
    """Import the model's runtime and the library modules its models use (the template's
    list, ``RuntimeEntry.preload``), one load or import at a time."""
    from inferpool.runtimes.registry import RUNTIMES, runtime_class, runtime_name_for

    entry = RUNTIMES.get(runtime_name_for(settings))
    with _LOAD_LOCK:
        for module in entry.preload if entry is not None else ():
            with contextlib.suppress(ImportError):
                importlib.import_module(module)
        runtime_class(settings)
