"""Settings precedence: defaults < settings.json < INFERPOOL_* environment < CLI flags."""

import json

from inferpool.settings import ServerSettings, load_server_settings, read_model_settings


def test_precedence(tmp_path, monkeypatch):
    (tmp_path / "settings.json").write_text(
        json.dumps({"http_port": 9001, "grpc_port": 9002, "metrics_port": 9003})
    )
    monkeypatch.setenv("INFERPOOL_GRPC_PORT", "7002")
    monkeypatch.setenv("INFERPOOL_METRICS_PORT", "7003")
    settings = load_server_settings(tmp_path, {"metrics_port": 5003})
    assert settings.http_port == 9001  # file over default
    assert settings.grpc_port == 7002  # env over file
    assert settings.metrics_port == 5003  # flag over env
    assert settings.host == ServerSettings.model_fields["host"].default
    assert settings.model_repository == tmp_path


def test_mlserver_keys_are_mapped(tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"parallel_workers": 3, "debug": True}))
    assert load_server_settings(tmp_path, {}).workers == 3


def test_no_settings_file_uses_defaults(tmp_path):
    settings = load_server_settings(tmp_path, {})
    assert settings.http_port == 8080 and settings.grpc_port == 8081


def test_model_settings_read_mlserver_format(tmp_path):
    (tmp_path / "model-settings.json").write_text(
        json.dumps(
            {
                "name": "m",
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./x.joblib", "version": "v2", "extra": {"a": 1}},
                "max_batch_size": 8,
                "warm_workers": True,
            }
        )
    )
    settings = read_model_settings(tmp_path, "folder")
    assert settings.name == "m" and settings.version == "v2"
    assert settings.resolve(settings.parameters.uri) == tmp_path / "x.joblib"
    assert settings.max_batch_size == 8


def test_repository_api_settings_from_flags_and_environment(tmp_path, monkeypatch):
    import pytest
    from pydantic import ValidationError

    from inferpool.cli import build_parser
    from inferpool.engine.admin import AdminPolicy

    assert ServerSettings().model_control_mode == "explicit"  # Seldon and MLServer users
    token = tmp_path / "token"
    token.write_text("from-env\n")
    monkeypatch.setenv("INFERPOOL_ADMIN_TOKEN_FILE", str(token))
    args = build_parser().parse_args(["serve", str(tmp_path), "--model-control-mode", "none"])
    settings = load_server_settings(tmp_path, {"model_control_mode": args.model_control_mode})
    assert settings.model_control_mode == "none" and settings.admin_token_file == token
    assert AdminPolicy.from_settings(settings).token_required
    assert load_server_settings(tmp_path, {"model_control_mode": "poll"}).model_control_mode == (
        "poll"
    )
    with pytest.raises(ValidationError):
        load_server_settings(tmp_path, {"model_control_mode": "watch"})
