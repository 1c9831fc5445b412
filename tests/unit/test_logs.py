"""inferpool.logs: the formats, the levels' parsing, the request id filter, and a worker's
records forwarded over a control channel and re-emitted by the server."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from inferpool import logs
from inferpool.engine.ipc import messages
from inferpool.engine.ipc.channel import Channel, socket_pair
from inferpool.engine.ipc.messages import Op
from inferpool.request_ids import current_request_id
from inferpool.settings import ServerSettings, load_server_settings


def record(message: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("app.part", logging.WARNING, __file__, 1, message, args or None, None)
    made.__dict__.update(extra)
    return made


# -- settings ------------------------------------------------------------------------------
def test_levels_parse_from_pairs_json_and_mappings() -> None:
    assert logs.parse_levels("inferpool.access=info, uvicorn.error=WARNING") == {
        "inferpool.access": "info",
        "uvicorn.error": "warning",
    }
    assert logs.parse_levels('{"a.b": "debug"}') == {"a.b": "debug"}
    assert logs.parse_levels({"a": "Error"}) == {"a": "error"}
    assert logs.parse_levels("") == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a=loud", "unknown log level 'loud'"),
        ("a", "'a' is not LOGGER=LEVEL"),
        ("=info", "a logger name is empty"),
        ("{nope", "not valid JSON"),
        (["a"], "give LOGGER=LEVEL pairs or a JSON object"),
    ],
)
def test_bad_levels_are_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        logs.parse_levels(value)


def test_settings_take_format_and_levels_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFERPOOL_LOG_FORMAT", "json")
    monkeypatch.setenv("INFERPOOL_LOG_LEVELS", "inferpool.access=info,hpack=error")
    settings = ServerSettings()
    assert settings.log_format == "json"
    assert settings.log_levels == {"inferpool.access": "info", "hpack": "error"}


def test_mlserver_structured_logging_is_the_json_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLSERVER_USE_STRUCTURED_LOGGING", "true")
    assert load_server_settings(None, {}).log_format == "json"
    monkeypatch.setenv("MLSERVER_USE_STRUCTURED_LOGGING", "false")
    assert load_server_settings(None, {}).log_format == "text"


@pytest.mark.parametrize(
    "values", [{"log_format": "xml"}, {"log_levels": "a=noisy"}, {"log_level": "chatty"}]
)
def test_settings_refuse_bad_logging_values(values: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        ServerSettings(**values)


# -- formats -------------------------------------------------------------------------------
def test_text_names_the_worker_and_request_only_when_there_are_some() -> None:
    formatter = logs.TextFormatter()
    plain = record("REST on %s", "here", worker="-", request_id="-")
    assert formatter.format(plain).endswith(" WARNING app.part: REST on here")
    tagged = record("hello", worker="1", request_id="r-7")
    assert formatter.format(tagged).endswith(" WARNING app.part [worker=1 request_id=r-7]: hello")


def test_json_is_one_object_per_line_with_extras_and_the_traceback() -> None:
    try:
        raise KeyError("gone")
    except KeyError:
        exc_info = sys.exc_info()
    made = record("rows %d", 3, worker="0", request_id="abc", rows=3, path=logs.__name__)
    made.exc_info = exc_info
    made.created = 1764633600.25  # 2025-12-02T00:00:00.250Z
    line = logs.JsonFormatter().format(made)
    assert "\n" not in line
    document = json.loads(line)
    assert document["time"] == "2025-12-02T00:00:00.250Z"
    assert document["level"] == "WARNING" and document["logger"] == "app.part"
    assert document["message"] == "rows 3"
    assert document["request_id"] == "abc" and document["worker"] == "0"
    assert document["rows"] == 3 and document["path"] == "inferpool.logs"
    assert "KeyError: 'gone'" in document["exc_info"]


def test_json_writes_values_it_cannot_encode_as_text() -> None:
    document = json.loads(logs.JsonFormatter().format(record(peer=("127.0.0.1", 5), obj=object())))
    assert document["peer"] == ["127.0.0.1", 5] and document["obj"].startswith("<object")


def test_the_filter_adds_the_current_request_id() -> None:
    context_filter = logs.ContextFilter()
    outside = record()
    context_filter.filter(outside)
    assert (outside.request_id, outside.worker) == ("-", "-")
    token = current_request_id.set("req-1")
    try:
        inside, forwarded = record(), record(request_id="req-2", worker="3")
        context_filter.filter(inside)
        context_filter.filter(forwarded)
    finally:
        current_request_id.reset(token)
    assert (inside.request_id, inside.worker) == ("req-1", "-")
    assert (forwarded.request_id, forwarded.worker) == ("req-2", "3")


# -- forwarding ----------------------------------------------------------------------------
class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def channels() -> Iterator[tuple[Channel, Channel]]:
    ours, theirs = socket_pair()
    yield Channel(ours), Channel(theirs)
    ours.close()
    theirs.close()


@pytest.fixture
def collected() -> Iterator[Collect]:
    handler = Collect()
    logger = logging.getLogger("forwarded")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def received(channel: Channel) -> list[messages.Log]:
    found: list[messages.Log] = []
    while True:
        try:
            op, payload, _ = channel.receive(block=False)
        except BlockingIOError:
            return found
        assert op == Op.LOG
        message = messages.decode(op, payload)
        assert isinstance(message, messages.Log)
        found.append(message)


def test_a_forwarded_record_is_replayed_with_its_worker_and_request(
    channels: tuple[Channel, Channel], collected: Collect
) -> None:
    worker_side, server_side = channels
    handler = logs.ForwardHandler(worker_side, "1", logging.NullHandler())
    handler.running = [41, 42]
    try:
        raise ValueError("bad row")
    except ValueError:
        exc_info = sys.exc_info()
    made = logging.LogRecord("forwarded.model", logging.ERROR, "", 0, "row %d", (7,), exc_info)
    made.rows = 2
    handler.handle(made)
    [message] = received(server_side)
    assert message.requests == [41, 42] and message.message == "row 7"
    logs.replay(message, "1", "abc,def")
    [again] = collected.records
    assert again.name == "forwarded.model" and again.levelno == logging.ERROR
    assert again.getMessage() == "row 7" and again.created == made.created
    assert (again.worker, again.request_id, again.rows) == ("1", "abc,def", 2)  # type: ignore[attr-defined]
    assert "ValueError: bad row" in (again.exc_text or "")


def test_without_a_channel_records_go_to_stderr_marked_with_the_worker(
    channels: tuple[Channel, Channel],
) -> None:
    fallback = Collect()
    worker_side, _ = channels
    handler = logs.ForwardHandler(None, "template", fallback)
    handler.handle(record())
    handler.channel = worker_side
    worker_side.close()  # broken: from now on stderr too
    handler.handle(record())
    assert [r.worker for r in fallback.records] == ["template", "template"]  # type: ignore[attr-defined]
    assert handler.channel is None


def test_a_server_that_does_not_read_costs_dropped_records_not_a_stall(
    channels: tuple[Channel, Channel],
) -> None:
    worker_side, server_side = channels
    worker_side.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    handler = logs.ForwardHandler(worker_side, "0", logging.NullHandler())
    for n in range(2000):
        handler.handle(record("line %d", n))
    assert handler.dropped > 0
    first = received(server_side)
    assert [m.message for m in first] == [f"line {n}" for n in range(len(first))]
    dropped = handler.dropped
    assert len(first) + dropped == 2000
    handler.handle(record("after"))
    notice, after = received(server_side)
    assert notice.message.startswith(f"{dropped} log record(s) dropped")
    assert after.message == "after" and handler.dropped == 0


def test_children_get_the_levels_set_here() -> None:
    logging.getLogger("d2.quiet").setLevel(logging.ERROR)
    try:
        config = logs.child_config()
    finally:
        logging.getLogger("d2.quiet").setLevel(logging.NOTSET)
    assert config["levels"]["d2.quiet"] == logging.ERROR
    assert config["levels"][""] == logging.getLogger().level


def test_configure_logging_writes_the_held_warnings_in_the_chosen_format() -> None:
    # A fresh interpreter: configure_logging replaces the root logger's handlers.
    code = (
        "import logging\n"
        "from inferpool import logs\n"
        "from inferpool.settings import ServerSettings\n"
        "logs.hold_early_records()\n"
        "logging.getLogger('inferpool.settings').warning('early %s', 'one')\n"
        "settings = ServerSettings(log_format='json', log_level='warning',\n"
        "                          log_levels='chatty=info,uvicorn.error=error')\n"
        "logs.configure_logging(settings)\n"
        "logging.getLogger('chatty').info('said')\n"
        "logging.getLogger('other').info('not said')\n"
        "import warnings; warnings.warn('careful')\n"
        "assert logging.getLogger('uvicorn.error').level == logging.ERROR\n"
        "assert logging.getLogger('hypercorn.error').level == logging.WARNING\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )  # fmt: skip
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(line["logger"], line["message"]) for line in lines[:2]] == [
        ("inferpool.settings", "early one"),
        ("chatty", "said"),
    ]
    assert lines[2]["logger"] == "py.warnings" and "careful" in lines[2]["message"]
    assert len(lines) == 3


def test_the_server_takes_a_bounded_batch_per_wake_up(channels: tuple[Channel, Channel]) -> None:
    # So that a worker flooding it with records cannot hold its event loop.
    worker_side, server_side = channels
    for n in range(10):
        worker_side.send_control(messages.Log(level=20, logger="x", message=str(n), created=0))
    taken: list[int] = []
    assert server_side.dispatch_pending(lambda op, payload: taken.append(op), limit=4)
    assert len(taken) == 4
    assert server_side.dispatch_pending(lambda op, payload: taken.append(op))
    assert taken == [Op.LOG] * 10
