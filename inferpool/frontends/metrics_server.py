"""Server, worker and process metrics, read at scrape time (docs/operate/metrics.md).

It owns the ``ServerCollector`` (registered by ``build_metrics_app`` next to the per-model
one) and the count of requests and connections a limit refused (``count_rejected``).
Nothing here runs per request: a refusal branch adds one to a counter, and everything
else is read when Prometheus scrapes:

- open connections per frontend, from the server process's own TCP sockets on each
  listening port (psutil), so Uvicorn, Hypercorn, our HTTP/2 layer and grpcio are all
  seen the same way;
- refusals by the limit's setting name (``max_body_bytes``, ``max_header_bytes``,
  ``max_concurrent_streams``, ``max_connections``, ...) or ``overload`` (503);
- GOAWAY frames our HTTP/2 layer sent, by error code (``transport/http2.py`` counts them);
- the worker pool's supervision: restarts per worker slot and of the template, recycles
  by reason (``engine/pool/recycling.py``), seconds
  since each worker last sent anything, each worker's RSS and PSS (``smaps_rollup``);
  none of it with ``--workers 0``, which has no workers;
- CPU seconds and RSS of every process of the tree: ``server``, ``template``, ``worker-N``;
- build information.
"""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferpool.engine.client import EngineClient
from inferpool.engine.pool.pool import PoolClient
from inferpool.engine.pool.supervisor import Supervisor
from inferpool.transport import http2, http2_streams
from inferpool.transport.http2_wire import ERROR_CODE_NAMES, NO_ERROR

# Requests and connections refused by a limit, by (frontend, reason): incremented on the
# refusal branches only, read at scrape time.
REJECTED: Counter[tuple[str, str]] = Counter()
OVERLOAD = "overload"

_T = TypeVar("_T")

# Socket states that are no open connection: the listener, and a connection whose client
# has closed its side (Hypercorn keeps those until its idle timeout) or that both closed.
_NOT_OPEN = frozenset(
    (psutil.CONN_LISTEN, psutil.CONN_CLOSE_WAIT, psutil.CONN_LAST_ACK, psutil.CONN_CLOSE)
)


def count_rejected(frontend: str, reason: str) -> None:
    """One request (or connection) of ``frontend`` refused: ``reason`` is the limit's
    setting name, or ``overload`` for a 503 of a full queue."""
    REJECTED[frontend, reason] += 1


def _package_version() -> str:
    try:
        return version("inferpool")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def tcp_connections(process: psutil.Process) -> list[Any]:
    """The TCP sockets of ``process``: ``net_connections`` (psutil 6), else its older name
    ``connections`` (psutil 5.9.x, which kserve and other packages still require)."""
    read = getattr(process, "net_connections", None) or process.connections
    return list(read(kind="tcp"))


class ServerCollector(Collector):
    """Connections, refusals, GOAWAYs, workers, processes and build info of this server."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        settings = client.settings
        # The frontend behind each listening port (its connections are counted per port).
        self.ports = {settings.http_port: "rest"}
        if settings.grpc_port > 0:
            self.ports[settings.grpc_port] = "grpc"
        if settings.metrics_port > 0:
            self.ports[settings.metrics_port] = "metrics"
        self.http2_layer = settings.grpc_port > 0 and settings.grpc_implementation == "builtin"
        self.build = (
            _package_version(),
            platform.python_version(),
            platform.python_implementation(),
        )
        self._processes: dict[int, psutil.Process] = {}

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "inferpool_build_info",
            "Always 1: the inferpool version, Python version and implementation",
            labels=["version", "python", "implementation"],
        )
        info.add_metric(list(self.build), 1.0)
        yield info
        yield self._open_connections()
        yield from self._refusals()
        pool = self.client.worker_pool()
        if pool is not None:
            yield from self._workers(pool)
        yield from self._process_tree(pool)

    def _open_connections(self) -> Metric:
        family = GaugeMetricFamily(
            "inferpool_open_connections",
            "Client connections open on each frontend's port (the metrics port: 'metrics')",
            labels=["frontend"],
        )
        counts = dict.fromkeys(self.ports.values(), 0)
        for connection in tcp_connections(psutil.Process()):
            frontend = self.ports.get(connection.laddr.port) if connection.laddr else None
            if frontend is not None and connection.status not in _NOT_OPEN:
                counts[frontend] += 1
        for frontend, count in counts.items():
            family.add_metric([frontend], count)
        return family

    def _refusals(self) -> Iterator[Metric]:
        rejected = CounterMetricFamily(
            "inferpool_rejected_requests",
            "Requests and connections refused by a limit (its setting name) or by overload",
            labels=["frontend", "reason"],
        )
        counts = Counter({(frontend, OVERLOAD): 0 for frontend in self.ports.values()})
        counts.pop(("metrics", OVERLOAD), None)  # the metrics port serves no model
        counts.update(REJECTED)
        # Our HTTP/2 layer serves gRPC only (frontends/grpc/h2.py): its refusals are gRPC's.
        for limit, count in http2_streams.REFUSED.items():
            counts["grpc", limit] += count
        for (frontend, reason), count in sorted(counts.items()):
            rejected.add_metric([frontend, reason], count)
        yield rejected
        goaways = CounterMetricFamily(
            "inferpool_http2_goaways_sent",
            "GOAWAY frames sent by inferpool's own HTTP/2 layer (the builtin gRPC server), "
            "by error code",
            labels=["frontend", "code"],
        )
        sent = Counter(http2.GOAWAYS_SENT)
        if self.http2_layer:
            sent[NO_ERROR] += 0  # present from the start
        for code, count in sorted(sent.items()):
            goaways.add_metric(["grpc", ERROR_CODE_NAMES.get(code, f"0x{code:x}")], count)
        yield goaways

    @staticmethod
    def _groups(supervisor: Supervisor) -> Metric:
        """Each worker group's slot count, labelled with what it offers (capabilities)."""
        groups = GaugeMetricFamily(
            "inferpool_worker_group_workers",
            "Worker slots of each worker group, with its environment (empty: the server's "
            "own interpreter), Python version, runtime libraries and tags",
            labels=["group", "environment", "python", "libraries", "tags"],
        )
        for group in supervisor.roster.groups:
            capabilities = group.capabilities
            groups.add_metric(
                [
                    group.name,
                    group.environment.source if group.environment is not None else "",
                    capabilities.python,
                    capabilities.libraries(),
                    ",".join(sorted(capabilities.tags)),
                ],
                len(group.slots),
            )
        return groups

    @staticmethod
    def _stalls(pool: PoolClient) -> Iterator[Metric]:
        """Stalled workers, standby workers and timeouts (``engine/pool/stalls.py``)."""
        stalls, supervisor = pool.stalls, pool.supervisor
        yield CounterMetricFamily(
            "inferpool_worker_stalls",
            "Times a worker ran one call past --stall-threshold (it took no new requests "
            "until the call ended)",
            value=stalls.stalls,
        )
        yield CounterMetricFamily(
            "inferpool_stalled_requests_moved",
            "Requests queued behind a stalled worker's call moved to another worker",
            value=stalls.moved,
        )
        yield CounterMetricFamily(
            "inferpool_standby_workers_started",
            "Standby workers forked while workers were stalled",
            value=stalls.standby_started,
        )
        yield GaugeMetricFamily(
            "inferpool_standby_workers",
            "Standby workers running now (beside --workers)",
            value=len(supervisor.standby),
        )
        yield CounterMetricFamily(
            "inferpool_worker_timeout_kills",
            "Workers killed because a call ran past its model's timeout (answered 504)",
            value=supervisor.timeout_kills,
        )

    def _workers(self, pool: PoolClient) -> Iterator[Metric]:
        supervisor = pool.supervisor
        labels = ["worker"]
        restarts = CounterMetricFamily(
            "inferpool_worker_restarts", "Times the worker in this slot was replaced", labels=labels
        )
        for slot, count in enumerate(supervisor.restarts_by_slot):
            restarts.add_metric([str(slot)], count)
        yield restarts
        recycles = CounterMetricFamily(
            "inferpool_worker_recycles",
            "Workers drained and replaced by a fresh one, by reason: max_requests, max_rss, "
            "memory_limit",
            labels=["reason"],
        )
        for reason, count in pool.recycler.counts.items():
            recycles.add_metric([reason], count)
        yield recycles
        yield self._groups(supervisor)
        yield from self._stalls(pool)
        yield CounterMetricFamily(
            "inferpool_template_restarts",
            "Times the worker template process was restarted",
            value=supervisor.template_restarts,
        )
        age = GaugeMetricFamily(
            "inferpool_worker_heartbeat_age_seconds",
            "Seconds since the worker last sent anything (a reply, a heartbeat)",
            labels=labels,
        )
        rss = GaugeMetricFamily(
            "inferpool_worker_resident_memory_bytes", "Resident memory of the worker", labels=labels
        )
        pss = GaugeMetricFamily(
            "inferpool_worker_proportional_memory_bytes",
            "Proportional set size of the worker: pages shared with the template and the other "
            "workers counted in shares",
            labels=labels,
        )
        now = time.monotonic()
        for worker in supervisor.alive():
            if not worker.pid:
                continue  # not started yet
            worker_label = [str(worker.slot)]
            age.add_metric(worker_label, max(0.0, now - worker.last_seen))
            memory = self._read(worker.pid, lambda p: p.memory_full_info())
            if memory is not None:
                rss.add_metric(worker_label, memory.rss)
                pss.add_metric(worker_label, memory.pss)
        yield from (age, rss, pss)

    def _process_tree(self, pool: PoolClient | None) -> Iterator[Metric]:
        labels = ["process"]
        cpu = CounterMetricFamily(
            "inferpool_process_cpu_seconds",
            "User and system CPU time of each process of the server's tree",
            labels=labels,
        )
        rss = GaugeMetricFamily(
            "inferpool_process_resident_memory_bytes",
            "Resident memory of each process of the server's tree",
            labels=labels,
        )
        seen = set()
        for name, pid in self._tree(pool):
            seen.add(pid)
            read = self._read(pid, lambda p: (p.cpu_times(), p.memory_info()))
            if read is None:
                continue
            times, memory = read
            cpu.add_metric([name], times.user + times.system)
            rss.add_metric([name], memory.rss)
        for gone in self._processes.keys() - seen:
            del self._processes[gone]
        yield from (cpu, rss)

    @staticmethod
    def _tree(pool: PoolClient | None) -> Iterable[tuple[str, int]]:
        yield "server", os.getpid()
        if pool is None:
            return
        template = pool.supervisor.template
        if template is not None:
            yield "template", template.process.pid
        for worker in pool.supervisor.alive():
            if worker.pid:
                yield f"worker-{worker.slot}", worker.pid
        standby = sorted(worker.pid for worker in pool.supervisor.standby if worker.pid)
        for number, pid in enumerate(standby):
            yield f"standby-{number}", pid

    def _read(self, pid: int, read: Callable[[psutil.Process], _T]) -> _T | None:
        """``read`` of the process ``pid`` (kept between scrapes), or None if it is gone."""
        try:
            process = self._processes.get(pid)
            if process is None:
                process = self._processes[pid] = psutil.Process(pid)
            return read(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._processes.pop(pid, None)
            return None
