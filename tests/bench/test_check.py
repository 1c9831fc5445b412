"""The correctness check, the statistics reader and the built-in generator's error counting,
against the stand-in V2 server on free ports."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import serverstats
from benchmarks.check import CheckFailed, check
from benchmarks.loadgen import builtin
from benchmarks.loadgen.base import Job, Target
from benchmarks.models import build_repository, features, load_predictor
from benchmarks.payloads import PROTOCOLS, batch_rows, build_payload
from benchmarks.ports import free_port
from benchmarks.servers import RunningServer, ServerSpec, wait_ready

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"), ["iris"])


@pytest.fixture(scope="module")
def server(repo):
    http, grpc = free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "tests.bench.standin",
        "serve",
        str(repo),
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
    ]
    process = subprocess.Popen(cmd, cwd=PROJECT_ROOT)
    running = RunningServer(
        ServerSpec("standin", "external"), Target("127.0.0.1", http, grpc), process, models=["iris"]
    )
    try:
        wait_ready(running, timeout=60)
        yield running
    finally:
        process.terminate()
        process.wait(10)


def iris_payload(repo: Path, protocol: str, model: str = "iris", expected=None):
    x = batch_rows(features("iris"), 8)
    if expected is None:
        expected = load_predictor(repo, "iris")(x)
    return build_payload(model, 8, protocol, x, expected)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_right_answers_pass_and_give_the_response_size(server, repo, protocol):
    assert check(server, iris_payload(repo, protocol)) > 5


@pytest.mark.parametrize("protocol", ["rest-json", "grpc-raw"])
def test_wrong_predictions_fail(server, repo, protocol):
    wrong = iris_payload(repo, protocol, expected=np.full(8, 7))
    with pytest.raises(CheckFailed, match="wrong predictions"):
        check(server, wrong)


@pytest.mark.parametrize(
    ("protocol", "reason"), [("rest-json", "HTTP 404"), ("grpc-typed", "gRPC NOT_FOUND")]
)
def test_errors_fail(server, repo, protocol, reason):
    with pytest.raises(CheckFailed, match=reason):
        check(server, iris_payload(repo, protocol, model="nosuch", expected=np.zeros(8)))


def test_stage_split_from_statistics(server, repo):
    before = serverstats.fetch(server.http_base, "iris")
    for _ in range(3):
        check(server, iris_payload(repo, "rest-json"))
    after = serverstats.fetch(server.http_base, "iris")
    split = serverstats.stage_split(before, after)
    assert set(split) == {"queue", "decode", "predict", "encode"}
    assert split["predict"] > 0 and split["decode"] > 0
    assert serverstats.fetch(server.http_base, "nosuch") is None
    assert serverstats.stage_split(None, after) is None


@pytest.mark.parametrize("protocol", ["rest-json", "grpc-raw"])
def test_builtin_generator_counts_ok_and_failed_requests(server, repo, protocol, tmp_path):
    good = builtin.run(Job(server.target, iris_payload(repo, protocol), 2, 0.5, tmp_path))
    assert good.requests > 0 and good.errors == 0 and good.generator_cpu > 0
    bad_payload = iris_payload(repo, protocol, model="nosuch", expected=np.zeros(8))
    bad = builtin.run(Job(server.target, bad_payload, 2, 0.5, tmp_path))
    assert bad.requests > 0 and bad.errors == bad.requests
    assert bad.error_sample in ("HTTP 404", "NOT_FOUND: unknown model")
