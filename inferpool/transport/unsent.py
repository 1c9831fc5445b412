"""Answers written but not yet read by their peers: counted over a process's connections,
under a bound per connection and one in total (``--max-unsent-bytes`` and
``--max-unsent-bytes-per-connection``).

An answer is bytes the frontend holds until its peer reads them: in the transport's write
buffer, or (HTTP/2) waiting for flow-control window. A peer that reads slowly, or never
opens its window, keeps them here. Each connection that holds some registers as a
``Holder`` (the HTTP/1.1 protocol once its writer is paused, an HTTP/2 connection once a
stream waits for window or its writer is paused); the total is summed over the holders
only when an answer of ``SMALL`` bytes or more is about to be kept, so the usual request,
whose connection holds nothing, costs one length test.

``refusal`` says why such an answer must not be kept: its connection already holds
unsent bytes and the answer would take it past the per-connection bound, or the holders
together would pass the total. The frontend then answers with the reason instead (503
with Retry-After over REST, RESOURCE_EXHAUSTED over gRPC): the memory answers take is at
most the bounds plus one answer, and answers in flight. An answer whose connection holds
nothing and that fits the total is always kept, so a single answer larger than the
per-connection bound is still served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# Answers smaller than this are never refused: they are sent at once unless a writer is
# already paused (asyncio's and uvloop's default high-water mark of a transport is 64 KiB).
SMALL = 64 * 1024
MIB = 1 << 20
# The settings' names, as the refusals are counted in the metrics.
TOTAL = "max_unsent_bytes"
PER_CONNECTION = "max_unsent_bytes_per_connection"


class Holder(Protocol):
    """A connection that may hold unsent answer bytes."""

    def unsent(self) -> int:
        """Answer bytes written to this connection that its peer has not read yet."""


def _mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


class UnsentAnswers:
    """The connections holding unsent answers, with both bounds (0: no bound)."""

    def __init__(self, limit: int = 0, per_connection: int = 0) -> None:
        self.limit = limit
        self.per_connection = per_connection
        self.holders: set[Holder] = set()
        # Called when answers held for slow readers may have been freed (the frontend's
        # ``reclaim.trim_soon``: give the heap's free pages back).
        self.on_release: Callable[[], None] | None = None

    def configure(
        self, limit: int, per_connection: int, on_release: Callable[[], None] | None = None
    ) -> None:
        self.limit, self.per_connection = limit, per_connection
        self.on_release = on_release

    def released(self) -> None:
        """Answers held for a slow reader were freed, or one was refused."""
        if self.on_release is not None:
            self.on_release()

    def hold(self, holder: Holder) -> None:
        """``holder`` may hold unsent bytes from now on; it leaves once it holds none."""
        self.holders.add(holder)

    def release(self, holder: Holder) -> None:
        if holder in self.holders:
            self.holders.discard(holder)
            self.released()

    def total(self) -> int:
        """Unsent answer bytes of every holder; those that hold none leave."""
        total = 0
        for holder in list(self.holders):
            held = holder.unsent()
            if held <= 0:
                self.holders.discard(holder)
                self.released()
            total += held
        return total

    def refusal(self, holder: Holder | None, size: int) -> tuple[str, str] | None:
        """Why an answer of ``size`` bytes for ``holder``'s connection (None: not known)
        must not be kept, as the setting's name and a sentence; None when it may."""
        if size < SMALL or not self.holders:
            return None
        if self.per_connection and holder is not None:
            held = holder.unsent()
            if held > 0 and held + size > self.per_connection:
                self.released()  # the answer refused is freed
                return PER_CONNECTION, (
                    f"answer of {_mib(size)} not sent: this connection holds {_mib(held)} of "
                    f"answers its client has not read yet (max_unsent_bytes_per_connection="
                    f"{self.per_connection})"
                )
        if self.limit:
            total = self.total()
            if total > 0 and total + size > self.limit:
                self.released()
                return TOTAL, (
                    f"answer of {_mib(size)} not sent: the server holds {_mib(total)} of "
                    f"answers its clients have not read yet (max_unsent_bytes={self.limit}); "
                    "retry later"
                )
        return None

    def connection_refusal(self, holder: Holder) -> str | None:
        """Why a new request of a connection that holds unsent answers is refused at once
        (HTTP/2: a new stream), or None: it is past the per-connection bound."""
        if not self.per_connection:
            return None
        held = holder.unsent()
        if held <= self.per_connection:
            return None
        return (
            f"this connection holds {_mib(held)} of answers its client has not read yet "
            f"(max_unsent_bytes_per_connection={self.per_connection})"
        )


# The process's one ledger: the frontends configure it (``frontends/server.py``).
ANSWERS = UnsentAnswers()
