"""The statistics behind /metrics: the histogram's buckets, what one reply records, and
the failure class of every way a request can fail."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferpool.engine.ipc.messages import Kind, Reply, StageTimes
from inferpool.engine.stats import (
    GRPC,
    PROTOCOL_OF_KIND,
    REST,
    Buckets,
    Histogram,
    ModelStats,
    error_reason,
    reply_reason,
)
from inferpool.errors import (
    BadRequest,
    ClientGone,
    DeadlineExceeded,
    ModelError,
    ModelLoading,
    ModelNotFound,
    NotReady,
    Overloaded,
    TooLarge,
    WorkerLost,
)
from inferpool.settings import ServerSettings


def test_a_value_on_a_bound_is_in_that_bound_s_bucket() -> None:
    histogram = Histogram((1, 5, 10))
    for value in (0, 1, 2, 5, 7, 10, 11, 1000):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 2, 2]
    assert histogram.cumulative() == [2, 4, 6, 8]
    assert histogram.count == 8
    assert histogram.total == 1036


def test_latency_bounds_are_observed_in_nanoseconds() -> None:
    buckets = Buckets(latency=(0.001, 0.5), rows=(1, 8))
    assert buckets.latency_ns == (1_000_000, 500_000_000)
    stats = ModelStats(buckets)
    times = StageTimes(queue=2_000_000, compute_input=10, compute_infer=600_000_000)
    stats.record(REST, 200, 1_000_000, times, rows=3, execution=3)
    assert stats.durations[REST].counts == [1, 0, 0]
    assert stats.durations[GRPC].count == 0
    queue, decode, predict, encode = stats.stages
    assert (queue.counts, decode.counts, predict.counts) == ([0, 1, 0], [1, 0, 0], [0, 0, 1])
    assert encode.counts == [1, 0, 0]  # 0 ns
    assert stats.batch_rows.counts == [0, 1, 0]


def test_one_observation_per_execution_and_failures_by_reason() -> None:
    stats = ModelStats()
    # A batch of two requests: the first reply counts the execution of 5 rows.
    stats.record(GRPC, 200, 100, StageTimes(), rows=2, execution=5)
    stats.record(GRPC, 200, 100, StageTimes(), rows=3, execution=-5)
    stats.record(GRPC, 400, 100, None, reason="invalid_input")
    stats.refuse(REST, 503, "overloaded")
    assert stats.batch_rows.count == 1 and stats.batch_rows.total == 5
    assert stats.durations[GRPC].count == 2
    assert stats.codes[GRPC] == {200: 2, 400: 1}
    assert stats.codes[REST] == {503: 1}
    assert stats.failures == {"invalid_input": 1, "overloaded": 1}
    # Triton's statistics count what was answered, not what the engine refused.
    triton = stats.to_triton("m", None)["inference_stats"]
    assert (triton["success"]["count"], triton["fail"]["count"]) == (2, 1)


def test_each_kind_has_its_protocol() -> None:
    assert [PROTOCOL_OF_KIND[kind] for kind in Kind] == [
        REST, GRPC, REST, REST, GRPC, REST, REST, GRPC, REST, GRPC, REST, GRPC,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (Overloaded("full"), "overloaded"),
        (WorkerLost("gone"), "worker_lost"),
        (NotReady("loading"), "unavailable"),
        (ModelLoading("loading"), "unavailable"),
        (ModelNotFound("model 'm' was unloaded"), "unavailable"),
        (DeadlineExceeded("late"), "timeout"),
        (ClientGone("bye"), "cancelled"),
        (BadRequest("bad"), "invalid_input"),
        (TooLarge("big"), "invalid_input"),
        (ModelError("raised"), "model_error"),
        (RuntimeError("bug"), "internal"),
    ],
)
def test_error_reasons(error: BaseException, reason: str) -> None:
    assert error_reason(error) == reason


@pytest.mark.parametrize(
    ("reply", "workers", "reason"),
    [
        (Reply.from_error(ModelError("model 'm' raised ValueError: x")), True, "model_error"),
        (Reply.from_error(KeyError("x")), False, "internal"),
        (Reply.from_error(BadRequest("bad")), True, "invalid_input"),
        (Reply(422, b"unprocessable", times=StageTimes()), True, "invalid_input"),
        (Reply.from_error(DeadlineExceeded("late")), True, "timeout"),
        (Reply.from_error(ClientGone("bye")), True, "cancelled"),
        # Made in the frontend (no stage times) with workers: the worker died with it.
        (Reply.from_error(WorkerLost("worker 0 exited")), True, "worker_lost"),
        # From a worker (its replies carry stage times), or in-process: not held.
        (Reply(503, b"does not hold that model", times=StageTimes()), True, "unavailable"),
        (Reply.from_error(NotReady("not held")), False, "unavailable"),
    ],
)
def test_reply_reasons(reply: Reply, workers: bool, reason: str) -> None:
    assert reply_reason(reply, workers) == reason


def test_bucket_settings_take_a_comma_or_json_list() -> None:
    settings = ServerSettings(metrics_latency_buckets="0.01, 0.1,1", metrics_batch_buckets="[1, 8]")
    assert settings.metrics_latency_buckets == [0.01, 0.1, 1.0]
    assert settings.metrics_batch_buckets == [1.0, 8.0]
    assert ServerSettings().metrics_batch_buckets[-1] == 4096


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "must be numbers"),
        ([], "at least one bucket bound"),
        ("1,a", "must be numbers"),
        ("[1,", "not a JSON list"),
        ("0,1", "positive and finite"),
        ("1,nan", "positive and finite"),
        ("1,1", "must increase"),
        ("2,1", "must increase"),
    ],
)
def test_bad_bucket_settings_are_refused(bad: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerSettings(metrics_batch_buckets=bad)


def test_grpc_codes_are_the_http_status_of_the_grpc_status() -> None:
    from inferpool.frontends.metrics import _code_counts

    codes = {200: 5, 400: 1, 422: 2, 413: 1, 499: 1, 503: 3}
    assert _code_counts("rest", codes) == {
        "200": 5, "400": 1, "422": 2, "413": 1, "499": 1, "503": 3,
    }  # fmt: skip
    assert _code_counts("grpc", codes) == {"200": 5, "400": 3, "429": 1, "499": 1, "503": 3}
