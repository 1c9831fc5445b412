"""The smoke test of a built wheel, run by cibuildwheel in an environment holding the wheel
and its ``sklearn`` extra (pyproject.toml's ``[tool.cibuildwheel]``) and by tox -e package
(tests/package/test_release.py): the compiled extensions import, the installed metadata
names the package's version, and a scikit-learn model answers through the embedded engine.
Plain Python, no pytest: it runs outside the checkout. Prints ``ok``."""

from __future__ import annotations

import importlib
import platform
import tempfile
from importlib.metadata import version
from pathlib import Path

import joblib
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier

import inferpool

# The tree kernel builds everywhere; the ring's atomics and the JSON scanner's SIMD tiers
# are x86-64 code (setup.py builds them optionally: elsewhere inferpool falls back).
EXTENSIONS = ["inferpool.runtimes.trees._kernel"]
if platform.machine().lower() in ("x86_64", "amd64"):
    EXTENSIONS += ["inferpool.engine.ipc._atomics", "inferpool.protocol._jsonscan"]


def main() -> None:
    for module in EXTENSIONS:
        importlib.import_module(module)
    assert version("inferpool") == inferpool.__version__, (
        version("inferpool"),
        inferpool.__version__,
    )
    x, y = load_iris(return_X_y=True)
    with tempfile.TemporaryDirectory() as models:
        (Path(models) / "iris").mkdir()
        forest = RandomForestClassifier(n_estimators=10, random_state=0).fit(x, y)
        joblib.dump(forest, Path(models) / "iris" / "model.joblib")
        with inferpool.Engine(models) as engine:
            result = engine.infer_sync("iris", x[[0, 100]], outputs=["predict"])
    assert list(result["predict"]) == [0, 2], result["predict"]
    print("ok")


if __name__ == "__main__":
    main()
