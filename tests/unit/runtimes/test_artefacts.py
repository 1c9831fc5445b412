"""Recognising a runtime from its artefact, without importing the model library."""

import warnings

import pytest

from inferpool.errors import RuntimeNotFound
from inferpool.runtimes.artefacts import is_lightgbm_text, library_of
from inferpool.runtimes.registry import runtime_name_for
from inferpool.settings import ModelSettings
from tests.support.runtimes import lightgbm_estimator, save_booster, xgboost_estimator


def settings_for(folder, uri=None) -> ModelSettings:
    return ModelSettings(name=folder.name, folder=folder, parameters={"uri": uri})


@pytest.fixture(scope="module")
def boosters():
    lgb, _ = lightgbm_estimator("classifier", n_classes=2)
    xgb, _ = xgboost_estimator("classifier", n_classes=2)
    return lgb.booster_, xgb.get_booster()


def test_bst_written_by_lightgbm_is_lightgbm(tmp_path, boosters):
    folder = save_booster(tmp_path / "m", boosters[0], "model.bst")
    assert is_lightgbm_text(folder / "model.bst")
    assert runtime_name_for(settings_for(folder)) == "lightgbm"


@pytest.mark.parametrize("filename", ["model.bst", "model.xgb", "model.json", "model.ubj"])
def test_xgboost_files_are_xgboost(tmp_path, boosters, filename):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # XGBoost warns about extensions it does not know
        folder = save_booster(tmp_path / "m", boosters[1], filename)
    assert not is_lightgbm_text(folder / filename)
    assert runtime_name_for(settings_for(folder)) == "xgboost"


def test_uri_to_a_bst_file_is_told_apart_by_content(tmp_path, boosters):
    save_booster(tmp_path / "m", boosters[0], "trees.bst")
    assert runtime_name_for(settings_for(tmp_path / "m", "trees.bst")) == "lightgbm"


def test_model_txt_is_lightgbm(tmp_path, boosters):
    folder = save_booster(tmp_path / "m", boosters[0], "model.txt")
    assert runtime_name_for(settings_for(folder)) == "lightgbm"


def test_mlmodel_is_mlflow(tmp_path):
    (tmp_path / "MLmodel").write_text("flavors: {}\n")
    assert runtime_name_for(settings_for(tmp_path)) == "mlflow"


def test_no_artefact_says_what_was_expected(tmp_path):
    with pytest.raises(RuntimeNotFound, match=r"model\.txt"):
        runtime_name_for(settings_for(tmp_path))


def test_library_of_reads_the_class_module(boosters):
    lgb, xgb = boosters
    assert library_of(lgb) == "lightgbm"
    assert library_of(xgb) == "xgboost"
    assert library_of(lightgbm_estimator("regressor")[0]) == "lightgbm"
    assert library_of(object()) is None


def test_mlflow_folder_with_a_flavour_pickle_is_mlflow(tmp_path):
    (tmp_path / "MLmodel").write_text("flavors: {}\n")
    (tmp_path / "model.pkl").write_bytes(b"")
    assert runtime_name_for(settings_for(tmp_path)) == "mlflow"


def test_uri_to_a_folder_is_recognised_by_its_content(tmp_path, boosters):
    save_booster(tmp_path / "m" / "v1", boosters[0], "model.txt")
    assert runtime_name_for(settings_for(tmp_path / "m", "v1")) == "lightgbm"
