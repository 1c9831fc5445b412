"""Discovery of the layouts multi-model deployers write: ModelMesh's MLServer adapter
(``_mlserver_models/<model id>/`` beside the puller's ``<model id>/``) and KServe's model
agent (a TrainedModel's files and its spec in ``SUCCESS.<sha>``, no model-settings.json)."""

from __future__ import annotations

import json
from pathlib import Path

from inferpool.engine.repository import discover, find_models
from inferpool.runtimes.registry import RUNTIMES, runtime_name_for
from inferpool.settings.trained_model import FRAMEWORKS

MODEL_ID = "iris__isvc-6b2eb0b8bf"


def adapter_layout(root: Path) -> Path:
    """The puller's copy at ``root/<id>`` and the adapter's folder, as the adapter writes
    them for a model file (``adaptModelLayout``): a symlink and generated settings."""
    pulled = root / MODEL_ID
    pulled.mkdir(parents=True)
    (pulled / "model.joblib").write_bytes(b"not read by discovery")
    adapted = root / "_mlserver_models" / MODEL_ID
    adapted.mkdir(parents=True)
    (adapted / "model.joblib").symlink_to(pulled / "model.joblib")
    settings = {
        "name": MODEL_ID,
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": str(adapted / "model.joblib")},
    }
    (adapted / "model-settings.json").write_text(json.dumps(settings))
    return adapted


def test_adapter_folders_are_models_and_the_pullers_copy_is_not(tmp_path) -> None:
    adapted = adapter_layout(tmp_path)
    (tmp_path / "_scratch" / "x").mkdir(parents=True)  # other "_" folders stay hidden
    (tmp_path / "_scratch" / "x" / "model.joblib").write_bytes(b"")
    found = discover(tmp_path)
    assert [(entry.name, entry.folder, entry.error) for entry in found] == [(MODEL_ID, adapted, "")]
    settings = found[0].settings
    assert settings is not None and runtime_name_for(settings) == "sklearn"
    assert [entry.folder for entry in find_models(tmp_path, MODEL_ID)] == [adapted]


def test_a_removed_adapter_folder_is_no_model_any_more(tmp_path) -> None:
    adapted = adapter_layout(tmp_path)
    for path in adapted.iterdir():
        path.unlink()
    adapted.rmdir()
    # The puller's copy alone (the adapter removed its folder first) is a bare model again.
    assert [entry.folder for entry in discover(tmp_path)] == [tmp_path / MODEL_ID]


def test_an_adapter_folder_without_settings_is_no_model(tmp_path) -> None:
    (tmp_path / "_mlserver_models" / "half-written").mkdir(parents=True)
    (tmp_path / "_mlserver_models" / "half-written" / "model.joblib").write_bytes(b"")
    assert discover(tmp_path) == []


def write_trained_model(folder: Path, spec: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "model.joblib").write_bytes(b"")
    (folder / "SUCCESS.0f3a9c").write_text(json.dumps(spec))


def test_a_trained_model_spec_gives_runtime_and_parameters(tmp_path) -> None:
    spec = {"storageUri": "gs://bucket/iris", "framework": "sklearn", "memory": "256Mi"}
    write_trained_model(tmp_path / "iris", spec)
    [entry] = discover(tmp_path)
    assert entry.error == "" and entry.settings is not None
    assert entry.settings.runtime == "sklearn"
    assert entry.settings.parameters.model_extra == {
        "memory": "256Mi",
        "storage_uri": "gs://bucket/iris",
    }


def test_a_models_json_entry_is_read_too(tmp_path) -> None:
    entry_spec = {"modelName": "iris", "modelSpec": {"framework": "XGBoost", "memory": "1Gi"}}
    write_trained_model(tmp_path / "iris", entry_spec)
    [entry] = discover(tmp_path)
    assert entry.settings is not None and entry.settings.runtime == "xgboost"
    assert entry.settings.parameters.model_extra == {"memory": "1Gi"}


def test_an_unserved_framework_fails_the_model_with_a_reason(tmp_path) -> None:
    write_trained_model(tmp_path / "tf", {"framework": "tensorflow", "storageUri": "s3://b/tf"})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "SUCCESS.1").write_text("{not json")
    found = {entry.name: entry for entry in discover(tmp_path)}
    assert found["tf"].settings is None
    assert "framework 'tensorflow' is not served by inferpool" in found["tf"].error
    assert "sklearn" in found["tf"].error
    assert found["broken"].settings is None and "not a TrainedModel spec" in found["broken"].error


def test_model_settings_json_wins_over_the_spec(tmp_path) -> None:
    write_trained_model(tmp_path / "iris", {"framework": "lightgbm"})
    (tmp_path / "iris" / "model-settings.json").write_text('{"name": "iris"}')
    [entry] = discover(tmp_path)
    assert entry.settings is not None and entry.settings.runtime is None


def test_every_framework_names_a_builtin_runtime() -> None:
    assert set(FRAMEWORKS.values()) <= set(RUNTIMES)


def test_an_implementation_variable_alone_is_no_single_model(tmp_path, monkeypatch) -> None:
    """KServe's multi-model InferenceService (no storageUri) sets no MLSERVER_MODEL_NAME nor
    URI, only the runtime's MLSERVER_MODEL_IMPLEMENTATION: its TrainedModels' folders are
    the models, not the whole repository."""
    monkeypatch.setenv("MLSERVER_MODEL_IMPLEMENTATION", "mlserver_sklearn.SKLearnModel")
    write_trained_model(tmp_path / "iris", {"framework": "sklearn"})
    assert [entry.name for entry in discover(tmp_path)] == ["iris"]
    monkeypatch.setenv("MLSERVER_MODEL_NAME", "my-isvc")  # single-model mode: one model
    assert [entry.name for entry in discover(tmp_path)] == ["my-isvc"]


def test_modelmeshs_mlserver_runtime_variables_start_a_server(tmp_path, monkeypatch) -> None:
    """The variables of ModelMesh's mlserver-1.x runtime, as they are: the repository is
    ``_mlserver_models``, gRPC's unlimited message length (-1) is gRPC's largest, and the
    dummy model name names no model once the adapter has written a folder."""
    from inferpool.mlserver.contract.server_settings import UNLIMITED_MESSAGE
    from inferpool.settings.loading import load_server_settings

    models = tmp_path / "_mlserver_models"
    models.mkdir()
    for name, value in {
        "MLSERVER_MODELS_DIR": f"{models}/",
        "MLSERVER_GRPC_PORT": "8001",
        "MLSERVER_HTTP_PORT": "8002",
        "MLSERVER_LOAD_MODELS_AT_STARTUP": "false",
        "MLSERVER_MODEL_NAME": "dummy-model-fixme",
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_GRPC_MAX_MESSAGE_LENGTH": "-1",
    }.items():
        monkeypatch.setenv(name, value)
    settings = load_server_settings(None, {})
    assert settings.max_body_bytes == UNLIMITED_MESSAGE == 2**31 - 1
    assert settings.model_repository == models and not settings.load_models_at_startup
    assert (settings.grpc_port, settings.http_port) == (8001, 8002)
    adapted = adapter_layout(tmp_path)
    assert [(entry.name, entry.folder) for entry in discover(models)] == [(MODEL_ID, adapted)]
