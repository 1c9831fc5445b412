"""What frontends/rest/http1.py's subclass needs of Uvicorn's httptools protocol, checked on the
installed Uvicorn: pyproject.toml allows a range of releases (tox's lowest environment
installs the oldest, the others the newest), and a release that renames one of these
fails here by name, before the HTTP tests fail by behaviour."""

from __future__ import annotations

import inspect

from uvicorn.protocols.http import httptools_impl

# Methods the subclass overrides, extends (super()) or calls.
PROTOCOL_METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_body",
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
    "send_400_response",
    "handle_websocket_upgrade",
    "_should_upgrade",
    "_unsupported_upgrade_warning",
    "_start_asgi_task",
)
# Attributes the protocol sets in __init__ (or on_message_begin) that the subclass reads.
PROTOCOL_ATTRIBUTES = (
    "loop", "transport", "flow", "parser", "pipeline", "tasks", "server_state", "url",
    "headers", "scope", "cycle", "expect_100_continue", "client",
)  # fmt: skip
# RequestResponseCycle's state, read and written by the whole-answer path (respond).
CYCLE_ATTRIBUTES = (
    "scope", "body", "more_body", "message_event", "disconnected", "keep_alive",
    "waiting_for_100_continue", "response_started", "response_complete", "default_headers",
    "on_response",
)  # fmt: skip


def assigned(cls: type) -> set[str]:
    source = inspect.getsource(cls)
    return {line.split("self.", 1)[1].split()[0].split("=")[0].rstrip(":")
            for line in source.splitlines() if line.strip().startswith("self.")}  # fmt: skip


def test_the_protocol_has_what_the_subclass_overrides_and_reads() -> None:
    protocol = httptools_impl.HttpToolsProtocol
    missing = [name for name in PROTOCOL_METHODS if not callable(getattr(protocol, name, None))]
    assert not missing, f"Uvicorn's HttpToolsProtocol lacks {missing}"
    missing = sorted(set(PROTOCOL_ATTRIBUTES) - assigned(protocol))
    assert not missing, f"Uvicorn's HttpToolsProtocol no longer sets {missing}"
    missing = sorted(set(CYCLE_ATTRIBUTES) - assigned(httptools_impl.RequestResponseCycle))
    assert not missing, f"Uvicorn's RequestResponseCycle no longer sets {missing}"
    assert httptools_impl.STATUS_LINE[200].startswith(b"HTTP/1.1 200")
