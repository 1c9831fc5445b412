"""Placement: filter by room, prefer the least loaded, explain failures in one sentence."""

from __future__ import annotations

import logging

import pytest

from inferpool.engine.pool.placement_choice import MIB, PlacementError, WorkerRoom, place


def test_least_loaded_fitting_workers_win() -> None:
    rooms = [WorkerRoom(0, 50 * MIB, 3), WorkerRoom(1, 10 * MIB, 1), WorkerRoom(2, 0, 1)]
    assert place("m", 2, 10 * MIB, rooms, None) == [2, 1]
    # With a budget, worker 2 is the only one with 40 MiB free.
    assert place("m", 1, 40 * MIB, rooms, 60 * MIB) == [2]


def test_failure_is_one_sentence_and_reasoning_is_debug(caplog) -> None:
    rooms = [WorkerRoom(0, 0, 0), WorkerRoom(1, 40 * MIB, 1)]
    debug = caplog.at_level(logging.DEBUG, logger="inferpool.engine.pool.placement_choice")
    with debug, pytest.raises(PlacementError) as error:
        place("iris", 2, 120 * MIB, rooms, 150 * MIB)
    assert str(error.value) == (
        "cannot place 2 replicas of 'iris': 2 workers; 1 has 110 MiB free (needs 120 MiB), "
        "1 with room"
    )
    assert "worker 1 holds 1 replica(s), 110 MiB free: no room" in caplog.text
    with pytest.raises(PlacementError) as error:
        place("iris", 3, 120 * MIB, rooms, None)
    assert str(error.value) == "cannot place 3 replicas of 'iris': 2 workers; 2 with room"


def test_workers_refused_by_capability_are_counted_by_reason() -> None:
    # The issue's own example: 4 workers, 3 without the library, 1 without the room.
    rooms = [WorkerRoom(3, 80 * MIB, 2)]
    refused = {"lack 'lightgbm>=4.0'": 3}
    with pytest.raises(PlacementError) as error:
        place("churn", 2, 120 * MIB, rooms, 120 * MIB, refused)
    assert str(error.value) == (
        "cannot place 2 replicas of 'churn': 4 workers; 3 lack 'lightgbm>=4.0', "
        "1 has 40 MiB free (needs 120 MiB)"
    )
    # Refused workers never take a replica, even with room to spare.
    assert place("churn", 1, MIB, rooms, None, refused) == [3]
