"""Scenarios (model x batch x protocol x concurrency) and the run profiles that pick them.

A profile fixes which scenarios run, against which servers, for how long and how often.
``quick`` must stay under two minutes end to end; ``full`` is the matrix for RESULTS.md.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass

from benchmarks.models import ZOO
from benchmarks.payloads import PROTOCOLS

BATCHES = (1, 256)
CONCURRENCIES = (1, 8, 64)


@dataclass(frozen=True)
class Scenario:
    """One measured cell: a model, a batch size, a protocol and a number of connections."""

    model: str
    batch: int
    protocol: str
    concurrency: int

    @property
    def name(self) -> str:
        return f"{self.model}/b{self.batch}/{self.protocol}/c{self.concurrency}"

    @property
    def payload_key(self) -> tuple[str, int, str]:
        return (self.model, self.batch, self.protocol)


@dataclass(frozen=True)
class Profile:
    """What a run covers: scenarios, servers (first is the default baseline), timings.
    ``peerless`` are the servers run instead when the peer among ``servers`` (MLServer)
    is not installed and installing it would not fit the profile's time."""

    name: str
    scenarios: tuple[Scenario, ...]
    servers: tuple[str, ...]
    baseline: str
    duration: float
    warmup: float
    repetitions: int
    peerless: tuple[str, ...] = ()


def full_matrix() -> tuple[Scenario, ...]:
    """Every model of the zoo x batch x protocol x concurrency."""
    cells = itertools.product(ZOO, BATCHES, PROTOCOLS, CONCURRENCIES)
    return tuple(Scenario(*cell) for cell in cells)


# Quick: the four budget rows of DESIGN.md §7 that catch most regressions, and the
# LightGBM batch as Python clients write its JSON (ndarray.tolist(), 17 digits a number:
# the JSON scanner's long decimals, issue 44).
QUICK_SCENARIOS = (
    Scenario("iris", 1, "rest-json", 64),
    Scenario("iris", 1, "grpc-raw", 64),
    Scenario("lightgbm", 256, "rest-json", 8),
    Scenario("lightgbm", 256, "rest-json17", 8),
    Scenario("lightgbm", 256, "grpc-raw", 8),
)

# A local client's large input through Triton's system shared memory, against the same
# input in raw_input_contents, interleaved on one server (``benchmarks/shm_payload.py``).
SHM_SCENARIOS = (
    Scenario("lightgbm", 256, "grpc-raw", 8),
    Scenario("lightgbm", 256, "grpc-shm", 8),
    Scenario("lightgbm", 4096, "grpc-raw", 8),
    Scenario("lightgbm", 4096, "grpc-shm", 8),
)


FULL_V2_SERVERS = ("mlserver-w0", "mlserver-w2", "kserve-w1", "inferpool-w0", "inferpool-w1",
                   "inferpool-w2")  # fmt: skip


def runtime_profile(
    model: str, servers: tuple[str, ...], peerless: tuple[str, ...] = ()
) -> Profile:
    """A runtime's profile: batch 1 at 64 connections and batch 256 at 8, each over REST
    JSON and raw gRPC, as the quick profile measures iris and LightGBM; the first server
    is the baseline."""
    cells = [(1, 64), (256, 8)]
    protocols = ("rest-json", "grpc-raw")
    scenarios = tuple(Scenario(model, b, p, c) for b, c in cells for p in protocols)
    return Profile(model, scenarios, servers, servers[0], 3.0, 1.0, 3, peerless)


PROFILES: dict[str, Profile] = {
    "quick": Profile(
        name="quick",
        scenarios=QUICK_SCENARIOS,
        servers=("mlserver-w0", "inferpool-w2"),
        baseline="mlserver-w0",
        # 5 scenarios x 2 servers x (0.5 + 2 x 2) s = 45 s of load; with the models'
        # training and the servers' start-up, about a minute on 2 busy cores.
        duration=2.0,
        warmup=0.5,
        repetitions=2,
        # Installing MLServer takes minutes: without it, inferpool's in-process predict
        # (--workers 0) is the baseline of its worker processes (--workers 2).
        peerless=("inferpool-w0", "inferpool-w2"),
    ),
    "shm": Profile(
        name="shm",
        scenarios=SHM_SCENARIOS,
        servers=("inferpool-w2",),
        baseline="inferpool-w2",
        duration=3.0,
        warmup=0.5,
        repetitions=3,
    ),
    # CatBoost's oblivious trees (the tree kernel) against MLServer's catboost runtime
    # (mlserver-catboost in its virtualenv), inferpool in-process beside it.
    "catboost": runtime_profile(
        "catboost",
        ("mlserver-w0", "inferpool-w0", "inferpool-w2"),
        peerless=("inferpool-w0", "inferpool-w2"),
    ),
    # LightGBM converted to ONNX, served by the onnx runtime; MLServer has no ONNX runtime:
    # `python -m benchmarks inprocess` times ONNX Runtime called directly instead.
    "onnx": runtime_profile("onnx", ("inferpool-w0", "inferpool-w2")),
    "full": Profile(
        name="full",
        scenarios=full_matrix(),
        # BentoML, LitServe and Ray Serve, what a Python team would try before a V2 server,
        # each with a worker (process or replica) per core: JSON scenarios only (n/a others).
        servers=(*FULL_V2_SERVERS, "bentoml", "litserve", "rayserve"),
        baseline="mlserver-w0",
        duration=5.0,
        warmup=1.0,
        repetitions=3,
    ),
}


def select(scenarios: tuple[Scenario, ...], patterns: list[str] | None) -> tuple[Scenario, ...]:
    """Scenarios whose name matches any glob (e.g. ``iris/*/grpc-*/*``); all when none given."""
    if not patterns:
        return scenarios
    chosen = tuple(s for s in scenarios if any(fnmatch.fnmatch(s.name, p) for p in patterns))
    if not chosen:
        raise ValueError(f"no scenario matches {patterns}; see `python -m benchmarks list`")
    return chosen
