"""Rate limits: token buckets checked in the frontend process before a request is queued.

A ``TokenBucket`` holds up to ``burst`` tokens and gains ``rate`` of them per second; each
request takes one, and a request that finds none is refused (``RateLimited``: 429 with
``Retry-After``, gRPC RESOURCE_EXHAUSTED with ``grpc-retry-pushback-ms``) with the time
until the next token, rounded up to whole seconds. Buckets exist only where a limit is set
(a model's ``parameters.rate_limit``, the server's ``--rate-limit`` default for every
model, an API key's ``rate=``): a request to a model without one pays one attribute test.

The model's bucket lives on its ``ModelStatus`` (made at each load, ``model_bucket``);
an API key's on its ``KeyScope`` (``frontends/api_keys.py``). Both are read and taken from
the one event loop of the frontend process, so they need no lock.
"""

from __future__ import annotations

import math
import time

from inferpool.errors import RateLimited
from inferpool.settings import ModelSettings, ServerSettings


class TokenBucket:
    """``rate`` requests per second on average, ``burst`` at once."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int | None = None) -> None:
        if not rate > 0:
            raise ValueError(f"a rate limit is a number of requests per second > 0, not {rate}")
        self.rate = float(rate)
        # Without a burst, one second's worth (at least one request).
        self.burst = float(burst if burst else max(1, math.ceil(rate)))
        self.tokens = self.burst
        self.stamp = time.monotonic()

    def take(self, now: float | None = None) -> float:
        """Take a token: 0.0 when there was one, else the seconds until there is one
        (nothing is taken then)."""
        if now is None:
            now = time.monotonic()
        tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return 0.0
        self.tokens = tokens
        return (1.0 - tokens) / self.rate

    def check(self, what: str) -> None:
        """Take a token, or raise ``RateLimited`` naming ``what`` is limited."""
        wait = self.take()
        if wait:
            raise RateLimited(
                f"{what} is over its rate limit ({self.rate:g} requests/s, burst "
                f"{self.burst:g}); retry later",
                retry_seconds(wait),
            )


def retry_seconds(wait: float) -> int:
    """``Retry-After``'s whole seconds for a wait of ``wait`` seconds: at least 1."""
    return max(1, math.ceil(wait))


def model_bucket(settings: ModelSettings, server: ServerSettings) -> TokenBucket | None:
    """A model's bucket: its own ``parameters.rate_limit`` (and ``rate_limit_burst``),
    else the server's ``rate_limit`` (and ``rate_limit_burst``); None without a limit."""
    parameters = settings.parameters
    rate = parameters.rate_limit
    burst = parameters.rate_limit_burst
    if rate is None:
        rate, burst = server.rate_limit, burst or server.rate_limit_burst
    if not rate:
        return None
    return TokenBucket(rate, burst)
