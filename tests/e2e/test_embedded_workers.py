"""``inferpool.Engine`` with ``workers=0`` (the worker path in this process) and
``workers=1`` (raw tensors over the worker pool) answers the same: numpy and pandas in
and out, load and unload, and the same errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest

import inferpool
from inferpool.errors import BadRequest, ModelNotFound

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def frame_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models trained here on iris as a DataFrame: a classifier, and a scaler whose
    ``transform`` returns a DataFrame."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    root = tmp_path_factory.mktemp("frames")
    X, y = load_iris(return_X_y=True, as_frame=True)
    models = {
        "classifier": LogisticRegression(max_iter=1000).fit(X, y),
        "scaler": StandardScaler().set_output(transform="pandas").fit(X),
    }
    for name, model in models.items():
        (root / name).mkdir()
        joblib.dump(model, root / name / "model.joblib")
    return root


@pytest.fixture(scope="module")
def iris_frame() -> pd.DataFrame:
    from sklearn.datasets import load_iris

    frame: pd.DataFrame = load_iris(as_frame=True).data
    return frame


@pytest.fixture(scope="module", params=[0, 1], ids=["workers=0", "workers=1"])
def engine(request: pytest.FixtureRequest, frame_repo: Path) -> Iterator[inferpool.Engine]:
    with inferpool.Engine(frame_repo, workers=request.param) as started:
        yield started


def test_numpy_in_numpy_out(engine: inferpool.Engine, frame_repo: Path, iris_frame) -> None:
    classifier = joblib.load(frame_repo / "classifier" / "model.joblib")
    rows = iris_frame.to_numpy()[::7]
    result = engine.infer_sync("classifier", rows, outputs=["predict", "predict_proba"])
    assert isinstance(result["predict"], np.ndarray)
    np.testing.assert_array_equal(result["predict"], classifier.predict(iris_frame[::7]))
    proba = result["predict_proba"]
    assert proba.dtype == np.float64 and proba.shape == (len(rows), 3)
    np.testing.assert_allclose(proba, classifier.predict_proba(iris_frame[::7]), rtol=1e-12)
    proba[0, 0] = -1.0  # the caller's own array, writable


def test_dataframe_in_dataframe_out(engine: inferpool.Engine, frame_repo: Path, iris_frame) -> None:
    scaler = joblib.load(frame_repo / "scaler" / "model.joblib")
    rows = iris_frame.iloc[:12]
    result = engine.infer_sync("scaler", rows, outputs=["transform"])
    assert list(result) == list(iris_frame.columns)  # one output per column
    pd.testing.assert_frame_equal(result.as_dataframe(), scaler.transform(rows))
    predicted = engine.infer_sync("classifier", rows).as_dataframe()
    assert list(predicted.columns) == ["predict"]
    classifier = joblib.load(frame_repo / "classifier" / "model.joblib")
    assert predicted["predict"].tolist() == classifier.predict(rows).tolist()


def test_load_and_unload(engine: inferpool.Engine, iris_frame) -> None:
    rows = iris_frame.to_numpy()[:2]
    engine.unload_sync("scaler")
    # An unloaded model stays listed, UNAVAILABLE (MLServer's empty reason); it answers 404.
    listed = {m["name"]: (m["state"], m["reason"]) for m in engine.models()}
    assert listed == {"classifier": ("READY", ""), "scaler": ("UNAVAILABLE", "")}
    with pytest.raises(ModelNotFound, match=r"^model 'scaler' was unloaded \(load it again"):
        engine.infer_sync("scaler", rows)
    engine.load_sync("scaler")
    assert sorted(m["state"] for m in engine.models()) == ["READY", "READY"]
    assert engine.infer_sync("scaler", rows, outputs=["transform"]).as_dataframe().shape == (2, 4)


def test_errors(engine: inferpool.Engine) -> None:
    with pytest.raises(ModelNotFound, match=r"^model 'nothing' not found$"):
        engine.infer_sync("nothing", np.zeros((1, 4)))
    with pytest.raises(BadRequest, match="has no input 'input-0_0', 'input-0_1'") as caught:
        engine.infer_sync("classifier", np.zeros((1, 3)))  # 3 of its 4 columns
    assert caught.value.status == 400
    with pytest.raises(BadRequest, match="no output 'nope'"):
        engine.infer_sync("classifier", np.zeros((1, 4)), outputs=["nope"])


def test_requests_count_in_the_statistics(engine: inferpool.Engine) -> None:
    def counts() -> tuple[int, int]:
        assert engine.client is not None
        [stats] = engine.client.statistics("classifier")["model_stats"]
        outcome = stats["inference_stats"]
        return outcome["success"]["count"], outcome["fail"]["count"]

    before = counts()
    engine.infer_sync("classifier", np.zeros((2, 4)))
    with pytest.raises(BadRequest):
        engine.infer_sync("classifier", np.zeros((2, 3)))
    assert counts() == (before[0] + 1, before[1] + 1)
