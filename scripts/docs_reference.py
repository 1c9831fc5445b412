"""The documentation site's generated reference pages (docs/reference/), written from the code
so that they cannot drift: the command line from the argparse parser and ServerSettings,
the metrics from the collectors' tables and sources, the errors from the classes derived
from ``InferpoolError``, the endpoints from the REST app's routes and the gRPC services'
descriptors.

``PAGES`` maps each page's path under docs/ to the function that writes it; the MkDocs hook
(scripts/mkdocs_hooks.py) adds them to the site at build time, and
tests/unit/docs/test_reference.py checks what they hold against the code. Something the
code has and a page cannot describe (an endpoint without a line in ``REST_ROUTES``, say)
raises ``Undocumented``, which fails ``mkdocs build``.
"""

from __future__ import annotations

import argparse
import ast
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Undocumented(Exception):
    """Something the code serves that the reference has no words for."""


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, lines joined."""
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the command line


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command of ``parser``, depth first, as ``inferpool serve``, ..."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sub.prog = f"{parser.prog} {name}"
                yield from _subcommands(sub)


def _serve_rows(parser: argparse.ArgumentParser) -> dict[str, list[tuple[str, ...]]]:
    """The serve command's settings by help section: flag, variable(s), settings key,
    default, what it does."""
    from inferpool.cli_flags import FIELD_GROUPS, default_text, mlserver_names
    from inferpool.mlserver.contract.server_settings import SERVER_PREFIX
    from inferpool.settings import ServerSettings

    mlserver = mlserver_names()
    flags = {a.dest: a for a in parser._actions if a.option_strings}
    sections: dict[str, list[tuple[str, ...]]] = {}
    for name, group in FIELD_GROUPS.items():
        field = ServerSettings.model_fields[name]
        action = flags.get(name)
        shown = " ".join(f"`{s}`" for s in action.option_strings) if action else "argument"
        variables = f"`INFERPOOL_{name.upper()}`"
        key = f"`{name}`"
        if name in mlserver:
            variables += f", `{SERVER_PREFIX}{mlserver[name].upper()}`"
            key += f" (MLServer: `{mlserver[name]}`)"
        row = (shown, variables, key, default_text(name, field), field.description or "")
        sections.setdefault(group, []).append(row)
    return sections


def _other_options(parser: argparse.ArgumentParser, settings: set[str]) -> list[tuple[str, ...]]:
    rows = []
    for action in parser._actions:
        if action.dest in settings or isinstance(action, argparse._SubParsersAction):
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest.upper()}`"
        rows.append((names, (action.help or "").replace("%%", "%")))
    return rows


def cli_page() -> str:
    """Every command, and every flag of ``inferpool serve`` with its variable and key."""
    from inferpool.cli import build_parser
    from inferpool.cli_flags import FIELD_GROUPS, GROUPS

    out = [
        "# Command line and settings\n",
        "Generated from `inferpool.cli.build_parser()` and `ServerSettings` at build time.",
        "Every setting is a flag, an `INFERPOOL_*` environment variable and a key of the",
        "repository's `settings.json`; lowest precedence first: defaults, `MLSERVER_*`",
        "variables, `settings.json`, `INFERPOOL_*` variables, flags.\n",
    ]
    for prog, parser in _subcommands(build_parser()):
        out.append(f"## `{prog}`\n")
        out.append((parser.description or "").replace("\n", " ") + "\n")
        if prog == "inferpool serve":
            sections = _serve_rows(parser)
            for group, about in GROUPS.items():
                out.append(f"### {group.capitalize()}\n\n{' '.join(about.split())}.\n")
                header = ("flag", "environment", "settings.json key", "default", "what it sets")
                out.append(_table(header, sections.get(group, [])))
            others = _other_options(parser, set(FIELD_GROUPS))
            out.append("### Other arguments\n\n" + _table(("argument", "what it does"), others))
        else:
            rows = _other_options(parser, set())
            if rows:
                out.append(_table(("argument", "what it does"), rows))
    return "\n".join(out)


# ---------------------------------------------------------------- metrics


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def server_metric_families() -> list[tuple[str, str, str]]:
    """(name, type, help) of each family the server collector builds, read from its
    source: every ``*MetricFamily("inferpool_...", "help", ...)`` call."""
    from inferpool.frontends import metrics_server

    tree = ast.parse(Path(metrics_server.__file__).read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if not node.func.id.endswith("MetricFamily") or len(node.args) < 2:
            continue
        name, help_ = _literal(node.args[0]), _literal(node.args[1])
        if name is None or help_ is None:
            raise Undocumented(f"a metric family of metrics_server.py at line {node.lineno}")
        found.append((name, node.func.id.removesuffix("MetricFamily").lower(), help_))
    return found


def _exposed(name: str, kind: str) -> str:
    """The name Prometheus's text format shows: counters end in ``_total``."""
    return f"{name}_total" if kind == "counter" else name


def metrics_page() -> str:
    """Every family of ``/metrics``: the engine's table, then the server's."""
    from inferpool.frontends.metrics import FAMILIES

    rows = []
    for family in FAMILIES:
        kind = family.kind.__name__.removesuffix("MetricFamily").lower()
        labels = ", ".join(f"`{label}`" for label in family.labels) or "none"
        rows.append((f"`{_exposed(family.name, kind)}`", kind, labels, family.help))
    server = [
        (f"`{_exposed(name, kind)}`", kind, help_) for name, kind, help_ in server_metric_families()
    ]
    return "\n".join(
        [
            "# Metrics\n",
            "Generated from `inferpool.frontends.metrics.FAMILIES` (per model and version)",
            "and the families `inferpool/frontends/metrics_server.py` builds (server, workers,",
            "processes). What they mean and how to use them: [Metrics](../operate/metrics.md).\n",
            "## Models\n",
            _table(("metric", "type", "labels", "what it counts"), rows),
            "## Server, workers and processes\n",
            _table(("metric", "type", "what it counts"), server),
        ]
    )


# ---------------------------------------------------------------- errors


def _error_modules() -> list[str]:
    """The modules of inferpool whose classes may derive from ``InferpoolError``, found by
    name in the source (so that only they are imported, not every library behind the
    runtimes); the classes themselves are then found by ``__subclasses__``."""
    bases_of: dict[str, set[str]] = {}
    modules_of: dict[str, set[str]] = {}
    for path in sorted((ROOT / "inferpool").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                bases_of.setdefault(node.name, set()).update(names)
                modules_of.setdefault(node.name, set()).add(module)
    derived, pending = {"InferpoolError"}, ["InferpoolError"]
    while pending:
        base = pending.pop()
        for name, bases in bases_of.items():
            if base in bases and name not in derived:
                derived.add(name)
                pending.append(name)
    return sorted({m for name in derived for m in modules_of.get(name, ())})


def _import_package() -> None:
    """Import every module that may define a subclass of ``InferpoolError``; one whose
    optional library is missing is skipped (its classes are then not listed)."""
    import importlib

    for name in _error_modules():
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def error_classes() -> list[type[Exception]]:
    """Every subclass of ``InferpoolError`` in the package, the base first."""
    from inferpool.errors import InferpoolError

    _import_package()
    found: list[type[Exception]] = []
    pending: list[type[Exception]] = [InferpoolError]
    while pending:
        cls = pending.pop(0)
        if cls not in found and cls.__module__.startswith("inferpool"):
            found.append(cls)
            pending += cls.__subclasses__()
    return found


def errors_page() -> str:
    """Every error class: its HTTP status, its gRPC status, what it means."""
    from inferpool.errors import grpc_code_for

    rows = [
        (
            f"`{cls.__name__}`",
            f"`{cls.__module__}`",
            str(cls.status),  # type: ignore[attr-defined]
            grpc_code_for(cls.status),  # type: ignore[attr-defined]
            " ".join((cls.__doc__ or "").split()),
        )
        for cls in sorted(error_classes(), key=lambda c: (c.status, c.__name__))  # type: ignore[attr-defined]
    ]
    return "\n".join(
        [
            "# Errors\n",
            "Generated from the subclasses of `inferpool.errors.InferpoolError`. Every error",
            'answers `{"error": "<message>"}` with the HTTP status below, or over gRPC the',
            "status in the next column with the message as its details; embedded",
            "(`inferpool.Engine`), the class itself is raised. Statuses 499 are never sent:",
            "the client has gone.\n",
            _table(("class", "module", "HTTP", "gRPC", "meaning"), rows),
        ]
    )


# ---------------------------------------------------------------- endpoints

# What each REST route does; a route of the app without a line here fails the build.
REST_ROUTES = {
    "/v2/health/live": "server liveness (503 only for a wedged process)",
    "/v2/health/ready": "server readiness (strict: every model that counts is READY)",
    "/v2": "server metadata: name, version, extensions",
    "/v2/models/stats": "statistics of every model (Triton's statistics extension)",
    "/v2/repository/index": "the models of the repository and their state",
    "/v2/repository/models/{name}/load": "load or reload a model",
    "/v2/repository/models/{name}/unload": "unload a model",
    "/v2/trace/setting": "the server's trace settings: GET reads, POST updates (Triton's trace "
    "extension; admin token)",
    "{model}/trace/setting": "the model's trace settings: GET reads, POST updates (admin token)",
    "/v2/logging": "the log settings: GET reads, POST updates in every process (Triton's "
    "logging extension; admin token)",
    "/v2/systemsharedmemory/status": "the registered system shared-memory regions (Triton's "
    "system shared-memory extension)",
    "/v2/systemsharedmemory/region/{name}/status": "one registered shared-memory region",
    "/v2/systemsharedmemory/region/{name}/register": "register a region of a POSIX "
    "shared-memory object (key, offset, byte_size)",
    "/v2/systemsharedmemory/region/{name}/unregister": "unregister a region",
    "/v2/systemsharedmemory/unregister": "unregister every region",
    "/v2/cudasharedmemory/status": "CUDA shared memory: not supported (400)",
    "/v2/cudasharedmemory/region/{name}/status": "CUDA shared memory: not supported (400)",
    "/v2/cudasharedmemory/region/{name}/register": "CUDA shared memory: not supported (400)",
    "/v2/cudasharedmemory/region/{name}/unregister": "CUDA shared memory: not supported (400)",
    "/v2/cudasharedmemory/unregister": "CUDA shared memory: not supported (400)",
    "{model}": "model metadata: inputs, outputs, versions",
    "{model}/ready": "model readiness",
    "{model}/infer": "inference (V2 JSON, or Triton's binary tensor extension)",
    "{model}/stats": "the model's statistics",
    "{model}/config": "the model's configuration, in Triton's shape",
    "{model}/infer_stream": "streamed inference: Server-Sent Events",
    "{model}/generate_stream": "the generate extension, streamed: Server-Sent Events",
    "{model}/generate": "the generate extension",
    "{model}/feedback": "feedback (a reward and the truth) for the model's runtime",
    "/v2/docs": "Swagger UI over the server's OpenAPI document (the `swagger` extra)",
    "/v2/docs/dataplane.json": "the server's OpenAPI 3.0 document: every route here",
    "/v2/docs/assets/{path}": "Swagger UI's files, served from the package (no CDN)",
    "{model}/docs": "Swagger UI over the model's OpenAPI document",
    "{model}/docs/dataplane.json": "the model's OpenAPI 3.0 document: its inputs and outputs "
    "from its metadata, its custom endpoints",
    "{model}/{path:path}": "the runtime's custom endpoints",
    "/ping": "MLflow scoring server: liveness",
    "/health": "MLflow scoring server: liveness",
    "/version": "MLflow scoring server: the version",
    "/invocations": "MLflow scoring server: inference, for a server of one model",
    "/": 'KServe V1: liveness (`{"status": "alive"}`)',
    "/v1/models": "KServe V1: the names of the models",
    "/v1/models/{name}:predict": "KServe V1: inference, `instances` to `predictions`",
    "/v1/models/{name}:explain": "KServe V1: the model's attributions, as `explanations`",
    "/v1/models/{name}": "KServe V1: model readiness (503 when not ready)",
    "/{path:path}": "custom endpoints at bare paths (runtimes with bare_endpoints)",
    "/metrics": "Prometheus metrics (the metrics port, or the REST port with --metrics-port 0)",
}

# What each endpoint every model serves through its endpoint route does; one without a line
# here fails the build.
MODEL_ENDPOINTS = {
    "explain": "per-feature attributions of the model's score ([Explanations](../explain.md))",
    "invocations": "MLflow's scoring server's JSON request, for this model",
}

# What each gRPC method does; a method of a service without a line here fails the build.
GRPC_METHODS = {
    "ServerLive": "server liveness",
    "ServerReady": "server readiness",
    "ModelReady": "model readiness",
    "ServerMetadata": "server metadata",
    "ModelMetadata": "model metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "streamed inference (bidirectional stream)",
    "ModelStatistics": "statistics",
    "ModelConfig": "the model's configuration",
    "RepositoryIndex": "the models of the repository",
    "RepositoryModelLoad": "load or reload a model",
    "RepositoryModelUnload": "unload a model",
    "TraceSetting": "read or update the server's or a model's trace settings",
    "LogSettings": "read or update the log settings",
    "SystemSharedMemoryStatus": "the registered system shared-memory regions (all, or one)",
    "SystemSharedMemoryRegister": "register a region of a POSIX shared-memory object",
    "SystemSharedMemoryUnregister": "unregister a region (or every region)",
    "CudaSharedMemoryStatus": "CUDA shared memory: not supported (UNIMPLEMENTED)",
    "CudaSharedMemoryRegister": "CUDA shared memory: not supported (UNIMPLEMENTED)",
    "CudaSharedMemoryUnregister": "CUDA shared memory: not supported (UNIMPLEMENTED)",
    "ServerReflectionInfo": "gRPC server reflection: services and their .proto files "
    "(bidirectional stream; --no-grpc-reflection turns it off)",
    "Call": "a runtime's custom endpoint",
    "ModelFeedback": "feedback for a model",
    "Check": "gRPC health checking",
    "Watch": "gRPC health checking, streamed",
}


def rest_routes() -> list[tuple[str, str]]:
    """(path, methods) of every route of the REST app and the metrics app, in order."""
    from inferpool.engine.inprocess import InProcessClient
    from inferpool.frontends.metrics import build_metrics_app
    from inferpool.frontends.rest.app import build_app
    from inferpool.settings import ServerSettings

    with tempfile.TemporaryDirectory() as empty:
        # gzip off: the app is then Starlette's, its routes listed as they are served
        settings = ServerSettings(model_repository=Path(empty), workers=0, gzip_enabled=False)
        client = InProcessClient(settings)
        routes = [*build_app(client).app.routes, *build_metrics_app(client).routes]  # type: ignore[attr-defined]
    listed = []
    for route in routes:
        # a mount (Swagger UI's files) has no methods of its own: its files answer GET,
        # each under its own path
        methods = sorted(set(getattr(route, "methods", None) or {"GET"}) - {"HEAD"})
        path = route.path if hasattr(route, "methods") else route.path + "/{path}"
        listed.append((path, ", ".join(methods)))
    return listed


def grpc_methods() -> list[tuple[str, str, str]]:
    """(service, method, request message) of every gRPC method the servers answer."""
    from inferpool.protocol.generated import (
        grpc_predict_v2_pb2,
        inferpool_ext_pb2,
        model_repository_pb2,
    )

    found = []
    for module in (grpc_predict_v2_pb2, inferpool_ext_pb2, model_repository_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                streaming = " (stream)" if method.client_streaming else ""
                found.append((service.full_name, method.name, method.input_type.name + streaming))
    health = (ROOT / "inferpool" / "protocol" / "health.proto").read_text()
    for line in health.splitlines():
        if line.strip().startswith("rpc "):
            name, _, rest = line.strip()[4:].partition("(")
            found.append(("grpc.health.v1.Health", name, rest.partition(")")[0]))
    from inferpool.frontends.grpc.reflection import V1, V1ALPHA, reflection_pool

    for name in (V1, V1ALPHA):
        for method in reflection_pool().FindServiceByName(name).methods:
            found.append((name, method.name, method.input_type.name + " (stream)"))
    return found


def endpoints_page() -> str:
    """Every REST route and every gRPC method."""
    prefixes = ("/v2/models/{name}/versions/{version}", "/v2/models/{name}")
    rest = []
    for path, methods in rest_routes():
        key = next((("{model}" + path[len(p) :]) for p in prefixes if path.startswith(p)), path)
        if key not in REST_ROUTES:
            raise Undocumented(f"the REST route {path} has no line in REST_ROUTES")
        rest.append((f"`{path}`", methods, REST_ROUTES[key]))
    from inferpool.frontends.endpoints import _EVERY_MODEL

    every_model = []
    for path, methods in _EVERY_MODEL.items():
        if path not in MODEL_ENDPOINTS:
            raise Undocumented(f"every model's endpoint {path} has no line in MODEL_ENDPOINTS")
        shown = f"`/v2/models/{{name}}[/versions/{{version}}]/{path}`"
        every_model.append((shown, ", ".join(methods), MODEL_ENDPOINTS[path]))
    grpc = []
    for service, method, message in grpc_methods():
        if method not in GRPC_METHODS:
            raise Undocumented(f"the gRPC method {service}/{method} has no line in GRPC_METHODS")
        grpc.append((f"`{service}/{method}`", f"`{message}`", GRPC_METHODS[method]))
    return "\n".join(
        [
            "# Endpoints\n",
            "Generated from the routes of the REST app (`inferpool.frontends.rest.app`) and",
            "the metrics app, and from the gRPC services' descriptors. REST is served on",
            "`--http-port` (8080), gRPC on `--grpc-port` (8081), `/metrics` on `--metrics-port`",
            "(8082). Routes are matched in this order.\n",
            "## REST\n",
            _table(("path", "methods", "what it does"), rest),
            "### Every model's own endpoints\n",
            "Served through the custom endpoint route above (gRPC: `inferpool.CustomService/Call`",
            "with the path), for every model whatever its runtime:\n",
            _table(("path", "methods", "what it does"), every_model),
            "## gRPC\n",
            _table(("method", "request", "what it does"), grpc),
        ]
    )


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/metrics.md": metrics_page,
    "reference/errors.md": errors_page,
    "reference/endpoints.md": endpoints_page,
}
