"""The opcodes of the control channel and the base of its typed messages.

Every control message (``messages.py``, ``stream_ops.py``, ``metrics_report.py``) is a
``Control`` struct whose ``op`` is one ``Op``; ``messages.py`` holds the table that
encodes and decodes them all. Nothing here imports the rest of the engine.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, NamedTuple

import msgspec


class Op(IntEnum):
    """Control-channel opcodes (one byte on the wire)."""

    HELLO = 1  # worker → frontend: it is up
    LOAD = 2  # frontend → worker: load a model under an index
    LOADED = 3  # worker → frontend: how that load went
    UNLOAD = 4  # frontend → worker: drop the model under an index
    REQUEST = 5  # frontend → worker: header + body too big for a ring slot
    REPLY = 6  # worker → frontend: header + body too big for a ring slot
    STOP = 7  # frontend → worker: finish what is queued, then exit
    SPAWN = 8  # frontend → template: fork a worker with the fds that come along
    PRELOAD = 9  # frontend → template: models to load before forking
    PING = 10  # frontend → worker: answer PONG (heartbeat)
    PONG = 11  # worker → frontend
    CANCEL = 12  # frontend → worker: drop that request if it has not started
    EXITED = 13  # template → frontend: the wait status of a worker it reaped
    METRICS = 14  # worker → frontend: its runtimes' custom metrics (worker/metrics_reporter.py)
    LOG = 15  # worker/template → frontend: a log record for the server's handlers
    PRELOADED = 16  # template → frontend: how a PRELOAD went, per model, and its epoch
    UNPRELOAD = 17  # frontend → template: drop its copy of a model version
    CREDIT = 18  # frontend → worker: a stream's consumer took chunks, send that many more
    # worker → frontend: replace me (drain first); numbered apart from the sequence above
    # so that opcodes added beside it elsewhere do not collide.
    RECYCLE = 40
    # frontend → worker: one more request of a stream's client (``Kind.GRPC_STREAM_IN``),
    # then the end of its input; numbered apart too.
    FEED = 50
    END_INPUT = 51
    # (30: apart from the ops other changes add after 18, so that merges do not collide)
    LOADING = 30  # template/worker → frontend: about to load a model (and open which file)
    # frontend → template/worker: set these loggers' levels (Triton's logging extension);
    # numbered apart too.
    LOG_LEVELS = 60
    # frontend → worker: unmap unregistered shared-memory regions (ipc/shared_memory.py);
    # numbered apart too.
    SHM_DROP = 70
    # worker → frontend: a runtime calls another model (``call_ops.py``), and the answer
    # back; numbered apart too.
    CALL = 80
    CALL_REPLY = 81
    # worker → frontend: a socket of its own (its fd comes along) for the calls of one
    # thread that is not the worker's loop, answered on it
    CALL_CHANNEL = 82


# Ops whose handler takes the fds that came along (and owns them) beside the struct.
FD_OPS = frozenset({Op.CALL_CHANNEL})


class WithFds(NamedTuple):
    """A message of ``FD_OPS`` as received: its payload and the fds that came along."""

    payload: bytes
    fds: list[int]


class Control(msgspec.Struct, frozen=True):
    """A control message; ``op`` is its opcode on the wire."""

    op: ClassVar[Op]
