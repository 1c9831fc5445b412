"""The ONNX Runtime runtime: a ``model.onnx`` graph (or any ``.onnx`` file that
``parameters.uri`` names), predicted by one ONNX Runtime session per process.

Inputs, outputs, datatypes and shapes come from the graph (``onnx_types.py``); inputs
declared in model-settings.json win, as for every runtime. A request's tensors are matched
to the graph's inputs by name (a graph of one input takes one tensor of any name) and
cast to the element type the graph wants (FP64 to a float graph: rounded to float32). A
request that names no output gets every graph output; ZipMap's per-row dicts of a
converted classifier's probabilities are answered as a [rows, classes] FP32 tensor.

Sessions start thread pools, and importing onnxruntime starts a thread already (measured
with 1.32), so the template that forks the workers neither loads ONNX models (the
registry's entry is not ``fork_safe``) nor imports this module (no ``preload``): each
worker creates its own session after the fork, sized to its share of the cores, and with
no inter-op pool.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from inferpool.errors import BadRequest, ModelLoadError
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import find_artefact
from inferpool.runtimes.base import Runtime, threads_from_environment
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.onnx_types import (
    GraphTensor,
    as_graph_input,
    as_tensor,
    check_array,
    graph_tensor,
)
from inferpool.runtimes.tabular import is_dataframe

LIBRARY = "ONNX Runtime"  # as load errors name it
ARTEFACT_NAMES = ("model.onnx",)
# Converters whose graphs of classical models predict each row on its own (a graph from
# anywhere else may mix rows: it batches only when its settings ask, max_batch_size > 1).
ROW_WISE_PRODUCERS = frozenset({"skl2onnx", "OnnxMLTools", "onnxmltools"})
# What ONNX Runtime's load errors carry besides the reason: its status code, the file's
# path (the sentence names the file), the C++ source location and function signature.
_ORT_NOISE = re.compile(
    r"\[ONNXRuntimeError\] : \d+ : \w+ : |Load model from \S+ failed:\s*"
    r"|\S+\.(?:h|cc|cpp):\d+ .*?\) "
)
# A graph that parsed but that this ONNX Runtime will not run (an opset newer than it
# knows, an operator it lacks): its reason is the sentence (a file that does not parse is
# reading()'s "truncated or corrupt").
REFUSED_GRAPH = (ort_errors.Fail, ort_errors.InvalidGraph, ort_errors.NotImplemented)
MAX_REASON = 300  # characters of ONNX Runtime's reason kept in the sentence


class ONNXRuntime(Runtime):
    platform = "onnx"
    # ONNX Runtime refusing a feed the checks here let through (a dimension the graph
    # constrains inside): the client's input, answered 400.
    input_errors = (ort_errors.InvalidArgument,)

    def load(self) -> None:
        self.path = find_artefact(self, ARTEFACT_NAMES)
        # A worker has set OMP_NUM_THREADS to its share of the cores before loading, so the
        # session starts with its final pool (``limit_threads`` then has nothing to do).
        self.threads = threads_from_environment()
        with reading(self.path, LIBRARY):
            try:
                self.session = self._session(self.threads)
            except REFUSED_GRAPH as exc:
                raise ModelLoadError(
                    f"ONNX Runtime {ort.__version__} cannot load {self.path.name}: {_reason(exc)}"
                ) from None
        session = self.session
        self.graph_inputs = [graph_tensor(a.name, a.type, a.shape) for a in session.get_inputs()]
        self.graph_outputs = [graph_tensor(a.name, a.type, a.shape) for a in session.get_outputs()]
        self.by_name = {tensor.name: tensor for tensor in self.graph_inputs}
        # One input: the payload is one array, which adaptive batching can join.
        self.accepts = "array" if len(self.graph_inputs) == 1 else "dict"
        producer = session.get_modelmeta().producer_name
        self.rows_independent = producer in ROW_WISE_PRODUCERS and _one_input_of_rows(
            self.graph_inputs
        )
        if self.rows_independent:
            # Every output has a row per input row, whatever the graph declares: onnxmltools
            # declares a LightGBM classifier's labels as [1].
            self.graph_outputs = [tensor.per_row() for tensor in self.graph_outputs]
        self.artefact_bytes = self.path.stat().st_size

    def _session(self, threads: int) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: ONNX Runtime's own choice (all cores)
        # Operators run one after the other: a worker's share of the cores is spent inside
        # each operator, not on a second pool running independent branches.
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Idle pool threads sleep instead of spinning: workers share the machine's cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Errors only: onnxmltools' graphs declare output shapes that ONNX Runtime then
        # warns about on stderr at every predict (a LightGBM classifier's labels as [1]).
        options.log_severity_level = 3
        return ort.InferenceSession(
            str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def limit_threads(self, threads: int) -> None:
        threads = max(1, int(threads))
        if threads != self.threads:
            self.threads = threads
            self.session = self._session(threads)

    def predictor(self) -> str:
        unit = "thread" if self.threads == 1 else "threads"
        pool = f"{self.threads} intra-op {unit}" if self.threads else "its default threads"
        return f"ONNX Runtime {ort.__version__} ({pool})"

    def native_bytes(self) -> int:
        # The session holds the graph's weights in native memory: about the file's size.
        return self.artefact_bytes

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() or [tensor.spec() for tensor in self.graph_inputs]

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or [tensor.spec() for tensor in self.graph_outputs]

    def default_outputs(self) -> list[str]:
        return [tensor.name for tensor in self.graph_outputs]

    def validate(self, payload: Any) -> None:
        self._feeds(payload)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        # ``validate`` checked each request's payload (the engine calls it before joining
        # requests): here only the names are matched. What ONNX Runtime still refuses is
        # an ``input_errors`` 400.
        feeds = {
            name: as_graph_input(self.by_name[name], np.asarray(value))
            for name, value in self._feeds(payload, check=False).items()
        }
        values = self.session.run(list(outputs), feeds)
        return {name: as_tensor(value) for name, value in zip(outputs, values, strict=True)}

    def _feeds(self, payload: Any, check: bool = True) -> dict[str, Any]:
        """The graph's inputs by name from a payload, each checked against the graph
        (unless not ``check``)."""
        named = _by_name(payload)
        if len(self.graph_inputs) == 1:
            (tensor,) = self.graph_inputs
            value = _single(payload, named)
            if value is not None:
                return {tensor.name: check_array(self.name, tensor, value) if check else value}
        expected = ", ".join(repr(tensor.name) for tensor in self.graph_inputs)
        if named is None:
            raise BadRequest(f"model '{self.name}' takes its inputs by name: {expected}")
        unknown = [repr(name) for name in named if name not in self.by_name]
        if unknown:
            raise BadRequest(
                f"model '{self.name}' has no input {', '.join(unknown)}; expected: {expected}"
            )
        missing = [repr(t.name) for t in self.graph_inputs if t.name not in named]
        if missing:
            raise BadRequest(
                f"model '{self.name}' is missing input {', '.join(missing)}; expected: {expected}"
            )
        if not check:
            return named
        return {
            name: check_array(self.name, self.by_name[name], value) for name, value in named.items()
        }


def _by_name(payload: Any) -> dict[str, Any] | None:
    """A dict or DataFrame payload as its values by name; None for a plain array."""
    if isinstance(payload, dict):
        return payload
    if is_dataframe(payload):
        return {str(column): payload[column].to_numpy() for column in payload.columns}
    return None


def _single(payload: Any, named: dict[str, Any] | None) -> Any:
    """The one tensor of a payload for a graph of one input, whatever its name: an array,
    a table (its columns side by side) or a dict of one entry; None for several tensors."""
    if named is None:
        return payload
    if is_dataframe(payload):
        return payload.to_numpy()
    return next(iter(named.values())) if len(named) == 1 else None


def _one_input_of_rows(inputs: list[GraphTensor]) -> bool:
    """One input, whose first dimension (the rows) is free."""
    return len(inputs) == 1 and inputs[0].shape[:1] == [-1]


def _reason(exc: Exception) -> str:
    """ONNX Runtime's reason for refusing a graph, on one line, without its noise."""
    text = " ".join(_ORT_NOISE.sub("", str(exc)).split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."
