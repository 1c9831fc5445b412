"""Per-model inference statistics in the shape of Triton's statistics extension."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inferpool.engine.ipc.messages import StageTimes

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(slots=True)
class ModelStats:
    success: int = 0
    fail: int = 0
    success_ns: int = 0
    fail_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    stage_count: int = 0
    stage_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))

    def record(self, ok: bool, total_ns: int, times: StageTimes | None, batch: int = 1) -> None:
        self.last_inference_ms = time.time_ns() // 1_000_000
        if not ok:
            self.fail += 1
            self.fail_ns += total_ns
            return
        self.success += 1
        self.success_ns += total_ns
        self.inference_count += batch
        self.execution_count += 1
        if times is not None:
            self.stage_count += 1
            for stage in STAGES:
                self.stage_ns[stage] += getattr(times, stage)

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
        }
