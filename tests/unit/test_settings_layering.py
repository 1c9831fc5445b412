"""The settings package's shape: its modules import each other without a cycle, it imports
nothing of the engine, the frontends, the runtimes or the logs (any process may read
settings), every name other modules import from ``inferpool.settings`` is there, and its
modules stay small.

The cycle check reads the import graph from the sources (``ast``), lazy imports inside
functions included: importing the modules in a fresh interpreter one by one would prove
little, since importing any ``inferpool.settings.X`` first runs the package's
``__init__``, which always imports the modules in its own order.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "inferpool" / "settings"
PACKAGE = "inferpool.settings"

# What the settings modules may import from inferpool outside the package, and why.
OUTSIDE = {
    "inferpool.protocol.types": "ModelSettings gives its inputs and outputs as TensorSpec",
    "inferpool.protocol.datatypes": "warm-up samples check their datatypes and shapes",
    # MLServer's settings contract, below this package (it imports nothing of inferpool).
    "inferpool.mlserver.contract.common": "the once-per-process messages, variables' text",
    "inferpool.mlserver.contract.cors": "ServerSettings' cors_settings field is MLServer's",
    "inferpool.mlserver.contract.model_settings": "model-settings.json's keys, MLSERVER_MODEL_*",
    "inferpool.mlserver.contract.server_settings": "settings.json's keys and MLSERVER_*",
}
# Imported inside a function (at validation time), never when the package loads.
LAZY_OUTSIDE = {
    # A model's ``requirements`` are checked by the same parser that later matches them
    # (engine.environments.capabilities.check_requirements, PEP 508 through packaging).
    # That module must stay importable without pydantic: it also runs as ``python -m
    # inferpool.engine.environments.capabilities`` under an environment's interpreter,
    # which may lack pydantic, so it cannot import (or live in) this package. Imported
    # lazily, it loads nothing of the engine with the settings
    # (test_loading_the_settings_loads_no_upper_layer).
    ("model", "inferpool.engine.environments.capabilities"): (
        "requirements' syntax, at validation time"
    ),
}
UPPER_LAYERS = ("inferpool.engine", "inferpool.frontends", "inferpool.runtimes", "inferpool.logs")


def modules() -> dict[str, Path]:
    """The package's modules by short name (``server``, ``model``...), ``__init__`` apart."""
    return {path.stem: path for path in sorted(SETTINGS.glob("*.py")) if path.stem != "__init__"}


def imports(path: Path) -> list[tuple[str, bool]]:
    """Every inferpool module ``path`` imports, with whether it is inside a function; a name
    imported from the package that is one of its modules counts as that module."""
    tree = ast.parse(path.read_text())
    lazy = {
        id(node)
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
    }
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == PACKAGE:
                names = [
                    f"{PACKAGE}.{alias.name}" if alias.name in modules() else PACKAGE
                    for alias in node.names
                ]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [(name, id(node) in lazy) for name in names if name.startswith("inferpool")]
    return found


def settings_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (short names; the package itself: "")."""
    graph: dict[str, set[str]] = {}
    for name, path in modules().items():
        graph[name] = {
            imported.removeprefix(PACKAGE).removeprefix(".").partition(".")[0]
            for imported, _ in imports(path)
            if imported == PACKAGE or imported.startswith(PACKAGE + ".")
        }
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as a path (first node repeated at the end); [] when none."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = "done"
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return []


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_the_package_itself() -> None:
    # ``from inferpool.settings import X`` inside the package runs __init__, which imports
    # every module: the shape of the cycles settings.py and mlserver_env.py had.
    graph = settings_graph()
    assert {name for name, targets in graph.items() if "" in targets} == set()


def test_the_settings_modules_import_each_other_without_a_cycle() -> None:
    graph = settings_graph()
    assert set(graph) >= {"server", "model", "pipeline", "sources", "loading"}
    assert find_cycle(graph) == []


def test_the_settings_import_nothing_of_the_layers_above() -> None:
    wrong = []
    for name, path in modules().items():
        for imported, lazy in imports(path):
            if imported == PACKAGE or imported.startswith(PACKAGE + "."):
                continue
            allowed = imported in OUTSIDE or (lazy and (name, imported) in LAZY_OUTSIDE)
            if not allowed:
                wrong.append(f"{name}: {imported}{' (lazy)' if lazy else ''}")
    assert wrong == []
    init = [imported for imported, _ in imports(SETTINGS / "__init__.py")]
    assert all(imported.startswith(PACKAGE + ".") or imported in OUTSIDE for imported in init)


def test_loading_the_settings_loads_no_upper_layer() -> None:
    # A fresh interpreter: what ``import inferpool.settings`` drags in.
    code = (
        "import sys\n"
        "import inferpool.settings\n"
        f"print(sorted(m for m in sys.modules if m.startswith({UPPER_LAYERS!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.stdout.strip() == "[]"


def test_the_mlserver_contract_imports_nothing_of_inferpool() -> None:
    # The settings import it: anything it imported of inferpool would be a cycle.
    contract = ROOT / "inferpool" / "mlserver" / "contract"
    outside = [
        f"{path.name}: {imported}"
        for path in sorted(contract.glob("*.py"))
        for imported, _ in imports(path)
        if not imported.startswith("inferpool.mlserver.contract")
    ]
    assert outside == []


def test_loading_the_settings_loads_no_mlserver_api() -> None:
    # The contract lives in inferpool.mlserver, whose __init__ loads the API (MLModel, its
    # pydantic types, the pandas codecs) only when one of its names is asked for.
    code = (
        "import sys\n"
        "import inferpool.settings, inferpool.mlserver\n"
        "print(sorted(m for m in sys.modules if m.startswith('inferpool.mlserver')\n"
        "             and not m.startswith('inferpool.mlserver.contract')))\n"
        "from inferpool.mlserver import MLModel\n"
        "print(MLModel.__module__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.stdout.split("\n")[:2] == ["['inferpool.mlserver']", "inferpool.mlserver.model"]


def test_every_name_imported_from_the_package_is_exported() -> None:
    # Other modules keep ``from inferpool.settings import X``: __init__ re-exports each X.
    import inferpool.settings

    wanted = set()
    for folder in ("inferpool", "tests", "benchmarks", "scripts", "docs"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            if f"from {PACKAGE} import" not in text:
                continue  # (parsing only the files that may: the tree is large)
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
                    wanted |= {alias.name for alias in node.names}
    assert {"ServerSettings", "ModelSettings", "read_model_settings"} <= wanted
    assert sorted(name for name in wanted if not hasattr(inferpool.settings, name)) == []


def test_the_settings_modules_stay_small() -> None:
    too_big = []
    for path in [SETTINGS / "__init__.py", *modules().values()]:
        lines = path.read_text().count("\n")
        if lines > 400:
            too_big.append(f"{path.name}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            limit = 300 if isinstance(node, ast.ClassDef) else 60
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit:
                    too_big.append(f"{path.name}: {node.name} {size} lines")
    assert too_big == []
