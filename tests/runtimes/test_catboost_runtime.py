"""The CatBoost runtime without a server: what it reads from the file (classifier or
regressor, features, categorical ones, dimensions), its outputs against CatBoost's own
calls, MLServer's answers, threads, fork-safety and load errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.engine.worker import batching
from inferpool.errors import BadRequest, ModelLoadError
from inferpool.runtimes.registry import RUNTIMES, is_fork_safe, runtime_class
from inferpool.settings import ModelSettings, read_model_settings
from tests.runtimes import catboost_models as cm

catboost = pytest.importorskip("catboost")


def serve(folder: Path, name: str = "m") -> Any:
    """The runtime that serves the model in ``folder``, loaded."""
    if (folder / "model-settings.json").exists():
        settings = read_model_settings(folder, name)
    else:
        settings = ModelSettings(name=name, folder=folder)
    runtime = runtime_class(settings)(settings)
    runtime.load()
    return runtime.serving()


def test_a_classifier_file_answers_labels_probabilities_and_raw_values(tmp_path: Path) -> None:
    model = cm.multiclass_classifier()
    cm.save(model, tmp_path)
    runtime = serve(tmp_path)
    rows = cm.numeric_rows(6, 4, seed=5)
    answers = runtime.predict(rows, ["predict", "predict_proba", "raw_formula_val"])
    assert answers["predict"].tolist() == model.predict(rows).ravel().tolist()
    # The tree kernel's softmax: CatBoost's takes its own approximate exp (a few ulps off).
    np.testing.assert_allclose(answers["predict_proba"], model.predict_proba(rows), rtol=1e-12)
    raw = model.predict(rows, prediction_type="RawFormulaVal")
    np.testing.assert_array_equal(answers["raw_formula_val"], raw)
    specs = {spec.name: (spec.datatype, spec.shape) for spec in runtime.outputs()}
    assert specs == {
        "predict": ("BYTES", [-1]),
        "predict_proba": ("FP64", [-1, 3]),
        "raw_formula_val": ("FP64", [-1, 3]),
    }


def test_a_poisson_regressor_predicts_through_its_link_and_raw_values_without(
    tmp_path: Path,
) -> None:
    model = cm.regressor("Poisson")
    cm.save(model, tmp_path)
    runtime = serve(tmp_path)
    rows = cm.numeric_rows(5, 4, seed=6)
    answers = runtime.predict(rows, ["predict", "raw_formula_val"])
    # The tree kernel's exp: CatBoost's takes its own approximate exp (a few ulps off).
    np.testing.assert_allclose(answers["predict"], model.predict(rows), rtol=1e-12)
    np.testing.assert_allclose(np.exp(answers["raw_formula_val"]), answers["predict"])
    assert runtime.classes is None
    assert [spec.name for spec in runtime.outputs()] == ["predict", "raw_formula_val"]


def test_categorical_features_by_name_reordered_and_by_position(tmp_path: Path) -> None:
    model = cm.categorical_classifier()
    cm.save(model, tmp_path)
    runtime = serve(tmp_path)
    assert runtime.accepts == "dataframe"
    frame = cm.categorical_frame(8, seed=11)
    want = model.predict_proba(frame)
    shuffled = frame[["size", "num", "colour"]].assign(colour=frame.colour.str.encode("utf-8"))
    np.testing.assert_array_equal(
        runtime.predict(shuffled, ["predict_proba"])["predict_proba"], want
    )
    by_position = frame.set_axis(["a", "b", "c"], axis=1)
    np.testing.assert_array_equal(
        runtime.predict(by_position, ["predict_proba"])["predict_proba"], want
    )
    as_text = frame.astype(str).to_numpy()  # one table: numbers as text too
    np.testing.assert_array_equal(
        runtime.predict(as_text, ["predict_proba"])["predict_proba"], want
    )


@pytest.mark.parametrize(
    ("columns", "words"),
    [
        (["num", "colour"], "got num, colour"),
        (["num", "colour", "other"], "got num, colour, other"),
    ],
)
def test_columns_that_are_not_the_features_are_a_bad_request(
    tmp_path: Path, columns: list[str], words: str
) -> None:
    cm.save(cm.categorical_classifier(), tmp_path)
    runtime = serve(tmp_path)
    frame = cm.categorical_frame(2).assign(other=1)[columns]
    with pytest.raises(BadRequest, match=words):
        runtime.validate(frame)


def test_an_empty_table_is_a_bad_request(tmp_path: Path) -> None:
    cm.save(cm.regressor(), tmp_path)
    with pytest.raises(BadRequest, match="at least one row"):
        serve(tmp_path).validate(np.zeros((0, 4)))


def test_joined_requests_answer_as_each_alone(tmp_path: Path) -> None:
    cm.save(cm.categorical_classifier(), tmp_path)
    runtime = serve(tmp_path)
    assert runtime.rows_independent
    parts = [cm.categorical_frame(3, seed=s) for s in (1, 2)]
    joined = runtime.predict(batching.concatenate(parts), ["predict_proba"])["predict_proba"]
    alone = [runtime.predict(part, ["predict_proba"])["predict_proba"] for part in parts]
    np.testing.assert_array_equal(joined, np.concatenate(alone))


def test_predictions_use_the_workers_share_of_threads(tmp_path: Path) -> None:
    # CatBoost's predict, not the tree kernel's.
    cm.save(cm.regressor(), tmp_path, parameters={"extra": {"tree_kernel": False}})
    runtime = serve(tmp_path)
    seen: list[int] = []
    predict = runtime.model.predict

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["thread_count"])
        return predict(*args, **kwargs)

    runtime.model.predict = counting
    runtime.limit_threads(1)
    runtime.predict(cm.numeric_rows(2, 4), ["predict", "raw_formula_val"])
    assert seen == [1, 1]


def test_mlservers_implementation_answers_predict_as_a_column(tmp_path: Path) -> None:
    model = cm.multiclass_classifier()
    document = {"name": "cb", "implementation": "mlserver_catboost.CatboostModel"}
    cm.save(model, tmp_path, "model.bin", **document)
    runtime = serve(tmp_path, "cb")
    rows = cm.numeric_rows(3, 4)
    answers = runtime.predict(rows, ["anything"])
    assert list(answers) == ["predict"]
    assert answers["predict"].tolist() == [
        [label.encode()] for label in model.predict(rows).ravel()
    ]
    asked = runtime.predict(rows, ["predict_proba"])
    np.testing.assert_allclose(asked["predict_proba"], model.predict_proba(rows), rtol=1e-12)
    assert [(s.name, s.shape) for s in runtime.outputs()] == [("predict", [-1, 1])]


def test_mlservers_implementation_without_its_file_says_which_it_looks_for(tmp_path: Path) -> None:
    document = {"name": "cb", "implementation": "mlserver_catboost.CatboostModel"}
    (tmp_path / "model-settings.json").write_text(json.dumps(document))
    with pytest.raises(ModelLoadError, match=r"model\.cbm or model\.bin"):
        serve(tmp_path, "cb")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "the file is empty"),
        (b"not a catboost model at all", "it holds text, not a CatBoost model"),
        (b"\x80\x04K\x01.", "it holds a pickle, not a CatBoost model"),
    ],
    ids=["empty", "text", "pickle"],
)
def test_a_broken_file_fails_in_one_sentence(tmp_path: Path, content: bytes, reason: str) -> None:
    (tmp_path / "model.cbm").write_bytes(content)
    with pytest.raises(ModelLoadError) as caught:
        serve(tmp_path)
    assert str(caught.value) == f"model.cbm is not a valid CatBoost model ({reason})"


def test_a_truncated_file_fails_in_one_sentence(tmp_path: Path) -> None:
    path = cm.save(cm.binary_classifier(), tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError) as caught:
        serve(tmp_path)
    message = str(caught.value)
    assert message.startswith("model.cbm is not a valid CatBoost model (Failed to read")
    assert message.endswith("the file may be truncated or corrupt)")


# Runs in a fresh interpreter: counts the process's threads around the load.
CHILD = """
import sys
from pathlib import Path
from inferpool.engine.worker.model import load_model
from inferpool.engine.worker.preload import thread_count
from inferpool.runtimes import catboost
from inferpool.settings import read_model_settings

before = thread_count()
load_model(read_model_settings(Path(sys.argv[1]), "m"))
print(before, thread_count())
"""


def test_loading_starts_no_thread_so_the_template_may_load_it(tmp_path: Path) -> None:
    cm.save(cm.categorical_classifier(), tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    before, after = map(int, child.stdout.split())
    assert after == before
    assert RUNTIMES["catboost"].fork_safe
    assert is_fork_safe(ModelSettings(name="m", folder=tmp_path))


def test_a_multi_target_regressor_answers_a_column_per_target(tmp_path: Path) -> None:
    rows = cm.numeric_rows(80, 3)
    targets = np.column_stack([rows.sum(axis=1), rows[:, 0] - rows[:, 1]])
    model = catboost.CatBoostRegressor(loss_function="MultiRMSE", **cm.TRAINING)
    model.fit(rows, targets)
    cm.save(model, tmp_path)
    runtime = serve(tmp_path)
    assert [(s.name, s.shape) for s in runtime.outputs()] == [
        ("predict", [-1, 2]),
        ("raw_formula_val", [-1, 2]),
    ]
    np.testing.assert_array_equal(
        runtime.predict(rows[:4], ["predict"])["predict"], model.predict(rows[:4])
    )


def test_a_ranker_answers_its_scores(tmp_path: Path) -> None:
    rows = cm.numeric_rows(60, 3)
    model = catboost.CatBoostRanker(loss_function="YetiRank", **cm.TRAINING)
    model.fit(rows, rows[:, 0] > 0, group_id=np.repeat(np.arange(6), 10))
    cm.save(model, tmp_path)
    runtime = serve(tmp_path)
    assert isinstance(runtime.model, catboost.CatBoostRanker)
    np.testing.assert_array_equal(
        runtime.predict(rows, ["predict"])["predict"], model.predict(rows)
    )


def test_mlservers_implementation_answers_a_regressors_values(tmp_path: Path) -> None:
    """MLServer 1.7.1 reads every file as a CatBoostClassifier and fails on a regressor's
    (IndexError in predict); inferpool answers its values, as MLServer's [N, 1]."""
    model = cm.regressor()
    document = {"name": "cb", "implementation": "mlserver_catboost.CatboostModel"}
    cm.save(model, tmp_path, **document)
    rows = cm.numeric_rows(3, 4)
    answer = serve(tmp_path, "cb").predict(rows, ["predict"])["predict"]
    np.testing.assert_array_equal(answer, model.predict(rows).reshape(-1, 1))
