"""``workers=0``: models load and predict in the frontend process (embedding, debugging).

A model naming an environment of its own needs that environment's interpreter: it goes
to environment workers beside this process (``environment_workers.py``).

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
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from inferpool import calls
from inferpool.engine.call_server import InProcessCalls
from inferpool.engine.client import EngineClient
from inferpool.engine.daemon_thread import in_daemon_thread
from inferpool.engine.environment_workers import EnvironmentWorkers
from inferpool.engine.environments.capabilities import here, importable_here
from inferpool.engine.environments.unpack import named_environment
from inferpool.engine.inprocess_queue import (
    Executions,
    Queue,
    Waiting,
    answer,
    answer_executions,
    fail,
    run_all,
    run_first,
)
from inferpool.engine.ipc.messages import Reply, RequestHeader
from inferpool.engine.load_probe import LoadProbe, probed
from inferpool.engine.pool.groups import lacking, runtime_library
from inferpool.engine.pool.placement_choice import PlacementError, place
from inferpool.engine.predict_threads import PredictThreads
from inferpool.engine.states import ModelKey, describe_key, model_key
from inferpool.errors import InferpoolError, ModelLoadError, ModelNotFound, from_status
from inferpool.protocol.types import InferenceRequest, InferenceResponse
from inferpool.settings import ModelSettings, ServerSettings

if TYPE_CHECKING:
    from inferpool.engine.pool.pool import PoolClient
    from inferpool.engine.worker.model import LoadedModel

logger = logging.getLogger(__name__)


class InProcessClient(EngineClient):
    """``workers=0``: models load and predict in the frontend process (embedding, debug)."""

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings)
        self.models: dict[ModelKey, LoadedModel] = {}  # per version
        # Requests of a batching version waiting for the loop's next turn (or for the
        # model's max_batch_time), per version.
        self._queued: dict[ModelKey, Queue] = {}
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
        self.environments = EnvironmentWorkers(self)

    def live_reason(self) -> str | None:
        return self.environments.live_reason()

    def worker_pool(self) -> PoolClient | None:
        return self.environments.pool

    def drop_shared_memory(self, serials: list[int]) -> None:
        super().drop_shared_memory(serials)
        self.environments.drop_shared_memory(serials)

    def set_log_levels(self, levels: dict[str, int]) -> None:
        super().set_log_levels(levels)
        self.environments.set_log_levels(levels)

    def overload_refusal(self, key: ModelKey) -> InferpoolError | None:
        return self.environments.overload_refusal(key)

    def runs_here(self, name: str, version: str | None) -> bool:
        """Whether the model (not a pipeline) runs in this process, for the embedded API's
        typed path; False for a version in an environment's workers. An unknown name is
        left to the typed path, which says so."""
        if self.pipelines.serves(name, version):
            return False
        try:
            key = self.table.find(name, version).key
        except ModelNotFound:
            return True
        return key not in self.environments.keys

    async def _start_workers(self) -> None:
        # A runtime's calls to other models, from its predict thread (call_server.py).
        self.calls = InProcessCalls(self.call_server, asyncio.get_running_loop(), self.threads)
        calls.install(self.calls)

    def _on_shutdown(self) -> None:
        self.environments.on_shutdown()

    async def close(self) -> None:
        await super().close()
        await self.environments.close()
        await self.probe.close()
        calls.uninstall(getattr(self, "calls", None))

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        from inferpool.engine.worker.model import failure_reason, unload_model

        key = model_key(settings.name, settings.version)
        if named_environment(settings) is not None:
            metadata = await self.environments.load(settings)
            replaced = self.models.pop(key, None)  # it ran here before its reload
            if replaced is not None:
                await asyncio.to_thread(unload_model, replaced)
            return metadata
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
        await self.environments.unload(key)  # it ran in an environment before its reload
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
        ModelLoadError if the model needs what is not here."""
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

        await self.environments.unload(key)
        model = self.models.pop(key, None)
        if model is not None:  # off the loop: an MLServer model's unload() may take a while
            await asyncio.to_thread(unload_model, model)

    async def _infer(
        self, key: ModelKey, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        from inferpool.engine.worker.path import Job, run_group

        model = self.models.get(key)
        if model is None:  # in an environment's workers
            pool = self.environments.pool_of(key)
            return await pool._infer(key, kind, body, json_length, deadline)
        # The header a worker would have read.
        deadline_ns = 0 if deadline is None else int(deadline * 1e9)
        now = time.monotonic_ns()
        header = RequestHeader(0, 0, kind, json_length, deadline_ns, now, len(body))
        threads = self.threads
        if not model.batching.joins:  # a group of one, as a worker would run it
            if threads is None:
                return run_group(model, [Job(header, body)])[0]
            future = threads.submit(run_first, model, Job(header, body), key=key)
        else:
            future = asyncio.get_running_loop().create_future()
            queue = self._queued.get(key)
            if queue is None:
                queue = self._queued[key] = Queue(model, self._run_queued, key)
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

        model = self.models.get(key)
        if model is None:  # in an environment's workers
            pool = self.environments.pool_of(key)
            replies = pool._infer_stream(key, kind, body, json_length, deadline, more)
        elif not streams(model.runtime):
            yield await self._infer(key, kind, body, json_length, deadline)
            return
        else:
            deadline_ns = 0 if deadline is None else int(deadline * 1e9)
            now = time.monotonic_ns()
            job = Job(RequestHeader(0, 0, kind, json_length, deadline_ns, now, len(body)), body)
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
            answer_executions(waiting, run_executions(queue.model, jobs))
        except Exception as exc:  # a bug of the path: answer every caller, never hang one
            fail(waiting, exc)

    def _after_predict(
        self, key: ModelKey, waiting: Waiting, done: asyncio.Future[Executions]
    ) -> None:
        """A joined predict came back: answer its requests, then run the queue that
        waited for it (if its own time has come)."""
        self._predicting.discard(key)
        answer(waiting, done)
        queue = self._queued.get(key)
        if queue is not None and queue.due:
            self._run_queued(key)

    def running_requests(self) -> dict[ModelKey, int]:
        """In-flight requests that are running: those a predict thread runs now (the
        others wait for a thread or a batch); on the loop (``--stall-threshold 0``), those
        of a version without a queue right now (the loop runs a request from the moment
        it is accepted to its reply without yielding, unless it joins a batch)."""
        elsewhere = self.environments.running_requests()
        if self.threads is not None:
            return {**self.threads.running_by_key(), **elsewhere}
        running = {**super().running_requests(), **elsewhere}
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
