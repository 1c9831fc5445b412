"""Where CatBoost is not installed (the default environment), a CatBoost model fails with
one sentence naming the pip extra that installs it, chosen by its artefact or by MLServer's
implementation string; with workers, placement says which workers lack it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from inferpool.engine.pool.groups import runtime_library
from inferpool.errors import RuntimeNotFound
from inferpool.runtimes.registry import runtime_class, runtime_name_for
from inferpool.settings import ModelSettings, read_model_settings

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("catboost") is not None, reason="catboost is installed here"
)

SENTENCE = "the 'catboost' runtime needs catboost: pip install inferpool[catboost]"


def test_a_cbm_file_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "model.cbm").write_bytes(b"CBM1")
    settings = ModelSettings(name="m", folder=tmp_path)
    assert runtime_name_for(settings) == "catboost"
    with pytest.raises(RuntimeNotFound) as caught:
        runtime_class(settings)
    assert str(caught.value) == SENTENCE


def test_mlservers_implementation_names_the_extra(tmp_path: Path) -> None:
    document = {"name": "cb", "implementation": "mlserver_catboost.CatboostModel"}
    (tmp_path / "model-settings.json").write_text(json.dumps(document))
    settings = read_model_settings(tmp_path, "cb")
    with pytest.raises(RuntimeNotFound) as caught:
        runtime_class(settings)
    assert str(caught.value) == SENTENCE


def test_placement_refuses_workers_without_catboost(tmp_path: Path) -> None:
    (tmp_path / "model.cbm").write_bytes(b"CBM1")
    library = runtime_library(ModelSettings(name="m", folder=tmp_path))
    assert library is not None
    assert library.refused() == "lack 'catboost' (install inferpool[catboost])"
