"""Request header blocks in: HPACK decoding, the verdict on each block, and its cache.

One ``HeaderDecoder`` per connection (the HPACK dynamic table is per connection). Clients
repeat the same header block call after call, and decoding and validating one in pure
Python costs tens of µs; a block means the same thing again as long as the dynamic table
is unchanged, so results are kept per table version, which moves on whenever a decode
changes the table. The cache is bounded in entries and bytes.
"""

from __future__ import annotations

from typing import cast

import hpack
from hpack import HPACKError, OversizedHeaderListError

from inferpool.transport.http2_wire import (
    COMPRESSION_ERROR,
    ENHANCE_YOUR_CALM,
    HEADER_TABLE_SIZE,
    Limits,
    ProtocolFailure,
    validate_headers,
)

# A decoded header list past this many times max_header_bytes ends the connection (the
# HPACK decoder had to stop mid-block); past max_header_bytes only the stream is refused.
DECODED_HEADER_FACTOR = 4
# Decoded header blocks kept per connection for reuse, bounded in entries and bytes.
CACHE_ENTRIES = 64
CACHE_BYTES = 128 * 1024
CACHED_BLOCK_MAX = 4096

Headers = list[tuple[bytes, bytes]]
# None for a request to serve, else (limit, message): the setting name of the limit the
# request is over (it is answered naming it), or None when it is malformed (a stream
# error, RFC 9113 §8.1.1).
Verdict = tuple[str | None, str] | None


class HeaderDecoder:
    """Decodes a connection's request header blocks and judges them against its limits."""

    __slots__ = ("cache", "cache_bytes", "hpack", "limits", "table_version")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        decoded_limit = max(limits.max_header_bytes * DECODED_HEADER_FACTOR, 4096)
        self.hpack = hpack.Decoder(max_header_list_size=decoded_limit)
        self.hpack.max_allowed_table_size = HEADER_TABLE_SIZE
        # Decoded header blocks, each with the dynamic-table version it was decoded under,
        # the verdict on it and its content-length.
        self.cache: dict[bytes, tuple[int, Headers, Verdict, int | None]] = {}
        self.cache_bytes = 0
        self.table_version = 0

    def decode(self, block: bytes) -> tuple[Headers, Verdict, int | None]:
        """The block's headers, the verdict on them and their content-length.

        Raises ProtocolFailure when the block cannot be decoded (a connection error).
        """
        cached = self.cache.get(block)
        if cached is not None and cached[0] == self.table_version:
            return cached[1], cached[2], cached[3]
        entries = self.hpack.header_table.dynamic_entries
        before = tuple(entries)
        try:
            # raw=True: a list of (name, value) bytes pairs (typed as an Iterable there).
            headers = cast(Headers, self.hpack.decode(block, raw=True))
        except OversizedHeaderListError:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "decoded header list too large") from None
        except HPACKError as exc:
            raise ProtocolFailure(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        problem, size, length = validate_headers(headers)
        limits = self.limits
        verdict: Verdict = None
        if problem is not None:
            verdict = (None, problem)
        elif size > limits.max_header_bytes:
            verdict = (
                "max_header_bytes",
                f"request headers of {size} bytes are over the limit of "
                f"{limits.max_header_bytes} bytes (max_header_bytes)",
            )
        elif len(headers) > limits.max_header_count:
            verdict = (
                "max_header_count",
                f"{len(headers)} request headers are over the limit of "
                f"{limits.max_header_count} (max_header_count)",
            )
        if tuple(entries) != before:
            self.table_version += 1
            self.clear()
        if len(block) <= CACHED_BLOCK_MAX and size <= CACHED_BLOCK_MAX:
            cost = len(block) + size
            if len(self.cache) >= CACHE_ENTRIES or self.cache_bytes + cost > CACHE_BYTES:
                self.clear()
            self.cache[block] = (self.table_version, headers, verdict, length)
            self.cache_bytes += cost
        return headers, verdict, length

    def clear(self) -> None:
        """Forget every decoded block (the table changed, the cache is full, or the
        connection is gone)."""
        self.cache.clear()
        self.cache_bytes = 0
