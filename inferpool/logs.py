"""Logging: the server's one handler, its two formats and per-logger levels, and the
forwarding of the template's and the workers' records to it.

- ``configure_logging(settings)``: the server process's root handler (stderr), formatted
  as ``text`` or ``json`` (one object per line), the global level and ``log_levels``.
  Uvicorn's and Hypercorn's loggers have no handler of their own: they reach this one.
- ``ContextFilter``: adds ``request_id`` (the request being handled, from
  ``inferpool.request_ids``) and ``worker`` ("-": the server process) to every record.
- In the template and the workers (``child_config`` → ``configure_child`` → ``forward_to``):
  a ``ForwardHandler`` sends each record that passes the server's levels to the server as
  an ``Op.LOG`` message; the server re-emits it (``replay``) with the worker's index and
  the request's id, so only the server writes log lines.
"""

from __future__ import annotations

import datetime
import logging
import select
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from inferpool.request_ids import current_request_id
from inferpool.settings.validators import LEVELS, parse_level
from inferpool.settings.validators import parse_levels as parse_levels  # (tests read it here)

if TYPE_CHECKING:
    # Imported where a record is forwarded (the template and the workers, which load the
    # engine anyway): ``settings`` imports this module, and a runtime or a settings file
    # read must not load the engine (tests/unit/test_leaf_imports.py).
    from inferpool.engine.ipc import messages
    from inferpool.engine.ipc.channel import Channel
    from inferpool.settings import ServerSettings

# The HTTP servers' loggers: no handler of their own (their records reach ours), and their
# levels set here (frontends/server.py leaves them alone).
LIBRARY_LOGGERS = ("uvicorn.error", "uvicorn.access", "uvicorn.asgi", "hypercorn.error")
NONE = "-"  # the request id or worker of a record that has none
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s"
# How long a worker waits for room when the server has not read its last records yet;
# none by then: it drops records (counted, and said in one record when there is room
# again), without waiting, until one goes through.
SEND_WAIT = 0.05

# What every LogRecord has; anything else on a record came with ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message", "asctime", "request_id", "worker", "context", "taskName",
}  # fmt: skip
_PLAIN = logging.Formatter()
_format = "text"  # of the server's handler, for the children's fallback to stderr


# -- formats -------------------------------------------------------------------------------
class ContextFilter(logging.Filter):
    """Gives every record a ``request_id`` and a ``worker`` (kept if it has them already,
    as a worker's records do)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = current_request_id.get() or NONE
        if not hasattr(record, "worker"):
            record.worker = NONE
        return True


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER [worker=W request_id=R]: MESSAGE``, the bracket only when the
    record has either."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        worker = getattr(record, "worker", NONE)
        request = getattr(record, "request_id", NONE)
        parts = [f"worker={worker}"] if worker != NONE else []
        if request != NONE:
            parts.append(f"request_id={request}")
        record.context = f" [{' '.join(parts)}]" if parts else ""
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, request_id,
    worker, every ``extra=`` field of the record, and exc_info (the traceback as text)."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        document: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", NONE),
            "worker": getattr(record, "worker", NONE),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                document[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            document["exc_info"] = record.exc_text
        if record.stack_info:
            document["stack_info"] = record.stack_info
        # Values orjson does not know (a Path, an enum) are written as their str().
        return orjson.dumps(document, default=str).decode()


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


def stderr_handler(log_format: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(ContextFilter())
    return handler


# -- the server process --------------------------------------------------------------------
def hold_early_records() -> None:
    """Until ``configure_logging``: keep the warnings said while settings load (their
    format is not known yet); ``configure_logging`` writes them out in the right one."""
    _set_root_handler(_Early())
    logging.getLogger().setLevel(logging.WARNING)


def configure_logging(settings: ServerSettings | None) -> None:
    """The server's logging: one stderr handler on the root logger, formatted as
    ``settings.log_format``, the global level and the per-logger ones. None: text and
    warnings only (the settings did not load)."""
    global _format
    _format = settings.log_format if settings is not None else "text"
    handler = stderr_handler(_format)
    early = _set_root_handler(handler)
    root = logging.getLogger()
    if settings is None:
        root.setLevel(logging.WARNING)
    else:
        root.setLevel(LEVELS[parse_level(settings.log_level)])
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(library_level(settings, name))
        for name, level in settings.log_levels.items():
            logging.getLogger(name).setLevel(LEVELS[level])
    # Python's warnings too, rather than raw lines on stderr.
    logging.captureWarnings(True)
    for record in early:
        handler.handle(record)


def library_level(settings: ServerSettings, name: str) -> int:
    """The level of Uvicorn's or Hypercorn's logger ``name``: ``log_levels``' if it names
    it; else warnings and errors as ours, INFO only at debug.

    Each Uvicorn server (REST and metrics) logs its own "Started server process", "Shutting
    down", "Waiting for connections to close" and "Finished server process": the same
    lines twice, all of them said once by the server's own lines (as Hypercorn's "Running
    on").
    """
    if name in settings.log_levels:
        return LEVELS[settings.log_levels[name]]
    ours = LEVELS.get(settings.log_level.strip().lower(), logging.INFO)
    return ours if ours <= logging.DEBUG else max(ours, logging.WARNING)


class _Early(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _set_root_handler(handler: logging.Handler) -> list[logging.LogRecord]:
    """Make ``handler`` the root's only one; the records an early handler held."""
    root = logging.getLogger()
    held: list[logging.LogRecord] = []
    for old in root.handlers[:]:
        if isinstance(old, _Early):
            held = old.records
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    return held


# -- changed at run time (Triton's logging extension: frontends/runtime_settings.py) -------
def set_levels(levels: Mapping[str, int]) -> None:
    """Set loggers' levels (the root's under ""): in the server, and in the template and
    each worker when the server sends them ``Op.LOG_LEVELS``."""
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)


def log_format() -> str:
    """The server handler's format now: ``text`` or ``json``."""
    return _format


def set_format(log_format: str) -> None:
    """Format the server's handler's next lines as ``text`` or ``json`` (the workers
    format nothing: their records are written by this handler)."""
    global _format
    _format = log_format
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, TextFormatter | JsonFormatter):
            handler.setFormatter(formatter(log_format))


# -- the template and the workers ----------------------------------------------------------
def child_config() -> dict[str, Any]:
    """What the template (and the workers it forks) need to log as this process does: the
    format of the fallback to stderr, and every level set here (the root's under "")."""
    levels = {"": logging.getLogger().level}
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    return {"format": _format, "levels": levels}


def configure_child(config: Mapping[str, Any], channel: Channel | None, worker: str) -> None:
    """The template's logging (inherited by the workers it forks): the server's levels,
    and a ``ForwardHandler`` sending to ``channel``."""
    for name, level in config.get("levels", {}).items():
        logging.getLogger(name or None).setLevel(level)
    fallback = stderr_handler(str(config.get("format", "text")))
    _set_root_handler(ForwardHandler(channel, worker, fallback))
    logging.captureWarnings(True)


def forward_to(channel: Channel, worker: str) -> ForwardHandler:
    """A forked worker's records go to ``channel`` (its own), marked as ``worker``'s."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, ForwardHandler):
            handler.channel, handler.worker = channel, worker
            return handler
    configure_child(child_config(), channel, worker)  # not forked by the template
    return forward_to(channel, worker)


class ForwardHandler(logging.Handler):
    """Sends each record to the server (``Op.LOG``); to stderr, formatted as the server
    does, while there is no channel or it is broken.

    Never blocks for long: while the server has not read its last records, each record
    waits up to ``SEND_WAIT`` for room (a burst goes at the pace the server writes); when
    none comes, records are dropped without waiting until one goes through again, and
    that one is preceded by a warning counting them. ``running`` holds the ids of the
    requests being predicted.
    """

    def __init__(self, channel: Channel | None, worker: str, fallback: logging.Handler) -> None:
        super().__init__()
        self.channel = channel
        self.worker = worker
        self.fallback = fallback
        self.running: Sequence[int] = ()
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        channel = self.channel
        if channel is None:
            self._to_stderr(record)
            return
        try:
            message = self._message(record)
        except Exception:
            self.handleError(record)
            return
        try:
            if self.dropped and self._send(channel, self._dropped_message(record)):
                self.dropped = 0
            if not self.dropped and self._send(channel, message):
                return
            self.dropped += 1
        except OSError:  # the server has gone, or the channel was closed here
            self.channel = None
            self._to_stderr(record)

    def _send(self, channel: Channel, message: messages.Log) -> bool:
        """Sent without blocking (waiting ``SEND_WAIT`` once, unless dropping already)."""
        from inferpool.engine.ipc.channel import Outgoing
        from inferpool.engine.ipc.messages import Op, encode

        packed = Outgoing(Op.LOG, (encode(message),))
        try:
            for attempt in range(2):
                try:
                    channel.send_packed(packed, block=False)
                    return True
                except BlockingIOError:
                    if attempt or self.dropped:
                        return False
                    poller = select.poll()
                    poller.register(channel.fileno(), select.POLLOUT)
                    poller.poll(SEND_WAIT * 1000)
            return False
        finally:
            packed.release()  # a spilled payload's memfd, if it was not sent

    def _message(self, record: logging.LogRecord) -> messages.Log:
        from inferpool.engine.ipc.messages import Log

        if record.exc_info and not record.exc_text:
            record.exc_text = _PLAIN.formatException(record.exc_info)
        extra = {
            key: value if isinstance(value, str | int | float | bool | None) else str(value)
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")
        }
        return Log(
            level=record.levelno, logger=record.name, message=record.getMessage(),
            created=record.created, exc=record.exc_text or "", requests=list(self.running),
            extra=extra,
        )  # fmt: skip

    def _dropped_message(self, record: logging.LogRecord) -> messages.Log:
        from inferpool.engine.ipc.messages import Log

        text = f"{self.dropped} log record(s) dropped: the server did not read them in time"
        return Log(level=logging.WARNING, logger=__name__, message=text, created=record.created)

    def _to_stderr(self, record: logging.LogRecord) -> None:
        record.worker = self.worker
        self.fallback.handle(record)


def replay(message: messages.Log, worker: str, request_id: str | None) -> None:
    """Emit a record a worker (or the template) forwarded, through this process's
    handlers, as ``worker``'s and ``request_id``'s."""
    record = logging.LogRecord(message.logger, message.level, "", 0, message.message, None, None)
    record.created = message.created
    record.msecs = (message.created - int(message.created)) * 1000
    if message.exc:
        record.exc_text = message.exc
    record.__dict__.update(message.extra)
    record.worker = worker
    record.request_id = request_id or NONE
    logging.getLogger(message.logger).handle(record)
