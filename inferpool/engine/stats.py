"""Per-model inference statistics in the shape of Triton's statistics extension.

Triton's definitions: ``inference_count`` counts inferences (rows: a request of 3 rows is
3), ``execution_count`` counts model executions (requests predicted together are one),
``inference_stats.success.count`` counts requests, and ``batch_stats`` lists, per executed
batch size (rows), how many executions had that size and the time their stages took.
Beside them, ``in_flight``: the requests of the version in the engine right now.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inferpool.engine.ipc.messages import StageTimes

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(slots=True)
class BatchStats:
    """The executions of one batch size: how many, and their stages' nanoseconds."""

    count: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def to_triton(self, size: int) -> dict[str, Any]:
        return {
            "batch_size": size,
            "compute_input": {"count": self.count, "ns": self.input_ns},
            "compute_infer": {"count": self.count, "ns": self.infer_ns},
            "compute_output": {"count": self.count, "ns": self.output_ns},
        }


@dataclass(slots=True)
class ModelStats:
    # A gauge, not a statistic: requests the engine has accepted for this version and not
    # answered yet (``EngineClient.infer`` counts them in and out; /metrics reads it).
    in_flight: int = 0
    success: int = 0
    fail: int = 0
    success_ns: int = 0
    fail_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    stage_count: int = 0
    stage_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    batches: dict[int, BatchStats] = field(default_factory=dict)

    def record(
        self,
        ok: bool,
        total_ns: int,
        times: StageTimes | None,
        rows: int = 1,
        execution: int = 1,
    ) -> None:
        """Count one request of ``rows`` inferences that took ``total_ns``.

        ``execution`` is the rows of the model execution it ran in: positive when this
        request counts that execution, negative when another request of the same execution
        counts it (this one's decoding and encoding still add to the execution's times),
        0 when it did not run (``Reply.execution``).
        """
        self.last_inference_ms = time.time_ns() // 1_000_000
        if not ok:
            self.fail += 1
            self.fail_ns += total_ns
            return
        self.success += 1
        self.success_ns += total_ns
        self.inference_count += rows
        if execution > 0:
            self.execution_count += 1
        if times is None:
            return
        self.stage_count += 1
        stage_ns = self.stage_ns
        stage_ns["queue"] += times.queue
        stage_ns["compute_input"] += times.compute_input
        stage_ns["compute_infer"] += times.compute_infer
        stage_ns["compute_output"] += times.compute_output
        if execution:
            size = abs(execution)
            batch = self.batches.get(size)
            if batch is None:
                batch = self.batches[size] = BatchStats()
            batch.input_ns += times.compute_input
            batch.output_ns += times.compute_output
            if execution > 0:  # the execution's predict is counted once
                batch.count += 1
                batch.infer_ns += times.compute_infer

    def to_triton(self, name: str, version: str | None) -> dict[str, Any]:
        stages = {
            stage: {"count": self.stage_count, "ns": self.stage_ns[stage]} for stage in STAGES
        }
        return {
            "name": name,
            "version": version or "",
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": {"count": self.success, "ns": self.success_ns},
                "fail": {"count": self.fail, "ns": self.fail_ns},
                **stages,
            },
            # A size whose counting reply has not come back yet waits for it.
            "batch_stats": [
                batch.to_triton(size) for size, batch in sorted(self.batches.items()) if batch.count
            ],
        }
