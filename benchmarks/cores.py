"""``python -m benchmarks cores``: where a request's CPU goes, and what more cores would give.

Issue 44's first target asks for a model of throughput against cores from the measured
per-request CPU of the frontend and the workers. This measures it: iris batch 1 over REST
(wrk) and raw gRPC (h2load), 64 connections, each server in turn, and splits the CPU of
the server's process tree by role from the tree's shape (the server process is the
frontend; its children are worker templates; their children are the workers), and the
generator's own CPU apart.

The model, per request: ``f`` µs of frontend CPU, ``w`` µs in the workers and templates,
``g`` µs in the generator when it shares the machine. One frontend is one event loop: at
most ``1e6 / f`` requests a second whatever the cores. The cores bound the whole:
``cores * 1e6 / (f + w)`` with the clients elsewhere, ``cores * 1e6 / (f + w + g)`` with
them on the same machine. The prediction for this machine is set beside the measured
rate, so the model is checked on the run that fed it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, replace
from typing import Any

from benchmarks import loadgen
from benchmarks.check import check
from benchmarks.loadgen import Generator, Job
from benchmarks.process_stats import tree_cpu
from benchmarks.runner import Config, build_payloads, start_servers
from benchmarks.scenarios import Scenario

SCENARIOS = (Scenario("iris", 1, "rest-json", 64), Scenario("iris", 1, "grpc-raw", 64))
PROJECTED_CORES = (2, 4, 8, 16, 32)


def role_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's tree by role: the process ``pid`` (frontend),
    and its descendants (templates and the workers they fork); zeros once it is gone."""
    usage = tree_cpu(pid)
    frontend = usage.pop(pid, 0.0)
    return {"frontend": frontend, "workers": sum(usage.values())}


@dataclass(frozen=True)
class Split:
    """Microseconds of CPU a request: frontend, workers (with templates), generator."""

    frontend: float
    workers: float
    generator: float

    def rate(self, cores: float, frontends: int = 1, with_generator: bool = False) -> float:
        """Requests a second the model predicts on ``cores`` with ``frontends`` frontend
        processes (each one event loop: at most one core)."""
        per_request = self.frontend + self.workers + (self.generator if with_generator else 0)
        return min(frontends * 1e6 / self.frontend, cores * 1e6 / per_request)

    def frontends_needed(self, cores: float) -> int:
        """Frontends for the cores to bound the rate rather than one frontend's loop."""
        return max(1, math.ceil(cores * self.frontend / (self.frontend + self.workers)))


def measure(job: Job, pid: int, generate: Generator) -> dict[str, Any]:
    """One closed-loop run: the rate and each role's µs of CPU a request."""
    before = role_cpu(pid)
    result = generate(job)
    after = role_cpu(pid)
    done = max(1, result.ok)
    cpu = {role: after[role] - before[role] for role in before}
    return {
        "rps": result.rps,
        "errors": result.errors,
        "p99_ms": result.latency_us.get("p99", math.nan) / 1e3,
        **{f"{role}_us": 1e6 * seconds / done for role, seconds in cpu.items()},
        "generator_us": 1e6 * result.generator_cpu / done,
    }


def summarize(rows: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """Medians of one server's runs of one scenario, the split and its predictions."""
    m = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    split = Split(m["frontend_us"], m["workers_us"], m["generator_us"])
    return {
        **m,
        "predicted_here": split.rate(cores, with_generator=True),
        "projection": {
            str(n): {
                "one_frontend": split.rate(n),
                "frontends": split.frontends_needed(n),
                "enough_frontends": split.rate(n, split.frontends_needed(n)),
            }
            for n in PROJECTED_CORES
        },
    }


def run(config: Config, say: Any = print) -> dict[str, Any]:
    """Each scenario on each server, servers in turn, ``config.repetitions`` times."""
    from benchmarks.models import build_repository

    build_repository(config.repo, ["iris"])
    payloads = build_payloads(config.repo, SCENARIOS)
    workdir = config.workdir / "gen"
    workdir.mkdir(parents=True, exist_ok=True)
    servers, failed = start_servers(config, say, lambda n: None)
    if failed:
        say(f"not started: {[cell.reason for cell in failed]}")
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for scenario in SCENARIOS:
            payload = payloads[scenario.payload_key]
            _, generate = loadgen.pick(payload.transport, "auto")
            jobs = []
            for server in servers:
                warm = Job(server.target, payload, scenario.concurrency, config.warmup,
                           workdir, check(server, payload))  # fmt: skip
                generate(warm)
                job = replace(warm, duration=config.duration)
                jobs.append((server, job))
            for repetition in range(config.repetitions):
                for server, job in jobs:
                    say(f"{server.spec.name} {scenario.name}: repetition {repetition + 1}")
                    assert server.pid
                    cell = rows.setdefault(server.spec.name, {}).setdefault(scenario.name, [])
                    cell.append(measure(job, server.pid, generate))
    finally:
        for server in servers:
            server.stop()
    cores = os.cpu_count() or 1
    return {
        "cores": cores,
        "load_average_end": os.getloadavg(),
        "runs": rows,
        "summary": {
            name: {scenario: summarize(runs, cores) for scenario, runs in cells.items()}
            for name, cells in rows.items()
        },
    }


def markdown(result: dict[str, Any]) -> str:
    """The measured split against the prediction here, and the projection to more cores."""
    lines = [
        "| server | scenario | req/s | predicted here | frontend µs | workers µs "
        "| generator µs | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    projection = [
        "| server | scenario | cores | one frontend req/s | frontends | with them req/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, cells in result["summary"].items():
        for scenario, s in cells.items():
            lines.append(
                f"| {name} | {scenario} | {s['rps']:,.0f} | {s['predicted_here']:,.0f} | "
                f"{s['frontend_us']:.1f} | {s['workers_us']:.1f} | {s['generator_us']:.1f} | "
                f"{s['p99_ms']:.1f} |"
            )
            for cores, p in s["projection"].items():
                projection.append(
                    f"| {name} | {scenario} | {cores} | {p['one_frontend']:,.0f} | "
                    f"{p['frontends']} | {p['enough_frontends']:,.0f} |"
                )
    return "\n".join(lines) + "\n\n" + "\n".join(projection) + "\n"


def main(config: Config) -> int:
    """Run, print the tables, write results.json and results.md."""
    result = run(config, say=lambda text: print(text, file=sys.stderr))
    table = markdown(result)
    print(table)
    config.workdir.mkdir(parents=True, exist_ok=True)
    (config.workdir / "results.json").write_text(json.dumps(result, indent=1))
    (config.workdir / "results.md").write_text(table)
    return 0
