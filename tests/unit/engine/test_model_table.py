"""The model table alone (``states.ModelTable``): which versions are listed, which one a
request naming none reaches, and how removing versions keeps its indexes right."""

from __future__ import annotations

import pytest

from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.errors import ModelNotFound


def table(*statuses: ModelStatus) -> ModelTable:
    listed = ModelTable()
    for status in statuses:
        listed.set(status)
    return listed


def test_a_model_with_one_version_is_found_with_or_without_naming_it() -> None:
    only = ModelStatus("m", "3", ModelState.LOADING)
    models = table(only)
    assert models.find("m") is only and models.find("m", "3") is only
    with pytest.raises(ModelNotFound, match="model 'm' has no version '4'"):
        models.find("m", "4")
    with pytest.raises(ModelNotFound, match="model 'x' not found"):
        models.find("x")


def test_naming_no_version_reaches_the_latest_ready_else_the_latest() -> None:
    v2 = ModelStatus("m", "2", ModelState.READY)
    v10 = ModelStatus("m", "10", ModelState.LOADING)
    models = table(v2, v10)
    assert models.find("m") is v2  # the only READY one, though older
    v10.state = ModelState.READY
    assert models.find("m") is v10  # numerically newer, not "10" < "2"
    v2.state = v10.state = ModelState.FAILED
    assert models.find("m") is v10


def test_removing_versions_keeps_the_indexes_right() -> None:
    v1, v2 = ModelStatus("m", "1", ModelState.READY), ModelStatus("m", "2", ModelState.READY)
    models = table(v1, v2, ModelStatus("n", None, ModelState.READY))
    assert models.versions("m") == [v1, v2]
    models.remove(v2.key)
    models.remove(v2.key)  # twice: nothing left to remove
    assert models.find("m") is v1 and models.versions("m") == [v1]
    models.remove(v1.key)
    assert models.versions("m") == [] and models.get(v1.key) is None
    with pytest.raises(ModelNotFound):
        models.find("m")
    assert [s.name for s in models.all()] == ["n"]


def test_setting_a_version_again_replaces_its_entry() -> None:
    old = ModelStatus("m", None, ModelState.READY)
    new = ModelStatus("m", None, ModelState.LOADING)
    models = table(old, new)
    assert models.find("m") is new and models.all() == [new] and models.get("m") is new


def test_ready_model_refuses_what_is_not_ready() -> None:
    models = table(ModelStatus("m", None, ModelState.LOADING))
    with pytest.raises(Exception, match="LOADING") as error:
        models.ready_model("m")
    assert getattr(error.value, "status", None) == 503
