"""The benchmark model zoo: trains the models with fixed seeds and writes a model repository.

One repository folder serves both inferpool and MLServer: every model folder holds the
artefact plus an MLServer ``model-settings.json``. Models are trained in-process from
scikit-learn's bundled data and ``make_classification``: no network, reproducible.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Bump when the training recipe changes, so a cached repository is rebuilt.
REPO_VERSION = "1"
SEED = 0
N_TREES = 100
N_FEATURES = 50
MARKER = ".inferpool-bench-repo"


@dataclass(frozen=True)
class ModelSpec:
    """A benchmark model: its name, artefact file, MLServer implementation and inputs."""

    name: str
    artefact: str
    implementation: str
    n_features: int


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("iris", "model.joblib", "mlserver_sklearn.SKLearnModel", 4),
        ModelSpec("lightgbm", "model.txt", "mlserver_lightgbm.LightGBMModel", N_FEATURES),
        ModelSpec("xgboost", "model.json", "mlserver_xgboost.XGBoostModel", N_FEATURES),
        ModelSpec("forest", "model.joblib", "mlserver_sklearn.SKLearnModel", N_FEATURES),
        # The catboost and onnx profiles' models (``[catboost]``, ``[onnx]`` and onnxmltools
        # installed); MLServer has no ONNX runtime: inferpool's name for it.
        ModelSpec("catboost", "model.cbm", "mlserver_catboost.CatboostModel", N_FEATURES),
        ModelSpec("onnx", "model.onnx", "onnx", N_FEATURES),
    )
}
#: the models of the full matrix, which MLServer serves too
ZOO = ("iris", "lightgbm", "xgboost", "forest")


def features(model: str) -> np.ndarray:
    """The float32 feature matrix a model is trained on (and payloads are cut from)."""
    if MODELS[model].n_features == 4:
        from sklearn.datasets import load_iris

        return load_iris().data.astype(np.float32)
    return _classification()[0]


def _classification() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=2000, n_features=N_FEATURES, n_informative=20, random_state=SEED
    )
    return x.astype(np.float32), y


def _train_iris(path: Path) -> None:
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    data = load_iris()
    model = LogisticRegression(max_iter=1000, random_state=SEED)
    model.fit(data.data.astype(np.float32), data.target)
    joblib.dump(model, path)


def _train_lightgbm(path: Path) -> None:
    import lightgbm

    x, y = _classification()
    params = {"objective": "binary", "seed": SEED, "verbose": -1, "num_threads": 1}
    booster = lightgbm.train(params, lightgbm.Dataset(x, y), num_boost_round=N_TREES)
    booster.save_model(str(path))


def _train_xgboost(path: Path) -> None:
    import xgboost

    x, y = _classification()
    params = {"objective": "binary:logistic", "seed": SEED, "nthread": 1, "max_depth": 6}
    booster = xgboost.train(params, xgboost.DMatrix(x, y), num_boost_round=N_TREES)
    booster.save_model(str(path))


def _train_forest(path: Path) -> None:
    import joblib
    from sklearn.ensemble import RandomForestClassifier

    x, y = _classification()
    model = RandomForestClassifier(n_estimators=N_TREES, max_depth=12, random_state=SEED)
    joblib.dump(model.fit(x, y), path)


def _train_catboost(path: Path) -> None:
    import catboost

    x, y = _classification()
    options = {"iterations": N_TREES, "depth": 6, "random_seed": SEED, "thread_count": 1}
    model = catboost.CatBoostClassifier(**options, verbose=False, allow_writing_files=False)
    model.fit(x, y).save_model(str(path))


def _train_onnx(path: Path) -> None:
    """The LightGBM model's recipe as an LGBMClassifier, converted by onnxmltools (its
    probabilities as a tensor: no ZipMap)."""
    import lightgbm
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y = _classification()
    model = lightgbm.LGBMClassifier(n_estimators=N_TREES, random_state=SEED, n_jobs=1, verbose=-1)
    inputs = [("input_0", FloatTensorType([None, N_FEATURES]))]  # takes a tensor of any name
    graph = onnxmltools.convert_lightgbm(model.fit(x, y), initial_types=inputs, zipmap=False)
    for output in graph.graph.output:  # the converter says 1 row: ONNX Runtime warns per run
        output.type.tensor_type.shape.dim[0].dim_param = "N"
    path.write_bytes(graph.SerializeToString())


TRAINERS: dict[str, Callable[[Path], None]] = {
    "iris": _train_iris,
    "lightgbm": _train_lightgbm,
    "xgboost": _train_xgboost,
    "forest": _train_forest,
    "catboost": _train_catboost,
    "onnx": _train_onnx,
}


def model_settings(spec: ModelSpec) -> dict[str, object]:
    """MLServer's model-settings.json for a model (inferpool reads the same file)."""
    return {
        "name": spec.name,
        "implementation": spec.implementation,
        "parameters": {"uri": f"./{spec.artefact}"},
    }


def build_repository(root: Path, models: list[str] | None = None) -> Path:
    """Write (or reuse, when already built by this recipe) a model repository at ``root``."""
    import sklearn

    wanted = sorted(models or MODELS)
    stamp = json.dumps({"version": REPO_VERSION, "sklearn": sklearn.__version__})
    marker = root / MARKER
    built = marker.exists() and marker.read_text() == stamp
    if built and all((root / m / MODELS[m].artefact).exists() for m in wanted):
        return root
    root.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        spec = MODELS[name]
        folder = root / name
        folder.mkdir(exist_ok=True)
        TRAINERS[name](folder / spec.artefact)
        (folder / "model-settings.json").write_text(json.dumps(model_settings(spec), indent=2))
    marker.write_text(stamp)
    return root


def load_predictor(root: Path, model: str) -> Callable[[np.ndarray], np.ndarray]:
    """Load a saved artefact back, so expected predictions come from the served file."""
    spec = MODELS[model]
    path = root / model / spec.artefact
    if spec.artefact == "model.joblib":
        import joblib

        return joblib.load(path).predict
    if spec.artefact == "model.txt":
        import lightgbm

        return lightgbm.Booster(model_file=str(path)).predict
    if spec.artefact == "model.cbm":
        import catboost

        return catboost.CatBoostClassifier().load_model(str(path)).predict
    if spec.artefact == "model.onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x.astype(np.float32)})[0]  # labels
    import xgboost

    booster = xgboost.Booster(model_file=str(path))
    return lambda x: booster.predict(xgboost.DMatrix(x))
