"""The access log of both frontends: one line per request (method, model, status, latency).

Off by default (``--access-log`` turns it on); lines go to the ``inferpool.access`` logger.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

logger = logging.getLogger("inferpool.access")

# /v2/models/{name}/..., /v2/repository/models/{name}/...; /v2/models/stats names no model.
_MODEL_IN_PATH = re.compile(r"^/v2/(?:repository/)?models/(?!stats(?:/|$))([^/]+)")


def log_request(frontend: str, method: str, model: str, status: str | int, started: float) -> None:
    """Log one finished request; ``started`` is its ``time.perf_counter()`` at arrival."""
    elapsed_ms = (time.perf_counter() - started) * 1000
    logger.info("%s %s model=%s status=%s %.2fms", frontend, method, model, status, elapsed_ms)


def model_in_path(path: str) -> str:
    match = _MODEL_IN_PATH.match(path)
    return match.group(1) if match else "-"


class RestAccessLog:
    """ASGI middleware that logs every HTTP request once its response has started."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_note_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            path = scope["path"]
            method = f"{scope['method']} {path}"
            log_request("REST", method, model_in_path(path), status, started)
