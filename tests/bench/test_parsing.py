"""wrk, h2load and perf_analyzer output parsing, on output captured from real runs (samples/)."""

import math
from pathlib import Path

import pytest

from benchmarks.loadgen import h2load, perf_analyzer, wrk

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_wrk_success_run():
    result = wrk.parse(sample("wrk-ok.txt"))
    assert (result.requests, result.errors) == (2719, 0)
    assert result.duration == pytest.approx(2.003711)
    assert result.rps == pytest.approx(2719 / 2.003711)
    assert result.latency_us["p50"] == 5490 and result.latency_us["p99"] == 52578
    assert result.latency_us["max"] == 77976
    assert result.error_sample == ""


def test_wrk_non_2xx_responses_are_errors():
    result = wrk.parse(sample("wrk-404.txt"))
    assert result.requests == result.errors == 4879
    assert result.ok == 0 and result.rps == 0
    assert "4879 non-2xx" in result.error_sample


def test_wrk_without_result_line_is_an_error():
    with pytest.raises(ValueError, match="no result line"):
        wrk.parse(sample("wrk-refused.txt"))


def test_wrk_script_posts_the_body_with_headers(tmp_path):
    text = wrk.script(tmp_path / "body.bin", {"Content-Type": "application/json"})
    assert 'wrk.method = "POST"' in text
    assert f'io.open("{tmp_path / "body.bin"}", "rb")' in text
    assert 'wrk.headers["Content-Type"] = "application/json"' in text
    assert "function done(summary, latency, requests)" in text


def test_h2load_success_run_with_latencies_from_its_log():
    log = sample("h2load-ok.log")
    result = h2load.parse(sample("h2load-ok.txt"), log, response_bytes=37)
    assert (result.requests, result.errors) == (1994, 0)
    assert result.duration == pytest.approx(2.0)
    latencies = sorted(int(row.split("\t")[2]) for row in log.splitlines())
    assert result.latency_us["max"] == latencies[-1]
    assert len(latencies) == 1994
    assert result.latency_us["p99"] == latencies[math.ceil(0.99 * 1994) - 1]  # nearest rank
    assert result.latency_us["p50"] < result.latency_us["p99"]


def test_h2load_grpc_errors_are_found_from_missing_response_bytes():
    # An unknown model: HTTP 200 with trailers only, so h2load calls every request a success.
    text = sample("h2load-grpc-error.txt")
    result = h2load.parse(text, sample("h2load-grpc-error.log"), response_bytes=37)
    assert result.requests == result.errors == 1867
    assert "gRPC error" in result.error_sample
    unchecked = h2load.parse(text, sample("h2load-grpc-error.log"), response_bytes=None)
    assert unchecked.errors == 0  # without a known response size nothing can be inferred


def test_h2load_log_must_hold_exactly_this_runs_requests():
    # h2load appends to its log: rows of an earlier run must not pass as this run's.
    log = sample("h2load-ok.log")
    with pytest.raises(ValueError, match="logged 3988 requests but completed 1994"):
        h2load.parse(sample("h2load-ok.txt"), log + log, response_bytes=37)


def test_h2load_garbage_is_an_error():
    with pytest.raises(ValueError, match="no summary"):
        h2load.parse("connect error\n", "", 37)


def test_h2load_command_is_one_thread_one_stream_per_connection(tmp_path):
    cmd = h2load.command("http://h:1/p", tmp_path / "b", {"te": "trailers"}, 8, 2.5, tmp_path / "l")
    assert cmd[0] == "h2load" and cmd[-1] == "http://h:1/p"
    assert {"-t1", "-c8", "-m1", "-D3"} <= set(cmd)
    assert cmd[cmd.index("-H") + 1] == "te: trailers"


def test_perf_analyzer_summary_over_grpc():
    result = perf_analyzer.parse(sample("perf_analyzer-grpc-b1.txt"), batch=1)
    assert (result.requests, result.errors) == (6115, 0)
    assert result.rps == pytest.approx(1693.08)
    assert result.duration == pytest.approx(6115 / 1693.08)
    assert result.latency_us["p50"] == 3428 and result.latency_us["p90"] == 9959
    assert result.latency_us["p99"] == 16400 and result.latency_us["mean"] == 4720
    assert math.isnan(result.latency_us["max"])  # perf_analyzer reports none


def test_perf_analyzer_throughput_counts_rows_not_requests():
    # Batch 8 over HTTP: "14468.4 infer/sec" is rows; 6524 requests of 8 rows each.
    result = perf_analyzer.parse(sample("perf_analyzer-http-b8.txt"), batch=8)
    assert result.requests == 6524
    assert result.rps == pytest.approx(14468.4 / 8)
    assert result.latency_us["p99"] == 8484


def test_perf_analyzer_without_a_summary_is_an_error():
    settings_only = sample("perf_analyzer-grpc-b1.txt").split("Request concurrency")[0]
    with pytest.raises(ValueError, match="printed no summary"):
        perf_analyzer.parse(settings_only, batch=1)


def test_perf_analyzer_command_measures_three_windows_at_one_concurrency():
    cmd = perf_analyzer.command("pa", "iris", "1", "127.0.0.1:9", "grpc", 8, 64, 5.0)
    assert cmd[:11] == ["pa", "-m", "iris", "-x", "1", "-u", "127.0.0.1:9", "-i", "grpc", "-b", "8"]
    assert "--concurrency-range=64:64" in cmd
    assert "--measurement-interval=1667" in cmd  # a third of 5 s each
    assert "--stability-percentage=999" in cmd  # any three windows: the run ends in time
    short = perf_analyzer.command("pa", "iris", "1", "127.0.0.1:9", "http", 1, 1, 0.5)
    assert "--measurement-interval=1000" in short  # never under a second
