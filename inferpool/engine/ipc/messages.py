"""What crosses between the frontend, the template process and the workers.

Requests and replies share one fixed slot header (``HEADER``), written in front of the
body in a ring slot, or in front of it in a control message when the body is too big
for a slot. Control messages are one opcode byte followed by a small JSON document
(or a packed header and body for an oversized request or reply).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import orjson

# request id, model index, kind, flags (unused), status, json_length (-1: none),
# deadline (monotonic ns, 0: none), enqueued at (monotonic ns), then the four stage
# times (queue, compute_input, compute_infer, compute_output, in ns), then body length.
HEADER = struct.Struct("<QIBBHqqqqqqqQ")
HEADER_SIZE = HEADER.size

# Control opcodes.
HELLO = 1  # worker → frontend: {"pid"}
LOAD = 2  # frontend → worker: {"index", "settings"}
LOADED = 3  # worker → frontend: {"index", "ok", "error", "metadata", "size"}
UNLOAD = 4  # frontend → worker: {"index"}
REQUEST = 5  # frontend → worker: header + body too big for a ring slot
REPLY = 6  # worker → frontend: header + body too big for a ring slot
STOP = 7  # frontend → worker: finish what is queued, then exit
SPAWN = 8  # frontend → template: {"worker", "threads", "slots", "slot_size"} + fds
PRELOAD = 9  # frontend → template: {"models": [model settings]} to load before forking
PING = 10  # frontend → worker: answer PONG (heartbeat)
PONG = 11  # worker → frontend
CANCEL = 12  # frontend → worker: {"id"}; drop that request if it has not started
EXITED = 13  # template → frontend: {"pid", "status"} (a waitpid status) of a worker it reaped

# A deadline further away than the header can hold (centuries) is no deadline at all.
_MAX_DEADLINE_NS = 2**63 - 1


def request_header(
    request_id: int,
    model_index: int,
    kind: int,
    json_length: int | None,
    deadline: float | None,
    length: int,
) -> bytes:
    """The header of a request leaving the frontend now.

    Raises ValueError (or OverflowError) for a value the header cannot carry, before
    anything is registered for the request, so that the caller answers 400.
    """
    if json_length is None:
        json_length = -1
    elif not 0 <= json_length <= length:
        raise ValueError(
            f"Inference-Header-Content-Length {json_length} is out of range: "
            f"the body has {length} bytes"
        )
    deadline_ns = 0
    if deadline is not None:
        if not 0 <= deadline < 1e300:  # NaN, infinities, negative
            raise ValueError(f"the request's deadline is out of range ({deadline})")
        deadline_ns = int(deadline * 1e9)
        if deadline_ns > _MAX_DEADLINE_NS:
            deadline_ns = 0
    return HEADER.pack(
        request_id,
        model_index,
        kind,
        0,
        0,
        json_length,
        deadline_ns,
        time.monotonic_ns(),
        0,
        0,
        0,
        0,
        length,
    )


def reply_header(
    request_id: int,
    status: int,
    json_length: int | None,
    times: tuple[int, int, int, int],
    length: int,
) -> bytes:
    """The header of a reply leaving a worker."""
    return HEADER.pack(
        request_id, 0, 0, 0, status, -1 if json_length is None else json_length, 0, 0, *times,
        length,
    )  # fmt: skip


def encode_control(document: dict[str, Any]) -> bytes:
    return orjson.dumps(document)


def decode_control(payload: bytes) -> dict[str, Any]:
    return orjson.loads(payload)
