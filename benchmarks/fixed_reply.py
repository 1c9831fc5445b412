"""A trivial HTTP/1.1 server answering every request with one fixed reply.

Two uses: measuring the open-loop generator's own ceiling (how many requests a second it
can offer and account for when the server costs next to nothing), and, in tests, standing
for a server that stalls (every answer held until ``stall_until``) or sheds load (every
``reject_every``-th request answered 503), so the generator's accounting can be checked
against known behaviour. ``python -m benchmarks.fixed_reply PORT [REPLY_BYTES]`` serves
until killed.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass


@dataclass
class Behaviour:
    """How the server answers: ``stall_until`` is a loop time before which no answer
    leaves; every ``reject_every``-th request (0: none) gets 503."""

    reply_bytes: int = 64
    stall_until: float = 0.0
    reject_every: int = 0
    requests: int = 0

    def response(self, status: int) -> bytes:
        reason = b"OK" if status == 200 else b"Service Unavailable"
        body = b"x" * self.reply_bytes
        head = b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\n\r\n" % (status, reason, len(body))
        return head + body


class FixedReply(asyncio.BufferedProtocol):
    """Reads requests by their Content-Length and answers each in order.

    A buffered protocol: the kernel copies into one preallocated buffer and bodies are
    skipped by count, never kept, so the server costs next to nothing even for the 137 KB
    bodies of the overload scenario."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.chunk = bytearray(1 << 18)
        self.head = bytearray()  # a request head still arriving
        self.skip = 0  # body bytes of the current request not yet received
        self.transport: asyncio.Transport | None = None
        self.ok = behaviour.response(200)
        self.busy = behaviour.response(503)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.chunk)

    def buffer_updated(self, nbytes: int) -> None:
        start = 0
        while start < nbytes:
            if self.skip:
                taken = min(self.skip, nbytes - start)
                self.skip -= taken
                start += taken
                if not self.skip:
                    self.answer()
                continue
            self.head += self.chunk[start:nbytes]
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.head[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            # What followed the head in this chunk is the body's start (or the next request).
            start = nbytes - (len(self.head) - end - 4)
            self.head.clear()
            self.skip = length
            if not length:
                self.answer()

    def answer(self) -> None:
        behaviour = self.behaviour
        behaviour.requests += 1
        every = behaviour.reject_every
        reply = self.busy if every and behaviour.requests % every == 0 else self.ok
        loop = asyncio.get_running_loop()
        wait = behaviour.stall_until - loop.time()
        assert self.transport is not None
        if wait > 0:
            # One request at a time per connection (as the generator sends): no reordering.
            loop.call_at(behaviour.stall_until, self.transport.write, reply)
        else:
            self.transport.write(reply)


async def serve(port: int, behaviour: Behaviour, host: str = "127.0.0.1") -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: FixedReply(behaviour), host, port, backlog=4096)


async def serve_forever(port: int, reply_bytes: int) -> None:
    server = await serve(port, Behaviour(reply_bytes=reply_bytes))
    await server.serve_forever()


if __name__ == "__main__":
    try:
        from uvloop import run as run_loop
    except ImportError:
        run_loop = asyncio.run
    run_loop(serve_forever(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 64))
