"""Model lifecycle states and the table of models the frontend answers from.

The table lives in the frontend process; whoever loads models (in-process or a worker
pool) updates it. Health and metadata endpoints read it without touching a worker.

Readiness is strict (as Triton's) for the models that count: those the repository asked
for at start-up, and any model once it has served. A model that never served and failed
when the repository API asked for it is listed FAILED with its reason, but does not turn
the whole server not ready: the caller of the API got the error.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from inferpool.errors import ModelNotFound, NotReady


class ModelState(enum.StrEnum):
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


@dataclass(slots=True)
class ModelStatus:
    name: str
    version: str | None
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    # Counts for the server's readiness: asked for at start-up, or has served once.
    required: bool = False

    def describe(self) -> str:
        """One line saying why the model is not ready."""
        if self.state is ModelState.FAILED:
            return f"model '{self.name}' failed to load: {self.reason}"
        return f"model '{self.name}' is {self.state.value}" + (
            f": {self.reason}" if self.reason else ""
        )

    def index_entry(self) -> dict[str, Any]:
        entry = {"name": self.name, "state": self.state.value, "reason": self.reason}
        if self.version:
            entry["version"] = self.version
        return entry


class ModelTable:
    """Every model the repository or the API asked for, by name."""

    def __init__(self) -> None:
        self._models: dict[str, ModelStatus] = {}

    def set(self, status: ModelStatus) -> None:
        self._models[status.name] = status

    def remove(self, name: str) -> None:
        self._models.pop(name, None)

    def get(self, name: str) -> ModelStatus | None:
        return self._models.get(name)

    def all(self) -> list[ModelStatus]:
        return list(self._models.values())

    def find(self, name: str, version: str | None = None) -> ModelStatus:
        """The model's status; 404 for an unknown name or a version it does not have."""
        status = self._models.get(name)
        if status is None:
            raise ModelNotFound(f"model '{name}' not found")
        if version is not None and version != status.version:
            raise ModelNotFound(f"model '{name}' has no version '{version}'")
        return status

    def ready_model(self, name: str, version: str | None = None) -> ModelStatus:
        """The model if it is READY; 404 if unknown, 503 with the reason otherwise."""
        status = self.find(name, version)
        if status.state is not ModelState.READY:
            raise NotReady(status.describe())
        return status

    def not_ready_reason(self, allow_empty: bool) -> str | None:
        """Why the server is not ready (strict, like Triton), or None when it is."""
        counted = [status for status in self._models.values() if status.required]
        if not counted and not allow_empty:
            return "no model is loaded (pass --allow-empty to serve an empty repository)"
        for status in counted:
            if status.state is not ModelState.READY:
                return status.describe()
        return None
