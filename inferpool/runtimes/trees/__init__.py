"""inferpool's own predictor for tree ensembles (LightGBM and XGBoost boosters,
scikit-learn random forests, extra-trees, gradient boosting and histogram-based gradient
boosting, CatBoost's oblivious trees: ``from_catboost``, ``oblivious``): the same model,
predicted several times faster than by its library
(benchmarks/RESULTS.md, "tree kernel").

A runtime asks ``compile_model`` for a compiled model (``from_lightgbm``,
``from_xgboost``, ``sklearn_models``) when it loads a model. Anything the kernel does not
reproduce exactly (XGBoost's categorical splits, scikit-learn categories that are not
numbers, linear trees, an unknown objective, a kernel that was not compiled) gives
``Unsupported`` with the reason, and the runtime keeps its library's predictor.
A compiled model is checked against the library on probe rows before it serves
(``verify``). ``contributions`` walks the same layout for explanations (Saabas).
"""

from inferpool.runtimes.trees.choose import compile_model, kernel_enabled
from inferpool.runtimes.trees.forest import (
    KERNEL_AVAILABLE,
    Forest,
    ForestBuilder,
    Unsupported,
)
from inferpool.runtimes.trees.verify import probe_rows, verify

__all__ = [
    "KERNEL_AVAILABLE",
    "Forest",
    "ForestBuilder",
    "Unsupported",
    "compile_model",
    "kernel_enabled",
    "probe_rows",
    "verify",
]
