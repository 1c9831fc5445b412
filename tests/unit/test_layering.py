"""The layout as a test: the folder map of ``docs/architecture.md`` is read here and held.

- Every module of the package belongs to one unit of the map (a folder or a root module).
- A unit imports only the units its row allows (its own folder always), at the top of a
  file or inside a function; ``LAYER_EXCEPTIONS`` names the few imports that may cross, each
  with its reason.
- Each process loads only what its row allows, checked in a fresh interpreter.
- No hand-written module over 500 lines, no class over 300, no function over 60, unless
  ``SIZE_EXCEPTIONS`` names it with a reason.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "inferpool"
MAP = ROOT / "docs" / "architecture.md"
GENERATED = ("inferpool/protocol/generated/",)  # protoc's output: not held to the size rules

# (importing file, imported module prefix): why this import may cross the map.
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("observability/tracing.py", "inferpool.engine.pipelines.runner"): (
        "a type only (StepTrace, under TYPE_CHECKING): a pipeline's steps become child spans"
    ),
    ("runtimes/footprint.py", "inferpool.engine.worker.model"): (
        "a type only (LoadedModel, under TYPE_CHECKING): what a footprint is measured of"
    ),
    ("runtimes/explainer.py", "inferpool.engine.worker"): (
        "inside its load and predict, in the worker: an explainer loads the model it explains "
        "with the worker's own loader and asks the worker's attribution path"
    ),
    ("runtimes/registry.py", "inferpool.mlserver.adapter"): (
        "inside _custom_class, when a custom implementation is no Runtime: the adapter that "
        "serves an MLServer MLModel subclass builds on runtimes/ (Runtime), not the reverse"
    ),
    ("settings/model.py", "inferpool.engine.environments.capabilities"): (
        "inside a validator: requirements are parsed by the module that later matches them, "
        "which must stay pydantic-free (it runs under other environments' interpreters)"
    ),
}

# "path" (module), "path:Class" or "path:function" (qualified for methods): why it is larger.
SIZE_EXCEPTIONS: dict[str, str] = {
    "inferpool/frontends/rest/http1.py:GuardedHttpTools": (
        "one subclass of Uvicorn's httptools protocol: its parser callbacks, timers and "
        "limits share the connection's state; splitting it needs Uvicorn's internals too"
    ),
    "inferpool/transport/http2_frames.py:Http2FrameReader": (
        "one RFC 9113 connection state machine: each frame type's handler reads and "
        "changes the same connection state (windows, streams, budgets)"
    ),
    "inferpool/frontends/rest/app.py:build_app": (
        "the REST route table, written out as the V2 protocol lists it, each route's "
        "handler a short closure over the app's engine client and settings"
    ),
    "inferpool/frontends/rest/endpoints.py:endpoint_routes": (
        "the custom-endpoint routes: short closures over the router and data plane"
    ),
    "inferpool/frontends/rest/mlflow_scoring.py:scoring_routes": (
        "MLflow's scoring routes (/ping, /health, /version, /invocations): short closures"
    ),
}

MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60


def _table(marker: str) -> list[list[str]]:
    """The rows of the table between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    text = MAP.read_text()
    found = re.search(rf"<!-- {marker} -->\n(.*?)<!-- /{marker} -->", text, re.S)
    assert found, f"docs/architecture.md has no <!-- {marker} --> table"
    lines = [line.strip() for line in found.group(1).splitlines() if line.strip()]
    # a header, its rule, then the rows
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _names(cell: str) -> list[str]:
    """The backquoted names of a cell: `engine/ipc/`, `errors.py`."""
    return re.findall(r"`([^`]+)`", cell)


@cache
def layer_map() -> dict[str, tuple[str, ...]]:
    """unit ("engine/ipc/", "errors.py") -> the units it may import ("*": any)."""
    units: dict[str, tuple[str, ...]] = {}
    for cells in _table("layout-map"):
        for unit in _names(cells[0]):
            units[unit] = tuple(_names(cells[2])) if "anything" not in cells[2] else ("*",)
    return units


def unit_of(relative: str) -> str | None:
    """The unit a path under inferpool/ belongs to: the longest folder or the file."""
    best = None
    for unit in layer_map():
        inside = relative == unit or (unit.endswith("/") and relative.startswith(unit))
        if inside and (best is None or len(unit) > len(best)):
            best = unit
    return best


def module_path(name: str) -> str | None:
    """inferpool.engine.ipc.ring -> "engine/ipc/ring.py" (a package: its folder)."""
    parts = name.split(".")[1:]
    for size in range(len(parts), -1, -1):
        base = PACKAGE.joinpath(*parts[:size])
        if base.with_suffix(".py").is_file():
            return str(base.with_suffix(".py").relative_to(PACKAGE))
        if (base / "__init__.py").is_file():
            return (str(base.relative_to(PACKAGE)) + "/").lstrip("./") or ""
    return None


def imported(path: Path) -> list[str]:
    """Every inferpool module a file imports, at the top or inside a function."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            # ``from inferpool import logs``: the module named, not the package
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name.startswith("inferpool")]


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_unit_of_the_map() -> None:
    relatives = [str(path.relative_to(PACKAGE)) for path in sources()]
    lost = [relative for relative in relatives if unit_of(relative) is None]
    assert not lost, f"add these to docs/architecture.md's folder map: {lost}"


def test_every_unit_of_the_map_exists() -> None:
    missing = [unit for unit in layer_map() if not (PACKAGE / unit).exists()]
    assert not missing, f"the map names what is gone: {missing}"


def _crossings() -> list[str]:
    units = layer_map()
    wrong = []
    for path in sources():
        relative = str(path.relative_to(PACKAGE))
        own = unit_of(relative)
        assert own is not None
        allowed = units[own]
        for name in imported(path):
            target_path = module_path(name)
            if target_path is None or target_path == "":
                continue  # ``inferpool`` itself, or a name inside a module
            target = unit_of(target_path)
            if target == own or "*" in allowed or target in allowed:
                continue
            if any(
                relative == file and name.startswith(prefix) for (file, prefix) in LAYER_EXCEPTIONS
            ):
                continue
            wrong.append(f"{relative} ({own}) imports {name} ({target})")
    return sorted(set(wrong))


def test_each_unit_imports_only_what_the_map_allows() -> None:
    assert not _crossings()


def test_each_layer_exception_is_still_needed_and_says_why() -> None:
    for (file, prefix), reason in LAYER_EXCEPTIONS.items():
        assert len(reason) > 20, (file, prefix)
        assert any(name.startswith(prefix) for name in imported(PACKAGE / file)), (file, prefix)


@pytest.mark.parametrize("row", _table("process-map"), ids=lambda row: row[0])
def test_a_process_loads_only_what_its_row_allows(row: list[str]) -> None:
    """A fresh interpreter imports the process's entry modules; none of the forbidden
    prefixes may be loaded by them."""
    entries, forbidden = _names(row[1]), _names(row[2])
    assert entries and forbidden
    code = (
        "import importlib, sys\n"
        f"for name in {entries!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.startswith(tuple({forbidden!r}))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    assert result.stdout.strip() == "[]", f"{row[0]} loads {result.stdout.strip()}"


def _oversized() -> list[str]:
    found = []
    for path in sources():
        relative = str(path.relative_to(ROOT))
        if relative.startswith(GENERATED):
            continue
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            found.append(relative)
        found.extend(_oversized_definitions(relative, ast.parse(text)))
    return found


def _oversized_definitions(relative: str, tree: ast.AST, prefix: str = "") -> list[str]:
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            name = f"{prefix}{node.name}"
            assert node.end_lineno is not None
            if node.end_lineno - node.lineno + 1 > limit:
                found.append(f"{relative}:{name}")
            found.extend(_oversized_definitions(relative, node, f"{name}."))
    return found


def test_modules_classes_and_functions_keep_their_size() -> None:
    over = [entry for entry in _oversized() if entry not in SIZE_EXCEPTIONS]
    assert not over, f"split these (or name them in SIZE_EXCEPTIONS with a reason): {over}"


def test_each_size_exception_is_still_needed_and_says_why() -> None:
    over = set(_oversized())
    for entry, reason in SIZE_EXCEPTIONS.items():
        assert len(reason) > 20, entry
        assert entry in over, f"{entry} is within the limits now: remove its exception"


def test_engine_and_its_result_are_still_exported() -> None:
    import inferpool
    from inferpool.engine.embedded import Engine
    from inferpool.engine.embedded_io import InferenceResult

    assert inferpool.Engine is Engine and inferpool.InferenceResult is InferenceResult
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = inferpool.Nope  # type: ignore[attr-defined]
