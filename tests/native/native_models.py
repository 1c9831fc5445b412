"""Shared libraries for the native runtime's tests, compiled here with gcc: the linear
example of docs/examples/native, probe libraries written by the tests, and tree models
compiled by tl2cgen behind docs/examples/native/tl2cgen_shim.c."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HEADER_DIR = ROOT / "docs" / "native"
EXAMPLES = ROOT / "docs" / "examples" / "native"


def compile_library(sources: list[Path], output: Path, *flags: str) -> Path:
    """``gcc -shared`` of ``sources`` into ``output`` with inferpool_model.h on the path."""
    output.parent.mkdir(parents=True, exist_ok=True)
    command = ["gcc", "-O2", "-shared", "-fPIC", f"-I{HEADER_DIR}", *flags]
    command += [str(source) for source in sources]
    built = subprocess.run([*command, "-o", str(output), "-lm"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return output


def write_settings(folder: Path, **settings: object) -> None:
    document = {"name": folder.name, "implementation": "native", **settings}
    (folder / "model-settings.json").write_text(json.dumps(document))


def linear_model(folder: Path, intercept: float, coefficients: np.ndarray) -> Path:
    """docs/examples/native/linear.c built into ``folder/model.so`` with its weights."""
    compile_library([EXAMPLES / "linear.c"], folder / "model.so")
    weights = [intercept, *np.asarray(coefficients, dtype=float).tolist()]
    (folder / "coefficients.txt").write_text(" ".join(repr(float(w)) for w in weights))
    write_settings(folder)
    return folder


def source_model(folder: Path, source: str, *flags: str, settings: bool = True) -> Path:
    """A library of the C ``source`` (a test's own) in ``folder/model.so``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.c"
    path.write_text(source)
    compile_library([path], folder / "model.so", *flags)
    path.unlink()
    if settings:
        write_settings(folder)
    return folder


def tl2cgen_model(folder: Path, model: object, leaf: str = "double") -> Path:
    """A tree model compiled by tl2cgen (C code from treelite's model of ``model``, a
    LightGBM or XGBoost Booster) and the shim, into ``folder/model.so``."""
    import tl2cgen
    import treelite

    if type(model).__module__.startswith("lightgbm"):
        trees = treelite.frontend.from_lightgbm(model)
    else:
        trees = treelite.frontend.from_xgboost(model)
    with tempfile.TemporaryDirectory() as generated:
        tl2cgen.generate_c_code(trees, dirpath=generated, params={})
        sources = sorted(Path(generated).glob("*.c"))
        compile_library(
            [*sources, EXAMPLES / "tl2cgen_shim.c"],
            folder / "model.so",
            f"-I{generated}",
            f"-DLEAF_T={leaf}",
        )
    write_settings(folder)
    return folder
