"""Placement: which workers hold the replicas of a model.

Workers are filtered by free memory (each has a budget, ``worker_memory_limit``), then
the replicas go to the least-loaded fitting workers, one per worker. A failure is one
summary sentence; the step-by-step reasoning goes to the debug log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


class PlacementError(Exception):
    """The replicas cannot be placed; the message is the one-sentence summary."""


@dataclass(slots=True)
class WorkerRoom:
    """What the scheduler knows of one live worker."""

    worker: int
    used: int  # bytes taken by the models it holds
    replicas: int  # how many model replicas it holds


def mib(size: int) -> str:
    return f"{size / MIB:.0f} MiB" if size >= MIB else f"{size / MIB:.1f} MiB"


def place(
    name: str, wanted: int, size: int, workers: list[WorkerRoom], limit: int | None
) -> list[int]:
    """The workers for ``wanted`` replicas of a model of ``size`` bytes, least loaded first.

    ``limit`` is each worker's memory budget in bytes (None: unlimited).
    """
    fitting = []
    for room in workers:
        free = None if limit is None else limit - room.used
        fits = free is None or free >= size
        logger.debug(
            "placing '%s' (%s): worker %d holds %d replica(s), %s free: %s",
            name, mib(size), room.worker, room.replicas,
            "unlimited" if free is None else mib(free), "fits" if fits else "no room",
        )  # fmt: skip
        if fits:
            fitting.append(room)
    if len(fitting) < wanted:
        raise PlacementError(_summary(name, wanted, size, workers, fitting, limit))
    fitting.sort(key=lambda room: (room.replicas, room.used, room.worker))
    chosen = [room.worker for room in fitting[:wanted]]
    logger.debug("placing '%s': replicas on workers %s", name, chosen)
    return chosen


def _summary(
    name: str,
    wanted: int,
    size: int,
    workers: list[WorkerRoom],
    fitting: list[WorkerRoom],
    limit: int | None,
) -> str:
    noun = "replica" if wanted == 1 else "replicas"
    text = (
        f"cannot place {wanted} {noun} of '{name}': {len(workers)} workers, "
        f"{len(fitting)} with room"
    )
    short = [room for room in workers if room not in fitting]
    if limit is not None and short:
        most_free = max(limit - room.used for room in short)
        text += f" (needs {mib(size)}, {mib(max(0, most_free))} free)"
    return text
