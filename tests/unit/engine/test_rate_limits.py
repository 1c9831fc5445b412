"""The token bucket of rate limits (``engine/rate_limits.py``): its burst, its refill, the
wait it reports, and which settings make one."""

from __future__ import annotations

import pytest

from inferpool.engine.rate_limits import TokenBucket, model_bucket, retry_seconds
from inferpool.errors import RateLimited
from inferpool.settings import ModelSettings, ServerSettings


def test_a_bucket_takes_its_burst_then_refills_at_its_rate() -> None:
    bucket = TokenBucket(2.0, 3)
    now = bucket.stamp
    assert [bucket.take(now) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(now) == pytest.approx(0.5)  # one token comes in 1/rate seconds
    assert bucket.take(now + 0.25) == pytest.approx(0.25)  # half of it has come
    assert bucket.take(now + 0.5) == 0.0
    # Long idle: never more than the burst.
    later = now + 100
    assert [bucket.take(later) for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.5)]


def test_without_a_burst_a_bucket_holds_one_second_of_its_rate() -> None:
    assert TokenBucket(10).burst == 10
    assert TokenBucket(0.2).burst == 1  # at least one request
    with pytest.raises(ValueError, match="> 0"):
        TokenBucket(0)


def test_a_refusal_says_when_to_retry_in_whole_seconds() -> None:
    assert retry_seconds(0.001) == 1 and retry_seconds(1.0) == 1 and retry_seconds(2.2) == 3
    bucket = TokenBucket(0.25, 1)  # one request every 4 s
    bucket.check("model 'm'")
    with pytest.raises(RateLimited) as refused:
        bucket.check("model 'm'")
    assert refused.value.status == 429 and refused.value.retry_seconds == 4
    assert refused.value.message.startswith("model 'm' is over its rate limit (0.25 requests/s")


def test_the_model_setting_wins_over_the_server_default() -> None:
    server = ServerSettings(rate_limit=5, rate_limit_burst=7)
    own = ModelSettings(name="m", parameters={"rate_limit": 2, "rate_limit_burst": 3})
    bucket = model_bucket(own, server)
    assert bucket is not None and (bucket.rate, bucket.burst) == (2.0, 3.0)
    default = model_bucket(ModelSettings(name="m"), server)
    assert default is not None and (default.rate, default.burst) == (5.0, 7.0)
    assert model_bucket(ModelSettings(name="m"), ServerSettings()) is None


@pytest.mark.parametrize(
    "parameters", [{"rate_limit": 0}, {"rate_limit": -1}, {"rate_limit_burst": 0}]
)
def test_bad_model_rates_are_refused(parameters: dict) -> None:
    with pytest.raises(ValueError, match="rate_limit"):
        ModelSettings(name="m", parameters=parameters)
