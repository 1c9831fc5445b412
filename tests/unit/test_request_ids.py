"""The request-id context (``inferpool/request_ids.py``): the ids of the requests the
dispatcher sends to workers, found again for the workers' log records (its part in log
records: tests/unit/test_logs.py; the frontends' part: tests/unit/frontends/
test_request_context.py)."""

from __future__ import annotations

import contextvars

from inferpool.request_ids import RECENT, current_request_id, resolve_internal, track


def test_the_dispatcher_tracks_the_current_id_for_the_workers_records():
    def send(internal_id: int, request_id: str | None) -> None:
        current_request_id.set(request_id)
        track(internal_id)

    contextvars.copy_context().run(send, 10_001, "r-1")
    contextvars.copy_context().run(send, 10_002, None)
    assert resolve_internal(10_001) == "r-1"
    assert resolve_internal(10_002) is None  # its id was not known when it left
    assert resolve_internal(10_003) is None
    # Only the last RECENT are kept: a later request in the same slot replaces it.
    contextvars.copy_context().run(send, 10_001 + RECENT, "r-2")
    assert resolve_internal(10_001) is None
    assert resolve_internal(10_001 + RECENT) == "r-2"
