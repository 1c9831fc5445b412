"""Triton's trace settings (the ``trace`` extension) over inferpool's spans, changeable at
run time: which requests ``tracing.RequestTracer.finish`` makes spans for.

The settings, server-wide and per model (a model's override only what it sets):

- ``trace_level``: ``["OFF"]`` (no spans) or ``["TIMESTAMPS"]`` (a request's span and its
  queue/decode/predict/encode stage timings: what inferpool's spans hold). ``TENSORS`` is
  refused: spans never carry tensors. Tracing can be switched on here only when the server
  was started with ``--tracing`` (an exporter exists); it starts at ``TIMESTAMPS`` then.
- ``trace_rate``: one request of every N is handed to OpenTelemetry's sampler (which
  still applies: ``OTEL_TRACES_SAMPLER``); 0 traces none. Default 1: every request.
- ``trace_count``: how many more requests to trace, counting down; -1 (default): no limit.
- ``log_frequency``: accepted and echoed (Triton's trace file is flushed every N traces;
  spans here leave through OpenTelemetry's batch processor, ``OTEL_BSP_*``).
- ``trace_file``: read-only, ``""``; ``trace_mode``: read-only, ``opentelemetry``
  (spans go to the ``OTEL_TRACES_EXPORTER`` exporters, never to a file).

Values travel as REST's strings (``trace_rate: "1000"``) or lists of strings (gRPC's
``SettingValue``); numbers are taken as numbers too. A setting given as null (REST) or with
no value (gRPC) goes back to the server-wide value (a model's) or to the default.
"""

from __future__ import annotations

from typing import Any

from inferpool.errors import BadRequest

OFF, TIMESTAMPS = "OFF", "TIMESTAMPS"
DEFAULTS: dict[str, Any] = {
    "trace_level": [OFF],
    "trace_rate": 1,
    "trace_count": -1,
    "log_frequency": 0,
}
READ_ONLY = {"trace_file": "", "trace_mode": "opentelemetry"}


class _Scope:
    """The settings of the server or of one model, and its rate and count counters."""

    __slots__ = ("seen", "values")

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.seen = 0  # requests that reached this scope since its rate was set


class TraceControl:
    """The server's trace settings; ``admit`` is asked once per request that would be
    traced (only when a tracer exists)."""

    def __init__(self) -> None:
        self.available = False  # a tracer exists (--tracing): spans can be made
        self.server = _Scope(dict(DEFAULTS))
        self.models: dict[str, _Scope] = {}

    def start(self) -> None:
        """The tracer exists: every request traced, as before any setting is changed."""
        self.available = True
        self.server = _Scope({**DEFAULTS, "trace_level": [TIMESTAMPS]})
        self.models.clear()

    # -- the request path --------------------------------------------------------------
    def admit(self, model: str) -> bool:
        """Trace this request of ``model``? Counts it towards the rate and the count of the
        scope that decides (the model's when it sets any, else the server's)."""
        scope = self.models.get(model) or self.server
        level = self._value(scope, "trace_level")
        if level[0] == OFF:
            return False
        rate = self._value(scope, "trace_rate")
        count = self._value(scope, "trace_count")
        if rate == 0 or count == 0:
            return False
        scope.seen += 1
        if scope.seen % rate:
            return False
        if count > 0:
            self._owner(scope, "trace_count").values["trace_count"] = count - 1
        return True

    def _owner(self, scope: _Scope, key: str) -> _Scope:
        return scope if key in scope.values else self.server

    def _value(self, scope: _Scope, key: str) -> Any:
        return self._owner(scope, key).values[key]

    # -- the settings documents ---------------------------------------------------------
    def document(self, model: str | None = None) -> dict[str, Any]:
        """The settings as REST answers them (numbers as strings, as Triton's)."""
        scope = self.server if model is None else self.models.get(model, self.server)
        settings = {key: self._value(scope, key) for key in DEFAULTS}
        document: dict[str, Any] = {
            key: value if key == "trace_level" else str(value) for key, value in settings.items()
        }
        return {**document, **READ_ONLY}

    def update(self, changes: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """Apply ``changes`` (all checked first: one bad value changes nothing); the
        settings after."""
        parsed = {key: _parse(key, value) for key, value in changes.items()}
        if not self.available and any(v is not None and v != [OFF] for v in _levels(parsed)):
            raise BadRequest(
                "trace_level: tracing is off; start the server with --tracing (and an "
                "OpenTelemetry exporter, OTEL_TRACES_EXPORTER) to trace requests"
            )
        scope = self.server if model is None else self.models.setdefault(model, _Scope({}))
        for key, value in parsed.items():
            if key in READ_ONLY:
                continue
            if value is None:
                scope.values.pop(key, None)
                if model is None:
                    scope.values[key] = self._default(key)
            else:
                scope.values[key] = value
            if key == "trace_rate":
                scope.seen = 0
        if model is not None and not scope.values:
            self.models.pop(model, None)
        return self.document(model)

    def _default(self, key: str) -> Any:
        if key == "trace_level" and self.available:
            return [TIMESTAMPS]
        return DEFAULTS[key]


def _levels(parsed: dict[str, Any]) -> list[Any]:
    return [parsed["trace_level"]] if "trace_level" in parsed else []


def _parse(key: str, value: Any) -> Any:
    """One setting's value, checked; None: back to the default."""
    if value is None or value == []:
        return None
    if key == "trace_level":
        return _level(value)
    if key in ("trace_rate", "log_frequency"):
        return _integer(key, value, 0)
    if key == "trace_count":
        return _integer(key, value, -1)
    if key in READ_ONLY:
        if _single(key, value) != READ_ONLY[key]:
            raise BadRequest(_read_only(key))
        return None
    known = ", ".join([*DEFAULTS, *READ_ONLY])
    raise BadRequest(f"unknown trace setting '{key}' (the settings are {known})")


def _read_only(key: str) -> str:
    if key == "trace_file":
        return (
            "trace_file cannot be set: spans go to the OpenTelemetry exporters "
            "(OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*), not to a file"
        )
    return "trace_mode cannot be changed: inferpool traces with OpenTelemetry only"


def _level(value: Any) -> list[str]:
    levels = value if isinstance(value, list) else [value]
    if not all(isinstance(level, str) for level in levels):
        raise BadRequest('trace_level must be a list of strings, e.g. ["TIMESTAMPS"]')
    names = {level.upper() for level in levels}
    if "TENSORS" in names:
        raise BadRequest(
            "trace_level TENSORS is not supported: inferpool's spans carry stage timings "
            "(TIMESTAMPS), never tensors"
        )
    if names == {OFF}:
        return [OFF]
    if names == {TIMESTAMPS}:
        return [TIMESTAMPS]
    raise BadRequest(f'trace_level must be ["OFF"] or ["TIMESTAMPS"], not {levels}')


def _single(key: str, value: Any) -> Any:
    if isinstance(value, list):
        if len(value) != 1:
            raise BadRequest(f"{key} takes one value, not {len(value)}")
        return value[0]
    return value


def _integer(key: str, value: Any, lowest: int) -> int:
    value = _single(key, value)
    if isinstance(value, bool):
        raise BadRequest(f"{key} must be an integer, not {value}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{key} must be an integer, not {value!r}") from None
    if number < lowest or number > 2**31 - 1:
        raise BadRequest(f"{key} must be between {lowest} and {2**31 - 1}, not {number}")
    return number


CONTROL = TraceControl()  # the server process's (one server per process)
