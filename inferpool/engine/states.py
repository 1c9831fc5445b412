"""Model lifecycle states and the table of models the frontend answers from.

The table lives in the frontend process; whoever loads models (in-process or a worker
pool) updates it. Health and metadata endpoints read it without touching a worker.

A model may be served in several versions side by side; each (name, version) is one
entry, under its ``ModelKey``. A request naming no version goes to the model's default:
its latest READY version (``latest``: MLServer's and Triton's rule).

Readiness is strict (as Triton's) for the models that count: those the repository asked
for at start-up, and any model once it has served. A model that never served and failed
when the repository API asked for it is listed FAILED with its reason, but does not turn
the whole server not ready: the caller of the API got the error.

As in Triton's index, a version unloaded while the repository still holds it stays
listed: UNAVAILABLE with the reason ``"unloaded"`` (the index shows MLServer's empty one),
not counted for readiness, answering
model-ready false (never "not found") until it is loaded again. A version the repository
no longer holds is dropped from the table.

What an inference on a version that is not READY answers (``ModelStatus.refusal``) tells
the client whether to retry: unloaded (or unloading) on purpose is 404 / NOT_FOUND saying
so, as MLServer and KServe answer for a model they no longer serve (a 503 would be retried
for ever); LOADING is 503 / UNAVAILABLE with ``Retry-After`` (it will serve soon); FAILED,
or UNAVAILABLE for another reason (a pipeline whose member is not READY answers as that
member does, see ``pipelines/manager.py``), is 503 without it.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferpool.errors import InferpoolError, ModelLoading, ModelNotFound, NotReady
from inferpool.protocol.endpoints import Announced

if TYPE_CHECKING:
    from inferpool.engine.rate_limits import TokenBucket
    from inferpool.settings import ModelSettings

# The engine's key of one version of a model: the bare name when it has no version (the
# common case reads naturally in routes and logs), else name, NUL, version. No model name
# holds a NUL (``repository.name_problem`` refuses control characters), so a key names
# exactly one (name, version) pair; a string keeps the hot path's lookups cheap.
ModelKey = str


def model_key(name: str, version: str | None) -> ModelKey:
    return name if version is None else f"{name}\x00{version}"


def model_label(key: ModelKey) -> str:
    """The model's name, with its version if it has one: what logs and crash records say."""
    name, versioned, version = key.partition("\x00")
    return f"{name} (version {version})" if versioned else name


def describe_key(key: ModelKey) -> str:
    """``model 'name'`` or ``model 'name' version 'v'``, for messages."""
    name, versioned, version = key.partition("\x00")
    return f"model '{name}'" + (f" version '{version}'" if versioned else "")


# The reason of a version unloaded (by the repository API) that the repository still holds.
UNLOADED = "unloaded"


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
    # Its runtime takes the call's headers and may answer some (parameters.headers): a
    # user's class, or a built-in runtime whose registry entry says so; computed at load.
    exchanges_headers: bool = False
    # Its runtime's custom endpoints (methods by path), as its load announced them.
    endpoints: Announced = field(default_factory=Announced)
    # What it was loaded with (None: its settings could not be read); the model
    # configuration extension reads its batching here.
    settings: ModelSettings | None = None
    # Its rate limit's token bucket (engine/rate_limits.py), made when it loads; None: none.
    limiter: TokenBucket | None = None
    key: ModelKey = field(init=False)

    def __post_init__(self) -> None:
        self.key = model_key(self.name, self.version)

    def describe(self) -> str:
        """One line saying why the model is not ready."""
        model = describe_key(self.key)
        if self.state is ModelState.FAILED:
            return f"{model} failed to load: {self.reason}"
        return f"{model} is {self.state.value}" + (f": {self.reason}" if self.reason else "")

    @property
    def unloaded(self) -> bool:
        """Unloaded and still listed: the repository holds it, nothing serves it."""
        return self.state is ModelState.UNAVAILABLE and self.reason == UNLOADED

    def refusal(self) -> InferpoolError:
        """The error an inference on this version answers while it is not READY."""
        if self.unloaded or self.state is ModelState.UNLOADING:
            model = describe_key(self.key)
            if self.state is ModelState.UNLOADING:
                return ModelNotFound(f"{model} is being unloaded")
            return ModelNotFound(f"{model} was unloaded (load it again to serve it)")
        if self.state is ModelState.LOADING:
            return ModelLoading(self.describe())
        return NotReady(self.describe())

    def index_entry(self) -> dict[str, Any]:
        # An unloaded model's reason is MLServer's empty one: UNAVAILABLE says it all in
        # the index (metadata and the 404 of an inference say "unloaded").
        reason = "" if self.unloaded else self.reason
        entry = {"name": self.name, "state": self.state.value, "reason": reason}
        if self.version:
            entry["version"] = self.version
        return entry


def newer_version(a: str | None, b: str | None) -> int:
    """MLServer's order of versions (``mlserver/registry.py``): a model without a version
    comes first, two numbers compare as numbers (Triton's rule), other versions as
    strings. Positive when ``a`` is the one to serve (the version policy's order too)."""
    if a is None or b is None:
        return (a is None) - (b is None)
    try:
        return int(a) - int(b)
    except ValueError:
        return (a > b) - (a < b)


def _newer(a: ModelStatus, b: ModelStatus) -> int:
    return newer_version(a.version, b.version)


def latest(statuses: Iterable[ModelStatus]) -> ModelStatus:
    """The version that answers requests naming none (``statuses`` is not empty)."""
    return max(statuses, key=functools.cmp_to_key(_newer))


class ModelTable:
    """Every model the repository or the API asked for, one entry per version."""

    def __init__(self) -> None:
        self._models: dict[ModelKey, ModelStatus] = {}
        self._versions: dict[str, dict[str | None, ModelStatus]] = {}
        # Models with one version (the common case): a request naming none finds it in
        # one lookup.
        self._only: dict[str, ModelStatus] = {}

    def set(self, status: ModelStatus) -> None:
        self._models[status.key] = status
        versions = self._versions.setdefault(status.name, {})
        versions[status.version] = status
        self._index(status.name, versions)

    def remove(self, key: ModelKey) -> None:
        status = self._models.pop(key, None)
        if status is None:
            return
        versions = self._versions[status.name]
        del versions[status.version]
        if not versions:
            del self._versions[status.name]
        self._index(status.name, versions)

    def _index(self, name: str, versions: dict[str | None, ModelStatus]) -> None:
        if len(versions) == 1:
            self._only[name] = next(iter(versions.values()))
        else:
            self._only.pop(name, None)

    def get(self, key: ModelKey) -> ModelStatus | None:
        return self._models.get(key)

    def all(self) -> list[ModelStatus]:
        return list(self._models.values())

    def versions(self, name: str) -> list[ModelStatus]:
        """Every listed version of the model ``name`` (none: not listed)."""
        return list(self._versions.get(name, {}).values())

    def find(self, name: str, version: str | None = None) -> ModelStatus:
        """The version's status (the latest READY one, else the latest, when ``version``
        is None); 404 for an unknown name or a version it does not have."""
        if version is None:
            status = self._only.get(name)
            if status is not None:
                return status
        versions = self._versions.get(name)
        if versions is None:
            raise ModelNotFound(f"model '{name}' not found")
        if version is None:
            ready = [s for s in versions.values() if s.state is ModelState.READY]
            return latest(ready or versions.values())
        found = versions.get(version)
        if found is None:
            raise ModelNotFound(f"model '{name}' has no version '{version}'")
        return found

    def ready_model(self, name: str, version: str | None = None) -> ModelStatus:
        """The model if it is READY; 404 if unknown or unloaded, else ``refusal``'s 503."""
        status = self.find(name, version)
        if status.state is not ModelState.READY:
            raise status.refusal()
        return status

    def not_ready_reason(self, allow_empty: bool) -> str | None:
        """Why the server is not ready (strict, like Triton), or None when it is."""
        counted = [status for status in self._models.values() if status.required]
        if not counted and not allow_empty:
            return "no model is loaded (pass --allow-empty to serve an empty repository)"
        for status in counted:
            # UNAVAILABLE is never a fault of its own: unloaded on purpose (no longer
            # required), or a pipeline waiting for a member, which counts for itself (an
            # unloaded member keeps the server ready, as any unloaded model does).
            if status.state not in _COUNTED_AS_SERVING:
                return status.describe()
        return None


# States that do not make the server not ready (see ``not_ready_reason``).
_COUNTED_AS_SERVING = (ModelState.READY, ModelState.UNAVAILABLE)
