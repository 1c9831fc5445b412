"""HTTP/1.1 connections of the REST and metrics ports: Uvicorn's httptools protocol, guarded.

Uvicorn's protocol has no header or body timeout, no write bound and no limit on header
size or count, so one peer can hold a connection (and a file descriptor) forever. This
subclass adds, per connection:

- one timer, re-armed lazily: a phase change only stores a deadline, and the timer, when
  it fires, either acts or re-arms itself at the deadline now in force. A keep-alive
  request costs a few attribute stores, not a timer of its own;
- the phases and their deadlines: waiting for the first byte of a request
  (``handshake_timeout`` on a new connection, ``idle_timeout`` between requests), headers
  (``header_timeout`` from the first byte), body (``body_timeout`` after the headers);
- a write bound: once the transport's buffer is over its high-water mark, the peer has
  ``write_timeout`` to read it down, else the connection is aborted (``close()`` would wait
  for the peer forever); meanwhile no pipelined request is read or started, and the
  connection counts in the process's unsent answers (``transport/unsent.py``);
- header size and count limits (431), a Content-Length over ``max_body_bytes`` (413),
  both answered before the app runs, then a short lingering close so the client reads the
  answer instead of a reset;
- admission from the headers (``early.py``): an infer request refused now is answered at
  once, its body skipped (small, keep-alive) or dropped unread (then the connection closes);
- the shared connection registry (``Connections``): admitted on accept, released on close,
  evictable while no request is in flight;
- a disconnect cancels the request's engine call when the app marked it as watched
  (``WATCH`` in the scope), so a queued request of a client gone is dropped by its worker;
- a whole answer in one write (``answer.DIRECT`` in the scope: ``respond``), where
  Uvicorn's ASGI ``send`` writes the status line and headers, then the body, with a system
  call each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from inferpool.frontends.connections import Connections
from inferpool.frontends.metrics_server import count_rejected
from inferpool.frontends.reclaim import collect_soon
from inferpool.frontends.rest.answer import DIRECT, error_answer
from inferpool.frontends.rest.body import headers_refusal, too_large_message
from inferpool.frontends.rest.early import Admission, skips
from inferpool.frontends.rest.reply import GONE, WATCH, WATCHING
from inferpool.settings import ServerSettings
from inferpool.transport.unsent import ANSWERS, SMALL

logger = logging.getLogger("inferpool.http")

# Parser phases of a connection.
_WAITING = 0  # no request begun: handshake (new connection) or idle keep-alive
_HEAD = 1  # request line or headers arriving
_BODY = 2  # headers done, body arriving
_DONE = 3  # request fully received; the app answers it
_LINGER = 4  # answered with an error before its body was read: drain a little, then close
_SKIP = 5  # refused from its headers, keep-alive: its (small) body skipped, then the next

# Seconds the rest of a body answered before it arrived is read and dropped before the
# connection closes, so that the client reads the answer instead of a reset.
LINGER_SECONDS = 2.0
# Unsent bytes a closing connection still sends (a socket's buffer takes them at once).
_FLUSH_AT_CLOSE = 65536
# uvloop's millisecond timers may fire a hair before their time.
_SLACK = 0.002


class _Rejected(Exception):
    """Raised inside a parser callback to stop parsing and answer ``status``."""

    def __init__(self, status: int, message: str, limit: str | None, extra: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.limit = limit  # the setting's name, for the metrics
        self.extra = extra  # header lines the answer adds


class GuardedHttpTools(HttpToolsProtocol):
    """Uvicorn's httptools protocol with timeouts, limits and the connection registry.

    ``settings``, ``registry``, ``frontend`` and ``admission`` are class attributes, set
    by ``protocol_class``.
    """

    settings: ServerSettings
    registry: Connections
    frontend: str
    # Refuses an infer request from its URL and headers, its body unread (``early.py``).
    admission: Admission | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_since: float | None = time.monotonic()
        self._phase = _WAITING
        self._expire_at = 0.0  # loop time; 0: no deadline for the phase
        self._write_at = 0.0  # loop time the written answer must be drained by; 0: none
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._header_bytes = 0
        self._header_count = 0
        self._head_raw = 0  # bytes received while in _HEAD, beyond the first chunk
        self._content_length: bytes | None = None
        self._running_scope: dict[str, Any] | None = None
        self._running_cycle: Any = None
        self._running_task: asyncio.Task[None] | None = None
        self._after_drain = False  # a finished answer waits for the peer to read
        self._large = 0  # bytes of the last large answer written whole (``respond``)
        self._admitted = False
        self._lost = False

    # -- connection -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.registry.admit(self):
            transport.abort()
            return
        self._admitted = True
        self._arm(self.settings.handshake_timeout)
        self._sync_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._lost = True
        ANSWERS.release(self)
        if self._admitted:
            self.registry.release(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        scope = self._running_scope
        if scope is not None and scope.get(WATCH) == WATCHING and self._running_task:
            # The app awaits the engine for a client that is gone: drop the request.
            scope[WATCH] = GONE
            self._running_task.cancel()

    def close_idle(self) -> None:
        """The registry needs this connection's place (it has no request in flight)."""
        self._drop()

    def _drop(self) -> None:
        """Close now. A few bytes still unsent (an error answer just written: uvloop may
        hold a write until the loop's next turn) go out first, within ``LINGER_SECONDS``;
        more than a socket buffer's worth is cut off: a peer that stopped reading would keep
        ``close()`` waiting forever."""
        if self.transport.is_closing():
            return
        unsent = self.transport.get_write_buffer_size()
        if unsent > _FLUSH_AT_CLOSE:
            self._abort_unread()
            return
        self.transport.close()
        if unsent:
            self.loop.call_later(LINGER_SECONDS, self._abort_if_open)

    def _abort_if_open(self) -> None:
        if not self._lost:
            self._abort_unread()

    def _abort_unread(self) -> None:
        """Cut the connection off with answer bytes unsent; their memory comes back with
        the next full collection, which this asks for (``reclaim.py``)."""
        self.transport.abort()
        collect_soon(self.loop)

    # -- reading ----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == _LINGER:
            return  # the rest of a rejected body: dropped
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            rejected = exc.__context__
            if isinstance(rejected, _Rejected):
                self._reject(rejected.status, rejected.message, rejected.limit, rejected.extra)
            else:
                self._reject(400, "invalid HTTP request")
            return
        except httptools.HttpParserError:
            self._reject(400, "invalid HTTP request")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._phase == _HEAD and phase == _HEAD:
            # httptools buffers a header until it is complete: bound what it may hold.
            self._head_raw += len(data)
            if self._head_raw > self.settings.max_header_bytes:
                self._reject(431, *headers_refusal(self.settings, self._header_count))
                return
        self._sync_timer()

    def on_body(self, body: bytes) -> None:
        # Uvicorn copies each chunk into a bytearray, and receive() copies that out again
        # (bytes(...)): a chunk that finds nothing pending is kept as it came, and handed
        # over as it is (bytes() of a bytes is the object itself). A large JSON body is read
        # with two copies fewer; chunks that pile up are gathered as Uvicorn does.
        cycle: Any = self.cycle  # its body: bytes here, a bytearray in Uvicorn
        if self._phase == _SKIP:
            return  # a refused request's body: skipped
        if cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            return
        pending = cycle.body
        if not pending:
            cycle.body = body
        else:
            if type(pending) is not bytearray:
                pending = cycle.body = bytearray(pending)
            pending += body
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEAD
        self._header_bytes = self._header_count = self._head_raw = 0
        self._content_length = None
        self._arm(self.settings.header_timeout)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._header_bytes += len(url)
        if self._header_bytes > self.settings.max_header_bytes:
            raise _Rejected(431, *headers_refusal(self.settings, self._header_count))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        if (
            self._header_bytes > self.settings.max_header_bytes
            or self._header_count > self.settings.max_header_count
        ):
            raise _Rejected(431, *headers_refusal(self.settings, self._header_count))
        name = name.lower()
        if name == b"content-length":
            self._content_length = value
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        length = self._content_length
        if length is not None:
            limit = self.settings.max_body_bytes
            # httptools has checked it is digits; a long one is over any limit.
            if len(length) > 18 or int(length) > limit:
                message = too_large_message(length.decode("latin-1"), limit)
                raise _Rejected(413, message, "max_body_bytes")
        admission = self.admission
        alone = self._running_task is None and not self.pipeline  # no answer ahead of ours
        if admission is not None and alone and self.parser.get_method() == b"POST":
            refused = admission(self.url, self.headers)
            if refused is not None:  # answered now; its body skipped or dropped unread
                keep = self.parser.should_keep_alive() and not self.flow.write_paused
                if not skips(length, self.expect_100_continue, keep):  # then _linger, close
                    raise _Rejected(refused[0], refused[1], None, refused[2])
                self._write_error(*refused, close=False)
                self._phase = _SKIP
                self._arm(LINGER_SECONDS)  # a body slower than this: the connection closes
                return
        self._phase = _BODY
        # Not a key of Uvicorn's HTTPScope TypedDict: an extension key of ours.
        self.scope[WATCH] = 0  # type: ignore[literal-required]  # this server cancels a watched engine call on disconnect
        self.scope[DIRECT] = self  # type: ignore[literal-required]  # and writes whole answers
        super().on_headers_complete()
        if self.cycle is not None and not self.parser.should_keep_alive():
            # The client's "connection: close": Uvicorn 0.46 (our lowest) kept such a
            # connection open after the answer (it read only the HTTP version).
            self.cycle.keep_alive = False
        if self.pipeline:
            # Queued behind a running request with reading paused: no body deadline
            # until it starts.
            self._expire_at = 0.0
        else:
            self._arm(self.settings.body_timeout)

    def on_message_complete(self) -> None:
        if self._phase == _SKIP:  # refused from its headers: no app ran, the next may come
            self._phase = _WAITING
            self._arm(self.settings.idle_timeout)
            return
        super().on_message_complete()
        if self._running_task is None and not self.pipeline:
            # Answered before its body ended (see on_response_complete): wait for the next.
            self._phase = _WAITING
            self._arm(self.settings.idle_timeout)
        else:
            self._phase = _DONE
            self._expire_at = 0.0  # the app's time now: request and model timeouts apply

    # -- answering --------------------------------------------------------------------------
    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._running_task = task
        self._running_scope = cycle.scope
        self._running_cycle = cycle
        self.idle_since = None

    def respond(self, scope: dict[str, Any], status: int, head: bytes, body: bytes) -> bool:
        """Write the running request's whole answer: status line, the server's default
        headers (date, server), ``head`` (header lines, Content-Length among them) and
        ``body``, in one write. False, with nothing written, when this is not the running
        request, it has begun answering or its client is gone, or the peer is not reading
        (the ASGI ``send`` then waits for the drain as usual)."""
        cycle = self._running_cycle
        if (
            scope is not self._running_scope
            or cycle.response_started
            or cycle.disconnected
            or self.flow.write_paused
        ):
            return False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        content = [STATUS_LINE[status]]
        for name, value in cycle.default_headers:
            content += [name, b": ", value, b"\r\n"]
        content.append(head)
        keep_alive = cycle.keep_alive
        content.append(b"\r\n" if keep_alive else b"connection: close\r\n\r\n")
        if len(body) < SMALL:
            content.append(body)
            self.transport.write(b"".join(content))
        else:
            # The body as it is, not a copy joined to the head: a reader that reads it
            # slowly keeps one copy here, not two (one writev either way).
            self.transport.writelines((b"".join(content), body))
            self._large = len(body)
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            self.transport.close()
        cycle.on_response()
        return True

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        self._running_scope = self._running_task = self._running_cycle = None
        if self.transport.is_closing():
            return
        if not self.pipeline and self._phase == _BODY and self.cycle.more_body:
            # Answered before its body arrived (413, or a route that reads none): the rest
            # is read and dropped, for a moment; a body still arriving then closes it.
            self.idle_since = time.monotonic()
            self.flow.resume_reading()
            self._arm(LINGER_SECONDS)
            self._sync_timer()
            return
        if self.flow.write_paused:
            # The peer is not reading its answers: read or start nothing more until it does.
            self._after_drain = True
            return
        self._serve_next()

    def _serve_next(self) -> None:
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            if self._phase == _BODY and cycle is self.cycle:
                self._arm(self.settings.body_timeout)
        else:
            self.idle_since = time.monotonic()
            if self._phase == _DONE:
                self._phase = _WAITING
                self._arm(self.settings.idle_timeout)
        self._sync_timer()

    def unsent(self) -> int:
        """Answer bytes written that the peer has not read (``transport.unsent.Holder``):
        a large answer counts whole until it is sent, as the transport keeps it whole."""
        size: int = self.transport.get_write_buffer_size()
        return max(size, self._large) if size else 0

    def pause_writing(self) -> None:
        super().pause_writing()
        ANSWERS.hold(self)
        if self.settings.write_timeout > 0:
            self._write_at = self.loop.time() + self.settings.write_timeout
            self._sync_timer()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_at = 0.0
        if self._large:
            self._large = 0
            ANSWERS.released()  # a large answer is (nearly) sent: its memory is coming back
        if self._after_drain:
            self._after_drain = False
            if not self.transport.is_closing():
                self._serve_next()

    def send_400_response(self, msg: str) -> None:
        self._reject(400, msg)

    def _reject(
        self, status: int, message: str, limit: str | None = None, extra: bytes = b""
    ) -> None:
        """Answer ``status`` ourselves (no app runs for this request), then close;
        ``limit``: the setting refusing it, if a limit does; ``extra``: header lines."""
        logger.debug("HTTP %d to %s: %s", status, self.client, message)
        if limit is not None:
            count_rejected(self.frontend, limit)
        if self.transport.is_closing():
            return
        if self._running_task is not None or self.pipeline:
            self._abort_unread()  # an answer is being written: cannot put ours in front
            return
        self._write_error(status, message, extra)
        self._linger()

    def _write_error(
        self, status: int, message: str, extra: bytes = b"", close: bool = True
    ) -> None:
        defaults = self.server_state.default_headers
        self.transport.write(error_answer(defaults, status, message, extra, close))

    def _linger(self) -> None:
        """Drop what the peer still sends for a moment, so it reads our answer, then close."""
        self._phase = _LINGER
        self.flow.resume_reading()
        try:
            self.transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            self._drop()
            return
        self._arm(min(LINGER_SECONDS, self.settings.body_timeout or LINGER_SECONDS))
        self._sync_timer()

    # -- the one timer ----------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        """The current phase's deadline (0 or less: none); the timer catches up lazily."""
        self._expire_at = self.loop.time() + seconds if seconds > 0 else 0.0

    def _sync_timer(self) -> None:
        """Make sure the timer fires no later than the earliest deadline in force."""
        at = self._expire_at
        if self._write_at and (not at or self._write_at < at):
            at = self._write_at
        if not at or (self._timer is not None and self._timer_at <= at):
            return  # none, or the timer fires first and re-arms itself then
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(at, self._on_timer)
        self._timer_at = at

    def _on_timer(self) -> None:
        self._timer = None
        now = self.loop.time() + _SLACK
        if self._write_at and now >= self._write_at:
            logger.debug("closing %s: answer not read within --write-timeout", self.client)
            self._abort_unread()
        elif self._expire_at and now >= self._expire_at:
            self._expired()
        else:
            self._sync_timer()

    def _expired(self) -> None:
        phase = self._phase
        if phase == _HEAD and self._running_task is None:
            seconds = self.settings.header_timeout
            message = f"request headers not received in {seconds:g}s (--header-timeout)"
            self._reject(408, message, "header_timeout")
        elif phase == _BODY and self.cycle is not None and not self.cycle.response_started:
            seconds = self.settings.body_timeout
            # The app waits for the body: it is told the client is gone, and sends nothing.
            self._write_error(408, f"request body not received in {seconds:g}s (--body-timeout)")
            count_rejected(self.frontend, "body_timeout")
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            self._drop()
        else:
            logger.debug("closing %s: timed out in phase %d", self.client, phase)
            self._drop()


def protocol_class(
    settings: ServerSettings,
    registry: Connections,
    frontend: str = "rest",
    admission: Admission | None = None,
) -> type[GuardedHttpTools]:
    """The protocol class Uvicorn instantiates per connection, bound to these settings;
    ``frontend`` names its port in the metrics ("rest" or "metrics"); ``admission``: the
    check that refuses an infer request from its headers (``early.py``), or None."""
    bound = dict(settings=settings, registry=registry, frontend=frontend, admission=admission)
    return type("GuardedHttpTools", (GuardedHttpTools,), bound)
