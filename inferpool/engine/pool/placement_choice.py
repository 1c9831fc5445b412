"""Placement's choice: which workers hold the replicas of a model (a pure decision;
``placement.py`` loads the model on the workers chosen here).

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
    """What placement knows of one live worker."""

    worker: int
    used: int  # bytes taken by the models it holds
    replicas: int  # how many model replicas it holds


def mib(size: int) -> str:
    return f"{size / MIB:.0f} MiB" if size >= MIB else f"{size / MIB:.1f} MiB"


def place(
    name: str,
    wanted: int,
    size: int,
    workers: list[WorkerRoom],
    limit: int | None,
    refused: dict[str, int] | None = None,
) -> list[int]:
    """The workers for ``wanted`` replicas of a model of ``size`` bytes, least loaded first.

    ``workers`` are those whose capabilities suit the model; ``refused`` counts the others
    by the reason (``"lack 'lightgbm>=4.0'"``). ``limit`` is each worker's memory budget
    in bytes (None: unlimited).
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
        raise PlacementError(_summary(name, wanted, size, workers, fitting, limit, refused or {}))
    fitting.sort(key=lambda room: (room.replicas, room.used, room.worker))
    chosen = [room.worker for room in fitting[:wanted]]
    logger.debug("placing '%s': replicas on workers %s", name, chosen)
    return chosen


def _verb(reason: str, count: int) -> str:
    """'lack ...' for several workers, 'lacks ...' for one."""
    verb, _, rest = reason.partition(" ")
    return f"{verb}s {rest}" if count == 1 else reason


def _summary(
    name: str,
    wanted: int,
    size: int,
    workers: list[WorkerRoom],
    fitting: list[WorkerRoom],
    limit: int | None,
    refused: dict[str, int],
) -> str:
    """'cannot place 2 replicas of 'churn': 4 workers; 3 lack 'lightgbm>=4.0', 1 has 40 MiB
    free (needs 120 MiB)': every worker counted once, by why it does not take a replica."""
    noun = "replica" if wanted == 1 else "replicas"
    total = len(workers) + sum(refused.values())
    parts = [f"{count} {_verb(reason, count)}" for reason, count in refused.items()]
    short = [room for room in workers if room not in fitting]
    if limit is not None and short:
        most_free = mib(max(0, max(limit - room.used for room in short)))
        has = "has" if len(short) == 1 else "have at most"
        parts.append(f"{len(short)} {has} {most_free} free (needs {mib(size)})")
    if fitting or not parts:
        parts.append(f"{len(fitting)} with room")
    workers_noun = "worker" if total == 1 else "workers"
    return f"cannot place {wanted} {noun} of '{name}': {total} {workers_noun}; {', '.join(parts)}"
