"""The engine client's accounting alone: per-version statistics, their lifetime, and what
Triton's statistics extension answers from them."""

from __future__ import annotations

import time

import pytest

from inferpool.engine.accounting import Accounting
from inferpool.engine.ipc.messages import Reply, StageTimes
from inferpool.engine.states import UNLOADED, ModelState, ModelStatus, ModelTable, model_key
from inferpool.engine.stats import GRPC, REST
from inferpool.errors import ModelError, ModelNotFound, NotReady
from inferpool.settings import ServerSettings


def accounting(*statuses: ModelStatus, workers: int = 0) -> Accounting:
    table = ModelTable()
    for status in statuses:
        table.set(status)
    return Accounting(ServerSettings(workers=workers), table)


def test_a_ready_load_starts_statistics_that_a_reload_keeps() -> None:
    books = accounting()
    books.loaded("a", 0.25, ready=False)
    assert books.load_seconds == {"a": 0.25} and "a" not in books.stats  # failed: none
    books.loaded("a", 0.5, ready=True)
    stats = books.stats["a"]
    stats.inference_count = 7
    books.loaded("a", 0.75, ready=True)  # a reload goes on counting
    assert books.stats["a"] is stats and stats.inference_count == 7
    assert books.load_seconds == {"a": 0.75}
    books.forget("a")
    books.forget("a")  # forgetting twice is harmless
    assert books.stats == {} and books.load_seconds == {}


def test_of_gives_a_version_its_statistics_once() -> None:
    books = accounting()
    stats = books.of("a")
    assert books.of("a") is stats and books.stats == {"a": stats}
    assert stats.buckets is books.buckets


def test_record_counts_the_typed_path_as_grpc_and_skips_unloaded_versions() -> None:
    books = accounting()
    started = time.perf_counter_ns()
    books.record("gone", True, started, None)  # unloaded meanwhile: nothing to count in
    assert books.stats == {}
    books.loaded("a", 0.1, ready=True)
    times = StageTimes(queue=1, compute_input=2, compute_infer=3, compute_output=4)
    books.record("a", True, started, times, rows=3, execution=3)
    books.record("a", False, started, None, error=ModelError("boom"))
    books.record("a", False, started, None, error=ValueError("bug"))
    books.record("a", False, started, None)
    stats = books.stats["a"]
    assert stats.codes[GRPC] == {200: 1, 500: 3} and stats.codes[REST] == {}
    assert stats.inference_count == 3 and stats.execution_count == 1
    assert stats.failures == {"model_error": 1, "internal": 2}


@pytest.mark.parametrize(("workers", "reason"), [(0, "unavailable"), (2, "worker_lost")])
def test_a_503_made_here_is_a_lost_worker_only_with_workers(workers: int, reason: str) -> None:
    books = accounting(workers=workers)
    stats = books.of("a")
    books.count_reply(stats, REST, Reply(503, b"gone"), time.perf_counter_ns())
    books.count_reply(stats, REST, Reply(200, b"{}", rows=2, execution=2), 0)
    assert stats.codes[REST] == {503: 1, 200: 1}
    assert stats.failures == {reason: 1} and stats.inference_count == 2


def test_running_lists_only_versions_with_requests_in_flight() -> None:
    books = accounting()
    books.of("idle")
    books.of("busy").in_flight = 2
    assert books.running() == {"busy": 2}


def test_statistics_cover_loaded_versions_and_refuse_unloaded_or_unknown_ones() -> None:
    one = ModelStatus("m", "1", ModelState.READY)
    two = ModelStatus("m", "2", ModelState.UNAVAILABLE, UNLOADED)
    other = ModelStatus("other", None, ModelState.READY)
    gone = ModelStatus("gone", None, ModelState.UNAVAILABLE, UNLOADED)
    books = accounting(one, two, other, gone)
    books.loaded(one.key, 0.1, ready=True)
    books.record(one.key, True, time.perf_counter_ns(), None)
    listed = books.statistics()["model_stats"]
    assert [(s["name"], s["version"]) for s in listed] == [("m", "1"), ("other", "")]
    assert listed[0]["inference_count"] == 1
    assert listed[1]["inference_count"] == 0  # READY without statistics yet: zeros
    assert [s["version"] for s in books.statistics("m")["model_stats"]] == ["1"]
    assert books.statistics("m", "1")["model_stats"][0]["inference_count"] == 1
    with pytest.raises(NotReady, match="version '2'"):
        books.statistics("m", "2")
    with pytest.raises(NotReady, match="model 'gone'"):
        books.statistics("gone")
    with pytest.raises(ModelNotFound):
        books.statistics("nobody")
    with pytest.raises(ModelNotFound):
        books.statistics("m", "3")
    assert model_key("m", "1") in books.stats
