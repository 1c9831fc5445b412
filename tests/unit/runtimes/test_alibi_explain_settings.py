"""An alibi explainer's settings and the model its ``infer_uri`` names
(``runtimes/alibi_explain_settings.py``), without alibi: the explainers themselves run in
an environment of their own (tests/environments/test_alibi_explain.py)."""

from __future__ import annotations

import pytest

from inferpool.errors import BadRequest, ModelLoadError
from inferpool.runtimes.alibi_explain_settings import (
    EXPLAINERS,
    explain_parameters,
    model_of,
    read_settings,
)
from inferpool.runtimes.registry import RUNTIMES, runtime_name_for
from inferpool.settings import ModelSettings


@pytest.mark.parametrize(
    ("uri", "model"),
    [
        ("http://localhost:8080/v2/models/income/infer", ("income", None)),
        ("https://income-classifier.seldon:9000/v2/models/income/infer/", ("income", None)),
        ("http://h/prefix/v2/models/income/versions/3/infer", ("income", "3")),
        ("/v2/models/income/infer", ("income", None)),
        ("income", ("income", None)),
        ("iris-rf.v1", ("iris-rf.v1", None)),
    ],
)
def test_infer_uri_names_a_local_model(uri: str, model: tuple[str, str | None]) -> None:
    assert model_of(uri) == model


@pytest.mark.parametrize(
    "uri",
    [
        "http://localhost:8080/v2/pipelines/income/infer",
        "http://localhost:8080/v2/models/income",
        "http://localhost:8080/v1/models/income:predict",
        "http://localhost:8080/v2/models/income/infer/more",
    ],
)
def test_other_uris_are_refused_saying_what_to_write(uri: str) -> None:
    with pytest.raises(ModelLoadError, match="names no model of this server: write http://"):
        model_of(uri)


def test_mlservers_settings_are_read() -> None:
    found = read_settings({
        "explainer_type": "anchor_tabular",
        "infer_uri": " http://localhost:8080/v2/models/income/infer ",
        "init_parameters": None,
        "explainer_batch": None,
        "ssl_verify_path": "",
    })  # fmt: skip
    assert found.alibi_class == "AnchorTabular" and found.black_box
    assert found.infer_uri == "http://localhost:8080/v2/models/income/infer"
    assert found.explainer_batch is False and found.init_parameters is None
    assert found.explain_parameters == {}
    tree = read_settings({"explainer_type": "tree_shap", "infer_uri": "./model.joblib",
                          "init_parameters": {"model_output": "raw"},
                          "explain_parameters": {"check_additivity": False}})  # fmt: skip
    assert not tree.black_box and tree.init_parameters == {"model_output": "raw"}
    assert tree.explain_parameters == {"check_additivity": False}
    gradients = read_settings({"explainer_type": "integrated_gradients",
                               "infer_uri": "./model.h5"})  # fmt: skip
    assert gradients.alibi_class == "IntegratedGradients" and not gradients.black_box


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"infer_uri": "m"}, "explainer_type must be one of anchor_tabular, anchor_text"),
        ({"explainer_type": "cfproto", "infer_uri": "m"}, "not 'cfproto'"),
        ({"explainer_type": "kernel_shap"}, "infer_uri must name the explained model, not None"),
        ({"explainer_type": "tree_shap", "infer_uri": ""}, "name the explained model file"),
        ({"explainer_type": "kernel_shap", "infer_uri": "m", "infer_output": 3}, "infer_output"),
        (
            {"explainer_type": "kernel_shap", "infer_uri": "m", "explainer_batch": "yes"},
            "explainer_batch must be true or false, not 'yes'",
        ),
        (
            {"explainer_type": "kernel_shap", "infer_uri": "m", "init_parameters": [1]},
            "init_parameters must be an object",
        ),
        (
            {"explainer_type": "kernel_shap", "infer_uri": "m", "explainers": 1},
            "has no setting explainers",
        ),
    ],
)
def test_bad_settings_are_one_sentence(extra: dict, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(")):
        read_settings(extra)


def test_a_requests_explain_parameters_override_the_settings() -> None:
    defaults = {"threshold": 0.9, "beam_size": 2}
    assert explain_parameters(defaults, {}) == defaults
    asked = {"explain_parameters": {"threshold": 0.95}}
    assert explain_parameters(defaults, asked) == {"threshold": 0.95, "beam_size": 2}
    with pytest.raises(BadRequest, match="explain_parameters must be an object"):
        explain_parameters(defaults, {"explain_parameters": [1]})


def test_mlservers_implementation_names_the_runtime() -> None:
    settings = ModelSettings(name="e", implementation="mlserver_alibi_explain.AlibiExplainRuntime")
    assert runtime_name_for(settings) == "alibi-explain"
    assert RUNTIMES["alibi-explain"].how_to_install().endswith("docs/runtimes/alibi-explain.md")
    assert set(EXPLAINERS) >= {"anchor_tabular", "anchor_text", "kernel_shap", "tree_shap"}
