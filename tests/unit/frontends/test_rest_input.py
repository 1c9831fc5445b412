"""What a REST request brings: bounded body, binary header length, Request-Timeout, and the
wait for the engine that a deadline or a disconnect cuts short."""

from __future__ import annotations

import asyncio

import pytest

from inferpool.errors import BadRequest, ClientGone, DeadlineExceeded, TooLarge
from inferpool.frontends.rest.body import (
    LARGE_BODY,
    json_length,
    read_body,
    request_timeout,
    scan_headers,
)
from inferpool.frontends.rest.reply import GONE, WATCH, WATCHING, await_reply


def receiver(*messages: dict):
    queue = list(messages)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)  # like a server: nothing more until a disconnect
        raise AssertionError("unreachable")

    return receive


def chunk(body: bytes, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


def test_scan_headers_finds_the_six_in_one_pass():
    headers = [
        (b"host", b"x"),
        (b"content-length", b"12"),
        (b"inference-header-content-length", b"7"),
        (b"request-timeout", b"1.5"),
        (b"content-encoding", b"gzip"),
        (b"x-request-id", b"req-42"),
        (b"inferpool-priority", b"3"),
    ]
    assert scan_headers(headers) == (b"12", b"7", b"1.5", b"gzip", b"req-42", b"3")
    assert scan_headers([]) == (None, None, None, None, None, None)
    assert scan_headers([(b"x-request-idx", b"no")])[4] is None


def test_read_body_joins_chunks_under_the_limit():
    receive = receiver(chunk(b"ab", True), chunk(b"cd", True), chunk(b"e", False))
    assert asyncio.run(read_body(receive, None, 5)) == b"abcde"
    assert asyncio.run(read_body(receiver(chunk(b"abc", False)), b"3", 5)) == b"abc"


def test_a_large_body_is_read_into_one_buffer_of_its_length_behind_its_prefix():
    """From LARGE_BODY on, the chunks are copied into one bytearray sized from the
    Content-Length (no list of chunks then a join); below it, chunks are joined."""
    parts = [bytes([n]) * (LARGE_BODY // 3) for n in range(4)]
    body = b"".join(parts)
    receive = receiver(*(chunk(part, n < 3) for n, part in enumerate(parts)))
    read = asyncio.run(read_body(receive, str(len(body)).encode(), len(body), prefix=b"HEAD"))
    assert isinstance(read, bytearray) and len(read) == 4 + len(body)
    assert read == b"HEAD" + body
    small = asyncio.run(read_body(receiver(chunk(b"ab", True), chunk(b"c", False)), b"3", 5))
    assert type(small) is bytes and small == b"abc"
    prefixed = asyncio.run(read_body(receiver(chunk(b"abc", False)), b"3", 5, prefix=b"P"))
    assert prefixed == b"Pabc"


def test_a_large_body_longer_than_its_content_length_is_400():
    receive = receiver(chunk(b"x" * LARGE_BODY, True), chunk(b"y", False))
    with pytest.raises(BadRequest, match="longer than its Content-Length"):
        asyncio.run(read_body(receive, str(LARGE_BODY).encode(), 2 * LARGE_BODY))


def test_a_large_body_that_ends_short_is_what_came():
    receive = receiver(chunk(b"x" * LARGE_BODY, True), chunk(b"y", False))
    read = asyncio.run(read_body(receive, str(LARGE_BODY + 10).encode(), 2 * LARGE_BODY))
    assert read == b"x" * LARGE_BODY + b"y"


def test_a_large_body_is_still_cut_at_the_limit():
    receive = receiver(chunk(b"x" * LARGE_BODY, True), chunk(b"y", True), chunk(b"z", False))
    with pytest.raises(TooLarge, match="--max-body-bytes"):
        asyncio.run(read_body(receive, str(LARGE_BODY).encode(), LARGE_BODY))


@pytest.mark.parametrize("length", [b"6", b"99999999999999999999999"])
def test_read_body_refuses_a_content_length_over_the_limit_before_reading(length):
    async def never() -> dict:
        raise AssertionError("the body was read")

    with pytest.raises(TooLarge, match="limit of 5 bytes"):
        asyncio.run(read_body(never, length, 5))


def test_read_body_cuts_a_chunked_body_at_the_limit():
    receive = receiver(chunk(b"abc", True), chunk(b"def", True), chunk(b"never", False))
    with pytest.raises(TooLarge, match="--max-body-bytes"):
        asyncio.run(read_body(receive, None, 5))


def test_read_body_of_a_client_gone_is_client_gone():
    receive = receiver(chunk(b"abc", True), {"type": "http.disconnect"})
    with pytest.raises(ClientGone):
        asyncio.run(read_body(receive, None, 100))


@pytest.mark.parametrize(
    "raw", [b"-1", b"+5", b"1_0", b"abc", b"", b"1.5", b"99999999999999999999999", b"\xb2"]
)
def test_json_length_must_be_a_non_negative_integer(raw):
    with pytest.raises(BadRequest, match="non-negative integer"):
        json_length(raw, 100)


def test_json_length_must_fit_the_body():
    assert json_length(None, 10) is None
    assert json_length(b"0", 10) == 0
    assert json_length(b" 10 ", 10) == 10
    with pytest.raises(BadRequest, match="larger than the request body"):
        json_length(b"11", 10)


def test_request_timeout():
    assert request_timeout(None, 0.0) is None
    assert request_timeout(None, 2.5) == 2.5
    assert request_timeout(b"0.25", 2.5) == 0.25
    assert request_timeout(b"1e300", 0.0) is None  # no deadline, rather than an overflow
    for raw in (b"0", b"-1", b"nan", b"abc", b""):
        with pytest.raises(BadRequest, match="Request-Timeout"):
            request_timeout(raw, 0.0)


async def slow(result: str = "done", seconds: float = 0.05) -> str:
    await asyncio.sleep(seconds)
    return result


async def hung(cancelled: list[bool]) -> None:
    """An engine call that never answers; notes its cancellation in ``cancelled``."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.append(True)
        raise


@pytest.mark.parametrize("watched", [True, False])
def test_await_reply_returns_the_answer(watched):
    scope = {WATCH: 0} if watched else {}
    assert asyncio.run(await_reply(scope, receiver(), slow(), None)) == "done"
    assert asyncio.run(await_reply(scope, receiver(), slow(), 5.0)) == "done"
    assert scope.get(WATCH, 0) == 0


@pytest.mark.parametrize("watched", [True, False])
def test_await_reply_stops_at_the_deadline_and_cancels_the_call(watched):
    cancelled = []

    scope = {WATCH: 0} if watched else {}
    with pytest.raises(DeadlineExceeded, match="deadline"):
        asyncio.run(await_reply(scope, receiver(), hung(cancelled), 0.05))
    assert cancelled == [True]


def test_await_reply_watched_call_cancelled_by_the_protocol_is_client_gone():
    async def main() -> None:
        scope = {WATCH: 0}
        cancelled = []

        task = asyncio.ensure_future(await_reply(scope, receiver(), hung(cancelled), None))
        await asyncio.sleep(0.01)
        assert scope[WATCH] == WATCHING
        scope[WATCH] = GONE  # what rest/http1.py does on connection_lost
        task.cancel()
        with pytest.raises(ClientGone):
            await task
        assert cancelled == [True]

    asyncio.run(main())


def test_await_reply_unwatched_call_races_the_disconnect():
    cancelled = []

    async def gone_soon() -> dict:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    with pytest.raises(ClientGone):
        asyncio.run(await_reply({}, gone_soon, hung(cancelled), None))
    assert cancelled == [True]
