"""The codecs' imports form no cycle: no codec module imports the registry (issue 15, point 6).

The registry imports every codec module to build its tables; a request codec gets the
registry's per-tensor functions as arguments instead of importing them back.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import inferpool.codecs

PACKAGE = "inferpool.codecs"
FOLDER = Path(inferpool.codecs.__file__).parent
# The modules that sit above the codecs: they may import the registry, no codec imports
# them (the request-level codecs of MLflow's scoring protocol and KServe's V1, the second
# sharing the first's JSON fallback).
ABOVE_THE_CODECS = {
    "inferpool.codecs",
    "inferpool.codecs.registry",
    "inferpool.codecs.payload",
    "inferpool.codecs.mlflow_scoring",
    "inferpool.codecs.kserve_v1",
}
MODULES = sorted(
    PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}" for path in FOLDER.glob("*.py")
)
CODEC_MODULES = [name for name in MODULES if name not in ABOVE_THE_CODECS]


def imported_modules(module: str) -> set[str]:
    """Every inferpool.codecs module ``module`` imports, at the top or inside a function."""
    path = FOLDER / ("__init__.py" if module == PACKAGE else f"{module.rpartition('.')[2]}.py")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from inferpool.codecs import registry`` names a module; ``... import X`` a name
            # that the package's __init__ (which imports the registry) provides.
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name in MODULES)
    found.discard(module)
    return found


def test_every_module_is_found() -> None:
    assert {"inferpool.codecs.pandas", "inferpool.codecs.dict_codec"} <= set(CODEC_MODULES)
    assert "inferpool.codecs.registry" in MODULES


@pytest.mark.parametrize("module", CODEC_MODULES)
def test_no_codec_module_imports_the_registry(module: str) -> None:
    assert not imported_modules(module) & ABOVE_THE_CODECS


def test_the_import_graph_of_the_codecs_has_no_cycle() -> None:
    graph = {module: imported_modules(module) for module in MODULES}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            cycle = " -> ".join((*path[path.index(module) :], module))
            pytest.fail(f"import cycle: {cycle}")
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in MODULES:
        visit(module, ())


# Once every codec module is imported, whichever came first: a pd request and a DataFrame
# response round-trip through the request codecs and the registry.
ROUND_TRIP = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import numpy as np, pandas as pd
from inferpool.codecs.payload import decode_payload
from inferpool.codecs.registry import decode_response, encode_outputs
from inferpool.protocol.types import InferenceRequest, Tensor
request = InferenceRequest([Tensor("a", "INT64", (2,), np.array([1, 2]))])
decoded = decode_payload(request, "dataframe", {})
tensors, content_type = encode_outputs({"frame": decoded})
assert decode_response(tensors, content_type).equals(decoded), decoded
print("ok")
"""


@pytest.mark.parametrize("first", MODULES)
def test_each_module_imports_first_in_a_fresh_interpreter(first: str) -> None:
    others = [name for name in MODULES if name != first]
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", ROUND_TRIP, first, *others],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
