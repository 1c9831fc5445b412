"""Server profiles: start inferpool, MLServer, KServe or a native peer (BentoML, LitServe,
Ray Serve: ``benchmarks/native_peers.py``) on free ports, wait until ready, stop (their
process trees are measured by ``benchmarks/process_stats.py``). An external ``--target`` is
measured but not managed.

Each managed server gets its own folder: symlinks to the shared model folders plus, for
MLServer, its settings.json. So several servers run side by side from one repository.
KServe is ``benchmarks/kserve_peer.py`` run by the KServe virtualenv's python.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks import native_env, native_peers
from benchmarks.loadgen.base import Target
from benchmarks.otlp_sink import otlp_sink
from benchmarks.ports import HOST, ServerPorts, free_port
from benchmarks.process_stats import tree_rss

# inferpool-w2-grpcio: inferpool with --grpc-implementation grpcio (grpc.aio);
# inferpool-w2-library: every tree model predicted by its own library, not the tree kernel
# (model-settings ``parameters.extra.tree_kernel: false``); inferpool-w2-otel: with
# --tracing, every span exported over OTLP/HTTP to a sink the harness runs (otlp_sink.py);
# inferpool-w2-base: inferpool run from another checkout (``--base-checkout``, e.g. a
# worktree of the commit before a change), so two versions are measured side by side in
# one run. All may be combined.
# kserve-wN: the kserve SDK's ModelServer with --workers N (N >= 1: uvicorn processes for
# REST; gRPC is served by the first process whatever N).
SERVER_NAME = re.compile(
    r"^(?P<kind>inferpool|mlserver|kserve)-w(?P<workers>\d+)(?P<grpc>-grpcio)?(?P<library>-library)?"
    r"(?P<otel>-otel)?(?P<base>-base)?$"
)
# Protocols a server kind cannot speak: such scenarios are reported "n/a", not failed.
# KServe 0.21 decodes Triton's binary tensors and gRPC raw contents: it speaks all four.
UNSUPPORTED = {"mlserver": {"rest-binary", "grpc-shm"}}
# The native peers take their own JSON: every non-JSON scenario is "n/a" on them.
NON_JSON = {"rest-binary", "grpc-typed", "grpc-raw", "grpc-shm"}
UNSUPPORTED |= {kind: NON_JSON for kind in native_peers.PEERS}
PEER = Path(__file__).resolve().with_name("kserve_peer.py")
# The module run as `python -m MODULE serve ...` for inferpool-wN (`--inferpool-module`).
INFERPOOL_MODULE = "inferpool"


@dataclass(frozen=True)
class ServerSpec:
    """A server profile by name: ``inferpool-w2`` = inferpool with --workers 2."""

    name: str
    kind: str  # inferpool | mlserver | kserve | external
    workers: int | None = None
    grpc_implementation: str | None = None  # inferpool's --grpc-implementation
    tree_kernel: bool = True  # False: models get parameters.extra.tree_kernel = false
    base: bool = False  # True: run from the --base-checkout, not from this checkout
    tracing: bool = False  # True: --tracing, spans exported to the harness's OTLP sink

    @classmethod
    def parse(cls, name: str) -> ServerSpec:
        native = native_peers.parse(name)
        if native is not None:
            return cls(name, *native)
        match = SERVER_NAME.match(name)
        options = match and (match["grpc"] or match["library"] or match["otel"] or match["base"])
        if match is None or (options and match["kind"] != "inferpool"):
            raise ValueError(
                f"unknown server {name!r}: use inferpool-wN[-grpcio][-library][-otel][-base], "
                "mlserver-wN, kserve-wN, bentoml, litserve or rayserve (-wN optional)"
            )
        grpc = "grpcio" if match["grpc"] else None
        workers = int(match["workers"])
        if match["kind"] == "kserve" and workers < 1:
            raise ValueError(f"{name}: KServe's --workers (uvicorn processes) is 1 or more")
        return cls(
            name, match["kind"], workers, grpc, not match["library"], bool(match["base"]),
            bool(match["otel"]),
        )  # fmt: skip

    def supports(self, protocol: str) -> bool:
        return protocol not in UNSUPPORTED.get(self.kind, set())


@dataclass
class RunningServer:
    """A server being measured; ``process`` is None for an external target, which may give
    ``target_pid`` so its process tree is measured all the same."""

    spec: ServerSpec
    target: Target
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    idle_rss: float = math.nan  # bytes, right after start-up
    models: list[str] = field(default_factory=list)
    target_pid: int | None = None
    grpc_error: str = ""  # set when REST is up but the gRPC port never opened

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else self.target_pid

    def supports(self, protocol: str) -> bool:
        """False when the server kind lacks the protocol or no gRPC port was given."""
        no_grpc = protocol.startswith("grpc") and self.target.grpc_port is None
        return self.spec.supports(protocol) and not no_grpc

    @property
    def http_base(self) -> str:
        return f"http://{self.target.host}:{self.target.http_port}"

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's process group, SIGKILL it if it is not gone in ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def server_folder(
    spec: ServerSpec,
    repo: Path,
    models: list[str],
    workdir: Path,
    target: Target,
    numbered: bool = False,
    metrics_port: int | None = None,
) -> Path:
    """A per-server repository view: the run's model folders linked (a server loads only
    what is measured), plus MLServer's settings.json (its metrics on ``metrics_port``, a
    free port when None). ``numbered`` gives every model version "1"
    (``parameters.version``): perf_analyzer reads versions as numbers."""
    folder = workdir / spec.name / "repo"
    folder.mkdir(parents=True, exist_ok=True)
    for model in models:
        link = folder / model
        if not spec.tree_kernel or numbered:
            _settings_copy(repo / model, link, library=not spec.tree_kernel, numbered=numbered)
        elif not link.exists():
            link.symlink_to((repo / model).resolve(), target_is_directory=True)
    if spec.kind in native_peers.PEERS:
        home = workdir / spec.name
        port, workers = target.http_port or 0, spec.workers or 1
        return native_peers.write_folder(spec.kind, home, repo, models, target.host, port, workers)
    if spec.kind == "mlserver":
        settings = {
            "host": target.host,
            "http_port": target.http_port,
            "grpc_port": target.grpc_port,
            "metrics_port": metrics_port or free_port(),
            "parallel_workers": spec.workers,
        }
        (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    return folder


def _settings_copy(source: Path, folder: Path, library: bool, numbered: bool) -> None:
    """A copy of a model folder (artefacts linked) whose settings turn the tree kernel off
    (``library``) and/or give the model version "1" (``numbered``)."""
    folder.mkdir(exist_ok=True)
    for item in source.resolve().iterdir():
        if item.name != "model-settings.json" and not (folder / item.name).exists():
            (folder / item.name).symlink_to(item)
    settings = json.loads((source / "model-settings.json").read_text())
    parameters = settings.setdefault("parameters", {})
    if library:
        parameters.setdefault("extra", {})["tree_kernel"] = False
    if numbered:
        parameters["version"] = "1"
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=2))


def command(
    spec: ServerSpec,
    folder: Path,
    target: Target,
    mlserver: Path | None,
    inferpool_module: str,
    kserve: Path | None = None,
    models: list[str] | None = None,
) -> list[str]:
    """The server's command line; ``kserve`` is the python of KServe's virtualenv and
    ``models`` the folders the KServe peer serves (it loads only what it is told)."""
    if spec.kind in native_peers.PEERS:
        python = native_env.venv(spec.kind) / "bin" / "python"
        return native_peers.PEERS[spec.kind].command(
            python, folder, target.host, target.http_port or 0
        )
    if spec.kind == "mlserver":
        if mlserver is None:
            raise ValueError("MLServer is not installed")
        return [str(mlserver), "start", str(folder)]
    if spec.kind == "kserve":
        if kserve is None:
            raise ValueError("KServe is not installed")
        if not models:
            raise ValueError("the KServe peer needs at least one model")
        return [
            str(kserve),
            str(PEER),
            "--model_dir",
            str(folder),
            *(arg for model in models for arg in ("--model", model)),
            "--http_port",
            str(target.http_port),
            "--grpc_port",
            str(target.grpc_port),
            "--workers",
            str(spec.workers),
        ]
    return [
        sys.executable,
        "-m",
        inferpool_module,
        "serve",
        str(folder),
        "--host",
        target.host,
        "--http-port",
        str(target.http_port),
        "--grpc-port",
        str(target.grpc_port),
        "--workers",
        str(spec.workers),
        *(["--grpc-implementation", spec.grpc_implementation] if spec.grpc_implementation else []),
        *(["--tracing"] if spec.tracing else []),
    ]


def start(
    spec: ServerSpec,
    repo: Path,
    models: list[str],
    workdir: Path,
    mlserver: Path | None = None,
    inferpool_module: str = INFERPOOL_MODULE,
    timeout: float = 180.0,
    base_checkout: Path | None = None,
    kserve: Path | None = None,
    numbered: bool = False,
    ports: ServerPorts | None = None,
) -> RunningServer:
    """Start a server on ``ports`` (free ones when None) and return once it and every
    model is ready (``numbered``: every model gets version "1", see :func:`server_folder`)."""
    ports = ports or ServerPorts.free()
    native = spec.kind in native_peers.PEERS
    target = Target(HOST, ports.http, None if native else ports.grpc)
    folder = server_folder(spec, repo, models, workdir, target, numbered, ports.metrics)
    log_path = workdir / spec.name / "server.log"
    env = {**os.environ, "INFERPOOL_METRICS_PORT": str(ports.metrics), "PYTHONUNBUFFERED": "1"}
    if spec.tracing:
        env.update(otlp_sink().env())
    if native:
        env.update(native_peers.environment(spec.kind, folder, workdir / spec.name))
    cwd = workdir / spec.name if spec.kind in ("mlserver", "kserve") or native else None
    if spec.base:
        cwd = base_checkout_dir(base_checkout)
        env["PYTHONPATH"] = str(cwd)  # its inferpool, not the one installed from here
    with log_path.open("wb") as log:
        # A session of its own, so stop() can signal the whole tree (MLServer's workers too).
        process = subprocess.Popen(
            command(spec, folder, target, mlserver, inferpool_module, kserve, models),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            # MLServer writes its Prometheus files (.metrics/) into its working directory:
            # keep them (and anything KServe writes) in the run's folder, not the checkout.
            cwd=cwd,
        )
    server = RunningServer(spec, target, process, log_path, models=models)
    try:
        wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    server.idle_rss = tree_rss(process.pid)
    return server


def base_checkout_dir(base_checkout: Path | None) -> Path:
    """The checkout a ``-base`` server runs from; it must hold an inferpool package."""
    if base_checkout is None:
        raise ValueError("a -base server needs --base-checkout DIR")
    folder = base_checkout.resolve()
    if not (folder / "inferpool" / "__init__.py").is_file():
        raise ValueError(f"--base-checkout {folder} holds no inferpool package")
    return folder


def attach(http: str, grpc: str | None, models: list[str], pid: int | None = None) -> RunningServer:
    """An external server (``--target``/``--grpc``): measured, never started or stopped."""
    url = httpx.URL(http)
    grpc_port = int(grpc.rsplit(":", 1)[1]) if grpc else None
    target = Target(url.host, url.port or 80, grpc_port)
    server = RunningServer(ServerSpec("target", "external"), target, models=models, target_pid=pid)
    wait_ready(server, timeout=10.0)
    if pid is not None:
        server.idle_rss = tree_rss(pid)
    return server


def failure_line(path: Path | None) -> str:
    """The reason a server gave up: the log's last line that mentions an error or failure
    (shutdown chatter follows it), else its last line."""
    if path is None or not path.exists():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    telling = [line for line in lines if re.search(r"error|fail|exception", line, re.I)]
    return (telling or lines or [""])[-1]


def wait_ready(server: RunningServer, timeout: float, grpc_grace: float = 10.0) -> None:
    """Poll the V2 readiness endpoints (server, then each model), then the gRPC port.

    A gRPC port still closed ``grpc_grace`` s after REST is ready is recorded in
    ``grpc_error``: the gRPC scenarios fail, the REST ones are still measured.
    """
    deadline = time.monotonic() + timeout
    paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in server.models)]
    if server.spec.kind in native_peers.PEERS:
        paths = [native_peers.PEERS[server.spec.kind].ready_path]
    with httpx.Client(base_url=server.http_base, timeout=2.0) as client:
        while paths:
            if server.process is not None and server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.spec.name} exited {server.process.returncode}: "
                    f"{failure_line(server.log_path)} (log: {server.log_path})"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server.spec.name} not ready after {timeout:.0f}s: {paths[0]}")
            try:
                if client.get(paths[0]).status_code == 200:
                    paths.pop(0)
                    continue
            except httpx.TransportError:
                pass
            time.sleep(0.25)
    if server.target.grpc_port is None:
        return
    grpc_deadline = time.monotonic() + grpc_grace
    while True:
        try:
            socket.create_connection((server.target.host, server.target.grpc_port), 2).close()
            return
        except OSError:
            if time.monotonic() > grpc_deadline:
                server.grpc_error = f"gRPC port {server.target.grpc_port} is not listening"
                return
            time.sleep(0.25)
