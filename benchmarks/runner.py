"""One benchmark run: build the repository and payloads, start the servers, check every
scenario on every server, then measure them interleaved (A B A B ...) and collect cells.

Servers run side by side for the whole run (each on its own free ports), so a scenario's
repetitions alternate between them and slow drifts of a noisy machine hit all alike.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks import kserve_env, loadgen, mlserver_env, native_env, native_peers, serverstats
from benchmarks.check import CheckFailed, check
from benchmarks.loadgen import perf_analyzer
from benchmarks.loadgen.base import Job
from benchmarks.models import build_repository, features, load_predictor
from benchmarks.otlp_sink import otlp_sink
from benchmarks.payloads import Payload, batch_rows, build_payload
from benchmarks.ports import ServerPorts, plan_from
from benchmarks.process_stats import PeakRss, cpu_between, tree_cpu
from benchmarks.results import FAILED, NOT_APPLICABLE, Cell, Measurement, Run
from benchmarks.scenarios import Scenario
from benchmarks.servers import INFERPOOL_MODULE, RunningServer, ServerSpec, attach, start

Progress = Callable[[str], None]


@dataclass
class Config:
    """What to run; ``target`` (REST URL) replaces managed servers when given."""

    scenarios: tuple[Scenario, ...]
    servers: tuple[str, ...]
    baseline: str | None
    duration: float
    warmup: float
    repetitions: int
    workdir: Path
    repo: Path
    generator: str = "auto"  # auto | external | builtin | perf_analyzer
    target: str | None = None
    grpc: str | None = None
    target_pid: int | None = None  # lets RSS and CPU be measured for a target too
    inferpool_module: str = INFERPOOL_MODULE
    base_checkout: Path | None = None  # where inferpool-wN-base servers run from
    interleave: bool = False  # the scenarios' repetitions in turn, not one after the other
    port_base: int | None = None  # servers' ports from here upwards; None: free ports
    note: str = ""  # what the run changed of its profile, and why (kept in its results)

    def port_plan(self) -> dict[str, ServerPorts]:
        """Each managed server's ports under ``port_base`` (empty without one)."""
        if self.port_base is None or self.target:
            return {}
        return plan_from(self.port_base, self.servers)

    def models(self) -> list[str]:
        return sorted({s.model for s in self.scenarios})

    def estimate_seconds(self) -> float:
        per_server = len(self.scenarios) * (self.warmup + self.repetitions * self.duration)
        return per_server * max(1, len(self.servers))


def build_payloads(repo: Path, scenarios: tuple[Scenario, ...]) -> dict[tuple, Payload]:
    """Every payload the scenarios need, with predictions from the saved artefacts."""
    payloads = {}
    predictors = {}
    for scenario in scenarios:
        key = scenario.payload_key
        if key in payloads:
            continue
        if scenario.model not in predictors:
            predictors[scenario.model] = load_predictor(repo, scenario.model)
        x = batch_rows(features(scenario.model), scenario.batch)
        expected = predictors[scenario.model](x)
        payloads[key] = build_payload(
            scenario.model, scenario.batch, scenario.protocol, x, expected
        )
    return payloads


def start_servers(
    config: Config, progress: Progress, advance: Callable[[int], None]
) -> tuple[list[RunningServer], list[Cell]]:
    """Start (or attach to) the servers; a server that fails makes failed cells, not a crash."""
    if config.target:
        return [attach(config.target, config.grpc, config.models(), config.target_pid)], []
    specs = [ServerSpec.parse(name) for name in config.servers]
    mlserver = None
    if any(spec.kind == "mlserver" for spec in specs):
        progress("checking MLServer's virtualenv")
        mlserver = mlserver_env.ensure()
    kserve = None
    if any(spec.kind == "kserve" for spec in specs):
        progress("checking KServe's virtualenv")
        kserve = kserve_env.ensure()
    uninstallable = native_installs(specs, progress)
    # Ports are all chosen here, before the threads: the free-port walk is not thread-safe.
    plan = config.port_plan() or {spec.name: ServerPorts.free() for spec in specs}
    if any(spec.tracing for spec in specs):
        otlp_sink()  # the one sink, made before two threads could each make one

    def launch(spec: ServerSpec) -> RunningServer:
        if spec.kind in uninstallable:
            raise RuntimeError(uninstallable[spec.kind])
        return start(
            spec,
            config.repo,
            config.models(),
            config.workdir / "servers",
            mlserver,
            config.inferpool_module,
            base_checkout=config.base_checkout,
            kserve=kserve,
            # perf_analyzer reads every model version as a number.
            numbered=config.generator == "perf_analyzer",
            ports=plan[spec.name],
        )

    # Side by side: each mostly waits for its imports and models, and the quick profile's
    # two minutes cannot spare two start-ups one after the other.
    progress(f"starting {', '.join(spec.name for spec in specs)}")
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = [(spec, pool.submit(launch, spec)) for spec in specs]
    running = [f.result() for _, f in futures if f.exception() is None]
    failed = []
    for spec, future in futures:
        exc = future.exception()
        if exc is None:
            continue
        if not isinstance(exc, RuntimeError | TimeoutError | OSError | ValueError):
            for server in running:  # a bug, not a server that would not start: stop all
                server.stop()
            raise exc
        failed += [Cell(s.name, spec.name, FAILED, f"start: {exc}") for s in config.scenarios]
        advance(len(config.scenarios) * config.repetitions)
    return running, failed


def native_installs(specs: list[ServerSpec], progress: Progress) -> dict[str, str]:
    """Install the native peers' virtualenvs the run needs; kind -> why it could not be (its
    servers' cells fail with that reason, the other servers run)."""
    why = {}
    for kind in dict.fromkeys(spec.kind for spec in specs if spec.kind in native_peers.PEERS):
        progress(f"checking {kind}'s virtualenv")
        try:
            native_env.ensure(kind)  # servers.command finds its python there
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            why[kind] = f"install: {exc}"
    return why


def measure(
    server: RunningServer, model: str, generate: loadgen.Generator, job: Job
) -> Measurement:
    """One repetition: run the load job while sampling the server's RSS and CPU."""
    stats_before = serverstats.fetch(server.http_base, model)
    cpu_before = tree_cpu(server.pid) if server.pid else {}
    with PeakRss(server.pid) as rss:
        load = generate(job)
    cpu_after = tree_cpu(server.pid) if server.pid else {}
    cpu = cpu_between(cpu_before, cpu_after) if server.pid else math.nan
    own = server.pid in cpu_after and server.pid in cpu_before
    frontend = cpu_after[server.pid] - cpu_before[server.pid] if own else math.nan
    stats_after = serverstats.fetch(server.http_base, model)
    peak = rss.peak if server.pid else math.nan
    stages = serverstats.stage_split(stats_before, stats_after)
    return Measurement(load, cpu, peak, stages, frontend_cpu=frontend)


def unsupported(server: RunningServer, scenario: Scenario, tool: str) -> str:
    """Why the scenario cannot be measured on the server with this generator ("" if it can)."""
    if not server.supports(scenario.protocol):
        return f"{server.spec.name} lacks {scenario.protocol}"
    if tool == "perf_analyzer":
        if scenario.protocol not in perf_analyzer.PROTOCOLS:
            return perf_analyzer.PROTOCOL_REASON
        return perf_analyzer.config_missing(server.http_base, scenario.model)
    return ""


@dataclass
class Prepared:
    """A scenario checked and warmed up on every server: its cells, and the load jobs of the
    servers it can be measured on."""

    scenario: Scenario
    cells: list[Cell]
    ready: list[tuple[RunningServer, Cell, Job]]
    generate: loadgen.Generator


def prepare_scenario(
    scenario: Scenario,
    servers: list[RunningServer],
    payload: Payload,
    config: Config,
    advance: Callable[[int], None],
    progress: Progress = lambda text: None,
) -> Prepared:
    """Check the scenario on each server and warm it up."""
    tool, generate = loadgen.pick(payload.transport, config.generator)
    workdir = config.workdir / "gen"
    workdir.mkdir(parents=True, exist_ok=True)
    cells, ready = [], []
    for server in servers:
        cell = Cell(scenario.name, server.spec.name, generator=tool)
        cells.append(cell)
        lacks = unsupported(server, scenario, tool)
        if lacks:
            cell.status, cell.reason = NOT_APPLICABLE, lacks
        elif payload.transport == "grpc" and server.grpc_error:
            cell.status, cell.reason = FAILED, server.grpc_error
        else:
            try:
                progress(f"{scenario.name} on {server.spec.name}: check, warm-up")
                native = native_peers.adapt(server.spec.kind, payload)  # same rows, its JSON
                response_bytes = check(server, native)
                job = Job(
                    server.target,
                    native,
                    scenario.concurrency,
                    config.duration,
                    workdir,
                    response_bytes,
                )
                if config.warmup > 0:
                    generate(replace(job, duration=config.warmup))
                ready.append((server, cell, job))
                continue
            except (CheckFailed, RuntimeError, ValueError, OSError) as exc:
                cell.status, cell.reason = FAILED, f"check: {exc}"
        advance(config.repetitions)  # nothing to measure on this server
    return Prepared(scenario, cells, ready, generate)


def measure_round(
    prepared: Prepared,
    advance: Callable[[int], None],
    progress: Progress = lambda text: None,
    repetition: str = "",
) -> None:
    """One repetition (``repetition``: "2/3") of the scenario on each of its servers, in
    turn (A B A B ...)."""
    for server, cell, job in prepared.ready:
        if cell.status == FAILED:
            advance(1)
            continue
        progress(f"{prepared.scenario.name} on {server.spec.name}: repetition {repetition}")
        try:
            cell.measurements.append(
                measure(server, prepared.scenario.model, prepared.generate, job)
            )
        except (RuntimeError, ValueError, OSError) as exc:
            cell.status, cell.reason = FAILED, f"run: {exc}"
        advance(1)


def measure_all(
    config: Config,
    servers: list[RunningServer],
    payloads: dict[tuple, Payload],
    progress: Progress,
    advance: Callable[[int], None],
) -> list[Cell]:
    """Every scenario's repetitions: scenario after scenario, or with ``interleave`` the
    scenarios' repetitions in turn too, so that a ratio between two scenarios (REST JSON
    against raw gRPC) is not a ratio between two moments of a host whose speed moves."""
    # Interleaved, all the scenarios are one group; else each is its own, warmed up just
    # before its repetitions.
    groups = [config.scenarios] if config.interleave else [(s,) for s in config.scenarios]
    cells: list[Cell] = []
    for group in groups:
        prepared = []
        for scenario in group:
            payload = payloads[scenario.payload_key]
            prepared.append(prepare_scenario(scenario, servers, payload, config, advance, progress))
        for repetition in range(config.repetitions):
            for item in prepared:
                measure_round(item, advance, progress, f"{repetition + 1}/{config.repetitions}")
        cells.extend(cell for item in prepared for cell in item.cells)
    return cells


def run(config: Config, progress: Progress, advance: Callable[[int], None]) -> Run:
    """The whole benchmark; servers are stopped whatever happens."""
    settings = {
        "scenarios": [s.name for s in config.scenarios],
        "servers": list(config.servers) if not config.target else ["target"],
        "baseline": config.baseline,
        "duration": config.duration,
        "warmup": config.warmup,
        "repetitions": config.repetitions,
        "generator": config.generator,
        "interleave": config.interleave,
        "port_base": config.port_base,
        "note": config.note,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "missing_tools": loadgen.missing_tools(),
        "load_average_start": os.getloadavg(),
        "commit": commit(),
    }
    result = Run(settings)
    progress("building the model repository")
    build_repository(config.repo, config.models())
    payloads = build_payloads(config.repo, config.scenarios)
    servers, failed = start_servers(config, progress, advance)
    result.cells.extend(failed)
    try:
        for server in servers:
            result.servers[server.spec.name] = {
                "idle_rss_mib": server.idle_rss / 2**20,
                "command": server.process.args if server.process else config.target,
            }
        result.cells.extend(measure_all(config, servers, payloads, progress, advance))
    finally:
        for server in servers:
            server.stop()
    # Scenario by scenario, servers in the order asked (cells of a server that never
    # started were made first).
    rank = {name: i for i, name in enumerate([*settings["scenarios"], *settings["servers"]])}
    result.cells.sort(key=lambda cell: (rank[cell.scenario], rank.get(cell.server, 0)))
    # A busy machine explains numbers far from the usual: keep its load with the results.
    settings["load_average_end"] = os.getloadavg()
    return result


def commit() -> str:
    """The checked-out commit of the harness's repository, or "" outside git."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else ""
