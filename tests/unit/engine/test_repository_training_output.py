"""CatBoost's training folder (``catboost_info/``, written in the working directory, often
the models' folder) is no model, in a repository without any settings too; a folder where
a model was saved beside that log stays a model."""

from __future__ import annotations

from pathlib import Path

from inferpool.engine.repository import discover


def write_training_log(folder: Path) -> None:
    """What CatBoost's training writes in its ``train_dir``."""
    (folder / "learn").mkdir(parents=True)
    (folder / "catboost_training.json").write_text('{"meta": {}}')
    (folder / "learn_error.tsv").write_text("iter\tLogloss\n0\t0.69\n")


def test_catboost_info_beside_the_models_is_no_model(tmp_path: Path) -> None:
    (tmp_path / "fares").mkdir()
    (tmp_path / "fares" / "model.cbm").write_bytes(b"CBM1")
    write_training_log(tmp_path / "catboost_info")
    assert [found.name for found in discover(tmp_path)] == ["fares"]


def test_a_model_saved_into_its_training_folder_is_a_model(tmp_path: Path) -> None:
    write_training_log(tmp_path / "trained")
    (tmp_path / "trained" / "model.cbm").write_bytes(b"CBM1")
    assert [found.name for found in discover(tmp_path)] == ["trained"]


def test_another_folder_without_an_artefact_is_still_a_model_that_fails(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "learn_error.tsv").write_text("iter\n")
    assert [found.name for found in discover(tmp_path)] == ["notes"]
