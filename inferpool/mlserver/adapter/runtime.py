"""Serves an MLServer custom runtime: a subclass of ``mlserver.MLModel`` (MLServer installed)
or of ``inferpool.mlserver.MLModel`` (the same API, without MLServer).

The model's coroutines (``load``, ``predict``, ``metadata``) run on one event loop per
process, in a thread of its own: a worker calls ``predict`` from plain code, and with
``--workers 0`` from the server's running loop, which cannot run another coroutine to the
end. One loop for every call also keeps what ``load`` creates (locks, sessions) usable in
``predict``; except for a class that says ``fork_safe = True`` (its objects are plain
data, so the template may load it before forking; ``runtimes/registry.py``): its ``load``
and ``metadata`` run on a loop of their own in the loading thread, since the template must
start no thread. Requests reach the model as its own ``InferenceRequest`` (MLServer's
pydantic type for an ``mlserver`` subclass, ours otherwise), flat data and parameters
kept; its ``InferenceResponse`` comes back as output tensors with their names, datatypes,
shapes and parameters. An ``MLServerError`` it raises is answered with its ``status_code``
and message.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Coroutine, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import numpy as np

from inferpool.errors import BadRequest, ModelError, ModelLoadError, from_status
from inferpool.mlserver.adapter.batch import merge_requests, split_answer
from inferpool.mlserver.metrics import current_model
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE
from inferpool.protocol.types import InferenceRequest, Tensor, TensorSpec
from inferpool.runtimes.base import Answer, Runtime
from inferpool.runtimes.metrics import ModelMetrics
from inferpool.settings import MODEL_SETTINGS_FILE, ModelSettings

T = TypeVar("T")

# Where a codec keeps its decoded payload in a tensor's parameters: never sent back.
_DECODED = "_decoded_payload"
# The content types whose BYTES reach a model as str (``_input_data``).
_TEXT_TYPES = frozenset({"str", "json"})
# The settings MLServer's ModelSettings takes from inferpool's (which may have resolved them
# from the folder layout or the environment); the rest comes from the file as written.
_SETTINGS_KEYS = {
    "name",
    "implementation",
    "parameters",
    "inputs",
    "outputs",
    "max_batch_size",
    "max_batch_time",
}


class _ProcessLoop:
    """The process's event loop for models' coroutines, running in a daemon thread.

    Made on first use and again after a fork (a thread does not survive one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (or its exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._current()).result()

    async def await_from(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop, awaited from another running loop. Cancelling
        the wait cancels it there and waits until it has ended: a generator it was
        stepping can be closed next (``aclose`` refuses a generator still running)."""
        loop = self._current()
        caller = asyncio.get_running_loop()
        ended: asyncio.Future[T] = caller.create_future()
        started: list[asyncio.Task[T]] = []

        def settle(task: asyncio.Task[T]) -> None:
            if ended.done():
                return
            if task.cancelled():
                ended.cancel()
            elif (error := task.exception()) is not None:
                ended.set_exception(error)
            else:
                ended.set_result(task.result())

        def start() -> None:
            task = loop.create_task(coroutine)
            started.append(task)
            task.add_done_callback(lambda task: caller.call_soon_threadsafe(settle, task))

        loop.call_soon_threadsafe(start)
        try:
            return await asyncio.shield(ended)
        except asyncio.CancelledError:
            loop.call_soon_threadsafe(lambda: started[0].cancel())  # (after ``start``)
            with contextlib.suppress(BaseException):
                await ended
            raise

    def _current(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="inferpool-mlmodel-loop", daemon=True
                )
                thread.start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


_LOOP = _ProcessLoop()


@dataclass(frozen=True, slots=True)
class Flavour:
    """The MLServer API a model class is written against: its types, settings and errors."""

    types: ModuleType
    settings_class: Any  # a pydantic model class: ModelSettings
    error_class: type[Exception]


def flavour_of(cls: type) -> Flavour | None:
    """The API ``cls`` subclasses, or None when it is no MLModel. MLServer's own is only
    looked for when ``mlserver`` is imported already (a subclass of it imported it)."""
    mlserver = sys.modules.get("mlserver")
    if mlserver is not None and issubclass(cls, mlserver.MLModel):
        return _flavour("mlserver")
    from inferpool.mlserver import MLModel

    return _flavour("inferpool.mlserver") if issubclass(cls, MLModel) else None


def _flavour(package: str) -> Flavour:
    types = importlib.import_module(f"{package}.types")
    settings = importlib.import_module(f"{package}.settings")
    errors = importlib.import_module(f"{package}.errors")
    return Flavour(types, settings.ModelSettings, errors.MLServerError)


def adapter_for(cls: type, flavour: Flavour) -> type[Runtime]:
    """The inferpool runtime class that serves models of the MLModel subclass ``cls``."""
    attributes = {
        "model_class": cls,
        "flavour": flavour,
        "fork_safe": getattr(cls, "fork_safe", False) is True,
        "__module__": __name__,
    }
    return type(f"{cls.__name__}Runtime", (MLModelRuntime,), attributes)


class MLModelRuntime(Runtime):
    """An MLModel, driven through inferpool's Runtime interface (see the module's text)."""

    platform: ClassVar[str] = "mlserver"
    accepts = "request"
    # MLServer hands the request's outputs to the model, whatever their names.
    open_outputs: ClassVar[bool] = True
    model_class: ClassVar[type]
    flavour: ClassVar[Flavour]

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.model: Any = None
        # MLServer's adaptive batching: on with both max_batch_size > 1 and
        # max_batch_time > 0 (MLServer ignores either alone).
        self.joins_requests = settings.max_batch_size > 1 and settings.max_batch_time > 0

    def load(self) -> None:
        self.model = self.model_class(self._model_settings())
        # One set of custom metrics for the model: ``self.metrics`` in its methods (an
        # inferpool MLModel made its own), ``mlserver.register``/``log`` in its coroutines.
        own = getattr(self.model, "metrics", None)
        if isinstance(own, ModelMetrics):
            self.metrics = own
        else:
            self.model.metrics = self.metrics
        ready = self._run_loading(self._in_context(self.model.load()))
        self.model.ready = ready
        if not ready:
            raise ModelLoadError(f"model '{self.name}': load() returned {ready!r}")

    def unload(self) -> None:
        """The model's ``unload()``, awaited when it is a coroutine (MLServer's is), called
        when it is a plain method; what it raises reaches the engine, which logs it."""
        if self.model is None:
            return
        result = self.model.unload()
        if inspect.isawaitable(result):
            self._run_loading(self._in_context(result))
        self.model.ready = False

    def _run_loading(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the model's loading (``load``, ``metadata``): on the
        process's loop, whose thread a fork-safe model must not start (the template may
        load it before forking), so that one's runs on an event loop of its own in this
        thread, closed afterwards."""
        if not self.fork_safe:
            return _LOOP.run(coroutine)
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(coroutine)
        finally:
            loop.close()

    async def _in_context(self, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` as this model's: ``mlserver.log`` records into its metrics."""
        current_model.set(self.metrics)  # in this task's own context only
        return await coroutine

    def _model_settings(self) -> Any:
        """The model's settings as its MLServer API has them: the file's fields, with
        what inferpool resolved (name, version, URI, ...) on top."""
        raw: dict[str, Any] = {}
        source = None
        if self.settings.folder is not None:
            path = self.settings.folder / MODEL_SETTINGS_FILE
            if path.is_file():
                raw = json.loads(path.read_text())
                source = str(path)
        raw.update(self.settings.model_dump(include=_SETTINGS_KEYS, exclude_defaults=True))
        model_settings = self.flavour.settings_class.model_validate(raw)
        # Relative URIs resolve against the settings file's folder (get_model_uri).
        model_settings._source = source or (
            str(self.settings.folder / MODEL_SETTINGS_FILE) if self.settings.folder else None
        )
        return model_settings

    def predict(self, payload: InferenceRequest, outputs: Sequence[str]) -> dict[str, Tensor]:
        request = self._model_request(payload)
        try:
            response = _LOOP.run(self._in_context(self.model.predict(request)))
        except self.flavour.error_class as exc:
            raise from_status(getattr(exc, "status_code", 400), str(exc)) from None
        return self._answer(response)

    def predict_requests(self, payloads: list[Any], outputs: Sequence[str]) -> list[dict[str, Any]]:
        """One ``predict`` for several requests, joined and split as MLServer's adaptive
        batching does (``batch``, beside it)."""
        merged, sizes = merge_requests(payloads)
        return split_answer(self.predict(merged, outputs), sizes)

    @property
    def streams(self) -> bool:
        """The model class implements ``predict_stream`` itself (MLServer's default only
        predicts the first request): its streamed requests run through it."""
        for cls in self.model_class.__mro__:
            if "predict_stream" in vars(cls):
                return not cls.__module__.startswith(("mlserver", "inferpool.mlserver"))
        return False

    @property
    def stream_input(self) -> bool:
        """Its ``predict_stream`` takes a gRPC call's whole stream, as MLServer's does."""
        return self.streams

    async def predict_stream(self, payloads: AsyncIterator[InferenceRequest]) -> AsyncIterator[Any]:
        """The model's ``predict_stream``, run on the process's loop for the model (as its
        other coroutines), its responses as outputs (``predict``'s answers). Its requests
        come from ``payloads`` one at a time, each when the model asks for it (awaited on
        the caller's loop, where ``payloads`` lives): it may answer one before the next
        is sent."""
        caller = asyncio.get_running_loop()

        async def source() -> AsyncIterator[Any]:
            while True:
                step = asyncio.run_coroutine_threadsafe(_next(payloads), caller)
                payload = await asyncio.wrap_future(step)
                if payload is _END:
                    return
                yield self._model_request(payload)

        generator = self.model.predict_stream(source())
        try:
            while True:
                try:
                    response = await _LOOP.await_from(self._in_context(generator.__anext__()))
                except StopAsyncIteration:
                    return
                except self.flavour.error_class as exc:
                    raise from_status(getattr(exc, "status_code", 400), str(exc)) from None
                yield self._answer(response)
        finally:
            await _LOOP.await_from(generator.aclose())

    def _answer(self, response: Any) -> dict[str, Tensor]:
        """The outputs of one of the model's responses (an ``Answer`` with its parameters)."""
        tensors = {output.name: self._tensor(output) for output in response.outputs}
        if response.parameters is None:
            return tensors
        return Answer(tensors, _dump(response.parameters))

    def _model_request(self, request: InferenceRequest) -> Any:
        types = self.flavour.types
        declared = self._declared_content_types()
        return types.InferenceRequest(
            id=request.id,
            parameters=self._parameters(request.parameters, "the request"),
            inputs=[
                types.RequestInput(
                    name=tensor.name,
                    shape=list(tensor.shape),
                    datatype=tensor.datatype,
                    data=_input_data(tensor, declared.get(tensor.name), request.json_strings),
                    parameters=self._parameters(tensor.parameters, f"input '{tensor.name}'"),
                )
                for tensor in request.inputs
            ],
            outputs=[
                types.RequestOutput(
                    name=output.name,
                    parameters=self._parameters(output.parameters, f"output '{output.name}'"),
                )
                for output in request.outputs
            ]
            or None,
        )

    def _declared_content_types(self) -> dict[str, str]:
        """The content types the model's metadata declares for its inputs, by name."""
        declared: dict[str, str] | None = getattr(self, "_declared", None)
        if declared is None:
            declared = {
                spec.name: spec.parameters["content_type"]
                for spec in self.inputs()
                if isinstance(spec.parameters.get("content_type"), str)
            }
            self._declared = declared
        return declared

    def _parameters(self, parameters: dict[str, Any], where: str) -> Any:
        """The model's ``Parameters``; a 400 for a value of the wrong type."""
        if not parameters:
            return None
        try:
            return self.flavour.types.Parameters(**parameters)
        except ValueError as exc:  # pydantic's ValidationError
            raise BadRequest(
                f"model '{self.name}': parameters of {where}: {_first_error(exc)}"
            ) from None

    def _tensor(self, output: Any) -> Tensor:
        """One output of the model's response as an inferpool tensor, as it was sent."""
        datatype = getattr(output.datatype, "value", output.datatype)
        shape = tuple(int(dim) for dim in output.shape)
        values = getattr(output.data, "root", output.data)
        where = f"model '{self.name}' output '{output.name}'"
        if datatype not in NUMPY_BY_DATATYPE:
            raise ModelError(f"{where}: unknown datatype {datatype!r}")
        try:
            if datatype == "BYTES":
                # An object array flattens nested lists and keeps each element as it is
                # (a bytes array would drop trailing NULs).
                flat = np.asarray(values, dtype=object).reshape(-1)
                elements = [_element_bytes(item) for item in flat]
                data = np.empty(len(elements), dtype=object)
                data[:] = elements
                if len(elements) != int(np.prod(shape)):
                    # MLServer sends such strings as they are (one with its length as
                    # shape): they keep their own, flat shape.
                    shape = (len(elements),)
            else:
                data = np.asarray(values, dtype=NUMPY_BY_DATATYPE[datatype]).reshape(-1)
            data = data.reshape(shape)
        except (TypeError, ValueError, OverflowError) as exc:
            detail = f"data does not fit {datatype} {list(shape)} ({exc})"
            raise ModelError(f"{where}: {detail}") from None
        parameters = _dump(output.parameters) if output.parameters is not None else {}
        return Tensor(output.name, datatype, shape, data, parameters)

    def inputs(self) -> list[TensorSpec]:
        return _specs(self.model.inputs) if self.model is not None else super().inputs()

    def outputs(self) -> list[TensorSpec]:
        declared = _specs(self.model.outputs) if self.model is not None else []
        return declared or super().outputs()

    def metadata(self) -> dict[str, Any]:
        """The model's own ``metadata()``, as MLServer answers it."""
        document: dict[str, Any] = self._run_loading(self.model.metadata()).model_dump()
        document.setdefault("inputs", [])
        document.setdefault("outputs", [])
        return document


_END = object()  # ``_next`` at the end of its iterator


async def _next(payloads: AsyncIterator[Any]) -> Any:
    """The next item of ``payloads``, ``_END`` after the last (a coroutine, for
    ``run_coroutine_threadsafe``)."""
    return await anext(payloads, _END)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if errors is None:
        return str(exc).splitlines()[0]
    first = errors()[0]
    return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"


def _dump(parameters: Any) -> dict[str, Any]:
    """Parameters as sent: without the payload a codec decoded into them."""
    dumped: dict[str, Any] = parameters.model_dump()
    dumped.pop(_DECODED, None)
    return dumped


def _input_data(tensor: Tensor, declared: str | None, json_strings: bool) -> list[Any]:
    """A tensor's flat data as the model gets it. Strings are ``str`` where MLServer
    hands a model ``str``: those of a JSON body (the examples ``json.dumps`` them), and
    those of a text content type (``str``, ``json``: the input's own, else the metadata's)
    over any protocol; bytes that are no UTF-8 stay bytes, as MLServer's gRPC gives them."""
    data: list[Any] = tensor.data.reshape(-1).tolist()
    if tensor.datatype != "BYTES":
        return data
    from_json = json_strings and "binary_data_size" not in tensor.parameters
    if not from_json and (tensor.content_type or declared) not in _TEXT_TYPES:
        return data
    try:
        return [item.decode() if isinstance(item, bytes) else item for item in data]
    except UnicodeDecodeError:
        return data


def _element_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    raise TypeError(f"a BYTES element is a {type(item).__name__}, not str or bytes")


def _specs(tensors: Any) -> list[TensorSpec]:
    """MetadataTensors (either API's) as inferpool's TensorSpecs."""
    specs = []
    for tensor in tensors or []:
        raw = tensor.model_dump()
        raw["datatype"] = getattr(tensor.datatype, "value", tensor.datatype)
        specs.append(TensorSpec.from_dict(raw))
    return specs
