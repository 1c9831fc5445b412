"""The harness's measurement order: servers in turn within a scenario (A B A B ...) and,
with ``--interleave``, the scenarios' repetitions in turn as well."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import loadgen, runner
from benchmarks.__main__ import parser
from benchmarks.runner import Config, measure_all
from benchmarks.scenarios import Scenario


def fake_servers(names: list[str]) -> list[Any]:
    return [
        SimpleNamespace(
            spec=SimpleNamespace(name=name, kind="inferpool"),
            target=f"http://{name}",
            grpc_error="",
            supports=lambda protocol: True,
        )
        for name in names
    ]


@pytest.mark.parametrize("interleave", [False, True])
def test_measurement_order(interleave, tmp_path, monkeypatch):
    order: list[tuple[str, str]] = []
    monkeypatch.setattr(runner, "check", lambda server, payload: 10)
    monkeypatch.setattr(loadgen, "pick", lambda transport, generator: ("fake", lambda job: None))

    def measure(server: Any, model: str, generate: Any, job: Any) -> str:
        order.append((job.payload.protocol, server.spec.name))
        return "measured"

    monkeypatch.setattr(runner, "measure", measure)
    scenarios = (
        Scenario("lightgbm", 256, "rest-json", 8),
        Scenario("lightgbm", 256, "grpc-raw", 8),
    )
    payloads = {
        s.payload_key: SimpleNamespace(transport="rest", protocol=s.protocol) for s in scenarios
    }
    config = Config(
        scenarios=scenarios,
        servers=("a", "b"),
        baseline="a",
        duration=1,
        warmup=0,
        repetitions=2,
        workdir=tmp_path,
        repo=Path(tmp_path),
        interleave=interleave,
    )
    cells = measure_all(
        config, fake_servers(["a", "b"]), payloads, lambda text: None, lambda n: None
    )
    rest, grpc = ("rest-json", "grpc-raw")
    if interleave:
        assert order == [(rest, "a"), (rest, "b"), (grpc, "a"), (grpc, "b")] * 2
    else:
        assert order == [(rest, "a"), (rest, "b")] * 2 + [(grpc, "a"), (grpc, "b")] * 2
    assert [(c.scenario, c.server, len(c.measurements)) for c in cells] == [
        (scenarios[0].name, "a", 2),
        (scenarios[0].name, "b", 2),
        (scenarios[1].name, "a", 2),
        (scenarios[1].name, "b", 2),
    ]


def test_the_command_line_sets_it():
    assert parser().parse_args(["run", "--interleave"]).interleave is True
    assert parser().parse_args(["run"]).interleave is False
