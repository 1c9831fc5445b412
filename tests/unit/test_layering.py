"""The layers import downwards only: protocol and codecs know nothing of the engine, the
frontends, or the processes; the frontend process does not load the inference path."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "inferpool"

# What each layer may import from inferpool (besides itself).
ALLOWED = {
    "protocol": ("inferpool.errors", "inferpool.protocol"),
    "codecs": ("inferpool.errors", "inferpool.protocol", "inferpool.codecs"),
    "engine/ipc": ("inferpool.errors", "inferpool.engine.ipc"),
    "transport": ("inferpool.transport", "inferpool.errors"),
}


def imported(path: Path) -> list[str]:
    """Every inferpool module a file imports, at the top or inside a function."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name.startswith("inferpool")]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_nothing_above_itself(layer: str) -> None:
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files
    wrong = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in files
        for name in imported(path)
        if not name.startswith(ALLOWED[layer])
    }
    assert not wrong


def test_the_frontend_process_does_not_load_the_inference_path() -> None:
    # A fresh interpreter: what importing the servers' modules drags in.
    code = (
        "import sys\n"
        "import inferpool.frontends.server, inferpool.frontends.rest.app\n"
        "import inferpool.frontends.grpc.h2, inferpool.frontends.grpc.aio\n"
        "loaded = [m for m in sys.modules if m.startswith(('inferpool.engine.worker',"
        " 'inferpool.codecs', 'inferpool.engine.embedded', 'sklearn', 'lightgbm'))]\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True, text=True, check=True, cwd=PACKAGE.parent,
    )  # fmt: skip
    assert result.stdout.strip() == "[]"


def test_engine_and_its_result_are_still_exported() -> None:
    import inferpool
    from inferpool.engine.embedded import Engine
    from inferpool.engine.embedded_io import InferenceResult

    assert inferpool.Engine is Engine and inferpool.InferenceResult is InferenceResult
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = inferpool.Nope  # type: ignore[attr-defined]
