"""The import arrows point down, as each process sees them: the engine and ``logs`` load
no frontend module (the request-id context is the leaf ``inferpool.request_ids``), and the
runtimes and the MLServer compatibility package load no engine module (their custom
metrics API is ``runtimes/metrics.py``; the worker's reporter attaches to it from
``engine/worker/``). Each check imports in a fresh interpreter and reads ``sys.modules``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def loaded_after(code: str) -> list[str]:
    """The inferpool modules a fresh interpreter holds after running ``code``."""
    script = (
        f"import json, sys\n{code}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('inferpool'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    modules: list[str] = json.loads(result.stdout.splitlines()[-1])
    return modules


def under(modules: list[str], package: str) -> list[str]:
    return [name for name in modules if name == package or name.startswith(package + ".")]


def test_the_engine_and_logs_load_no_frontend() -> None:
    modules = loaded_after(
        "import inferpool.runtimes.base, inferpool.mlserver, inferpool.logs\n"
        "import inferpool.engine.pool.dispatch, inferpool.engine.pool.handles"
    )
    assert "inferpool.engine.pool.handles" in modules and "inferpool.request_ids" in modules
    assert under(modules, "inferpool.frontends") == []


def test_the_runtimes_and_mlserver_load_no_engine() -> None:
    # Every module of both packages, as a custom runtime or the template may import them;
    # the runtime of a library this environment lacks (catboost, onnxruntime) aside.
    modules = loaded_after(
        "import importlib, pkgutil, inferpool.runtimes, inferpool.mlserver\n"
        "for package in (inferpool.runtimes, inferpool.mlserver):\n"
        "    for found in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        try:\n"
        "            importlib.import_module(found.name)\n"
        "        except ModuleNotFoundError as missing:\n"
        "            if missing.name.startswith('inferpool'):\n"
        "                raise"
    )
    assert "inferpool.runtimes.metrics" in modules and "inferpool.mlserver.metrics" in modules
    assert under(modules, "inferpool.engine") == []
    assert under(modules, "inferpool.frontends") == []


def inferpool_imports(path: Path) -> set[str]:
    """The inferpool modules a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("inferpool")}


def test_the_custom_metrics_api_imports_only_errors() -> None:
    assert inferpool_imports(ROOT / "inferpool/runtimes/metrics.py") == {"inferpool.errors"}


def test_the_request_id_context_is_a_leaf() -> None:
    assert inferpool_imports(ROOT / "inferpool/request_ids.py") == set()
    assert loaded_after("import inferpool.request_ids") == ["inferpool", "inferpool.request_ids"]
