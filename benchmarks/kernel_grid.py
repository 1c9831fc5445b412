"""``python -m benchmarks.kernel_grid``: which default-trained tree models take inferpool's
tree kernel.

Trains a grid of models with their library's defaults (XGBoost, LightGBM and scikit-learn
objectives × class balance or target skew × feature types), saves each as a user would
(XGBoost's ``model.json`` and a pickled estimator, LightGBM's ``model.txt``, scikit-learn's
``model.joblib``), loads each folder through the worker's own loading path and prints
what predicts it (the load log's note: "the tree kernel (...)" or the library with the
reason), then how many took the kernel.

Examples::

    python -m benchmarks.kernel_grid                 # the whole grid (about a minute)
    python -m benchmarks.kernel_grid --only xgboost  # one library
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 1000
FEATURES = 6
# Kind of target → how each case builds it from a row's signal (a float per row).
BALANCES = {"balanced": 0.5, "skewed": 0.05}
FEATURE_KINDS = ("float", "int", "category")
# Libraries that split on pandas ``category`` columns themselves: one more feature kind.
NATIVE_CATEGORIES = ("xgboost", "lightgbm")


@dataclass(frozen=True)
class Case:
    library: str
    model: str
    balance: str
    features: str
    fmt: str

    @property
    def name(self) -> str:
        return f"{self.library}-{self.model}-{self.balance}-{self.features}-{self.fmt}"


def features(kind: str, rng: np.random.Generator) -> Any:
    """float: normal values; int: counts 0..99; category: codes 0..4 (as floats);
    pandas-category: a DataFrame whose first three columns are pandas categories (codes
    0..4), the others floats."""
    if kind == "pandas-category":
        import pandas as pd

        codes = features("category", rng)
        frame = pd.DataFrame(codes, columns=[f"f{i}" for i in range(FEATURES)])
        for column in frame.columns[:3]:
            frame[column] = frame[column].astype(int).astype("category")
        return frame
    if kind == "float":
        return rng.normal(size=(ROWS, FEATURES))
    if kind == "int":
        return rng.integers(0, 100, size=(ROWS, FEATURES)).astype(np.float64)
    return rng.integers(0, 5, size=(ROWS, FEATURES)).astype(np.float64)


def signal(X: Any) -> np.ndarray:
    """A per-row score in (0, 1) that depends on the features, ranked."""
    X = np.asarray(X, dtype=np.float64)
    raw = X[:, 0] - 0.5 * X[:, 1] + 0.25 * X[:, 2] * X[:, 3]
    return (np.argsort(np.argsort(raw)) + 0.5) / len(raw)


def target(kind: str, balance: str, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Labels (classes), a probability, counts or positive values, balanced or skewed."""
    share = BALANCES[balance]
    s = np.clip(signal(X) + rng.normal(scale=0.1, size=len(X)), 0, 1)
    if kind == "binary":
        return (s > 1 - share).astype(int)
    if kind == "multi":  # three classes, the last one rare when skewed
        rare = share if balance == "skewed" else 1 / 3
        return np.digitize(s, [(1 - rare) / 2, 1 - rare]).astype(int)
    if kind == "probability":
        return s**4 if balance == "skewed" else s
    if kind == "count":
        return rng.poisson(20 * s**6 if balance == "skewed" else 3 * s)
    if kind == "positive":
        return np.exp(4 * s) if balance == "skewed" else 1 + s
    # value: skewed regression targets are heavy-tailed
    return np.exp(6 * s) if balance == "skewed" else 10 * s


# (library, model) → (target kind, trainer(X, y, rng) → (model, format → saver)).
Trainer = Callable[[np.ndarray, np.ndarray], Any]


def xgboost_trainers() -> dict[str, tuple[str, Trainer]]:
    import xgboost as xgb

    def categorical(X: Any) -> dict[str, Any]:
        # XGBoost refuses pandas categories unless told to split on them.
        return {"enable_categorical": True} if hasattr(X, "dtypes") else {}

    def estimator(cls: Any, **params: Any) -> Trainer:
        return lambda X, y: cls(n_jobs=1, **params, **categorical(X)).fit(X, y)

    def ranker(X: Any, y: np.ndarray) -> Any:
        qid = np.repeat(np.arange(len(X) // 20), 20)
        return xgb.XGBRanker(n_jobs=1, **categorical(X)).fit(X, np.minimum(y, 4), qid=qid)

    return {
        "binary:logistic": ("binary", estimator(xgb.XGBClassifier)),
        "multi:softprob": ("multi", estimator(xgb.XGBClassifier)),
        "multi:softmax": ("multi", estimator(xgb.XGBClassifier, objective="multi:softmax")),
        "binary:logitraw": ("binary", estimator(xgb.XGBClassifier, objective="binary:logitraw")),
        "reg:squarederror": ("value", estimator(xgb.XGBRegressor)),
        "reg:absoluteerror": (
            "value",
            estimator(xgb.XGBRegressor, objective="reg:absoluteerror"),
        ),
        "reg:logistic": ("probability", estimator(xgb.XGBRegressor, objective="reg:logistic")),
        "count:poisson": ("count", estimator(xgb.XGBRegressor, objective="count:poisson")),
        "reg:gamma": ("positive", estimator(xgb.XGBRegressor, objective="reg:gamma")),
        "reg:tweedie": ("count", estimator(xgb.XGBRegressor, objective="reg:tweedie")),
        "rank:ndcg": ("count", ranker),
    }


def lightgbm_trainers() -> dict[str, tuple[str, Trainer]]:
    import lightgbm as lgb

    def estimator(cls: Any, **params: Any) -> Trainer:
        return lambda X, y: cls(n_jobs=1, verbose=-1, **params).fit(X, y)

    return {
        "binary": ("binary", estimator(lgb.LGBMClassifier)),
        "multiclass": ("multi", estimator(lgb.LGBMClassifier)),
        "regression": ("value", estimator(lgb.LGBMRegressor)),
        "poisson": ("count", estimator(lgb.LGBMRegressor, objective="poisson")),
        "gamma": ("positive", estimator(lgb.LGBMRegressor, objective="gamma")),
        "tweedie": ("count", estimator(lgb.LGBMRegressor, objective="tweedie")),
        "xentropy": ("probability", estimator(lgb.LGBMRegressor, objective="cross_entropy")),
    }


def sklearn_trainers() -> dict[str, tuple[str, Trainer]]:
    from sklearn import ensemble

    def estimator(cls: Any, **params: Any) -> Trainer:
        return lambda X, y: cls(random_state=0, **params).fit(X, y)

    return {
        "RandomForestClassifier": ("binary", estimator(ensemble.RandomForestClassifier)),
        "RandomForestClassifier-multi": ("multi", estimator(ensemble.RandomForestClassifier)),
        "ExtraTreesClassifier": ("binary", estimator(ensemble.ExtraTreesClassifier)),
        "GradientBoostingClassifier": ("binary", estimator(ensemble.GradientBoostingClassifier)),
        "GradientBoostingClassifier-multi": (
            "multi",
            estimator(ensemble.GradientBoostingClassifier),
        ),
        "HistGradientBoostingClassifier": (
            "binary",
            estimator(ensemble.HistGradientBoostingClassifier),
        ),
        "RandomForestRegressor": ("value", estimator(ensemble.RandomForestRegressor)),
        "ExtraTreesRegressor": ("value", estimator(ensemble.ExtraTreesRegressor)),
        "GradientBoostingRegressor": ("value", estimator(ensemble.GradientBoostingRegressor)),
        "HistGradientBoostingRegressor": (
            "value",
            estimator(ensemble.HistGradientBoostingRegressor),
        ),
    }


LIBRARIES: dict[str, tuple[Callable[[], dict[str, tuple[str, Trainer]]], tuple[str, ...]]] = {
    "xgboost": (xgboost_trainers, ("json", "joblib")),
    "lightgbm": (lightgbm_trainers, ("txt",)),
    "sklearn": (sklearn_trainers, ("joblib",)),
}


def save(folder: Path, model: Any, fmt: str) -> None:
    folder.mkdir(parents=True)
    if fmt == "joblib":
        import joblib

        joblib.dump(model, folder / "model.joblib")
    elif fmt == "json":
        model.get_booster().save_model(str(folder / "model.json"))
    else:
        model.booster_.save_model(str(folder / "model.txt"))


def cases(only: str | None) -> Iterator[tuple[Case, str, Trainer]]:
    for library, (trainers, formats) in LIBRARIES.items():
        if only and only != library:
            continue
        for model, (kind, train) in trainers().items():
            for balance in BALANCES:
                native = ("pandas-category",) if library in NATIVE_CATEGORIES else ()
                for feature_kind in FEATURE_KINDS + native:
                    for fmt in formats:
                        yield Case(library, model, balance, feature_kind, fmt), kind, train


def predictor(folder: Path) -> str:
    """What predicts the model in ``folder``, as its load log says."""
    from inferpool.engine.worker.model import load_model
    from inferpool.settings import read_model_settings

    loaded = load_model(read_model_settings(folder, folder.name))
    return loaded.runtime.predictor()


def run(only: str | None, root: Path) -> list[tuple[Case, str]]:
    results = []
    trained: dict[tuple[str, str, str, str], Any] = {}
    for case, kind, train in cases(only):
        key = (case.library, case.model, case.balance, case.features)
        if key not in trained:
            rng = np.random.default_rng(0)
            X = features(case.features, rng)
            trained[key] = train(X, target(kind, case.balance, X, rng))
        folder = root / case.name
        save(folder, trained[key], case.fmt)
        note = predictor(folder)
        results.append((case, note))
        print(
            f"{'KERNEL ' if note.startswith('the tree kernel') else 'library'}  "
            f"{case.name:60s} {note}",
            flush=True,
        )
    return results


def summary(results: list[tuple[Case, str]]) -> str:
    lines = []
    for library in LIBRARIES:
        mine = [note for case, note in results if case.library == library]
        if mine:
            took = sum(note.startswith("the tree kernel") for note in mine)
            lines.append(f"{library}: {took} of {len(mine)} take the tree kernel")
    took = sum(note.startswith("the tree kernel") for _, note in results)
    lines.append(f"all: {took} of {len(results)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_grid", description=__doc__)
    parser.add_argument("--only", choices=sorted(LIBRARIES), help="one library's models")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="kernel-grid-") as tmp:
        results = run(args.only, Path(tmp))
    print(summary(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
