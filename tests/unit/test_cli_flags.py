"""``inferpool serve``'s flags (inferpool.cli_flags): every setting in a help section, its
default as the server applies it, its variables named; and a refused value worded as one
sentence naming its source (inferpool.cli_errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from inferpool.cli import build_parser
from inferpool.cli_errors import allowed, sentences, source_of
from inferpool.cli_flags import FIELD_GROUPS, GROUPS, default_text, flag, mlserver_names
from inferpool.settings import ServerSettings, load_server_settings


def test_every_setting_has_a_help_section() -> None:
    """A new ServerSettings field needs a line in cli_flags.FIELD_GROUPS."""
    missing = sorted(set(ServerSettings.model_fields) - set(FIELD_GROUPS))
    assert not missing, f"add these settings to FIELD_GROUPS in inferpool/cli_flags.py: {missing}"
    assert set(FIELD_GROUPS) <= set(ServerSettings.model_fields)  # no stale line
    assert set(FIELD_GROUPS.values()) <= set(GROUPS)


def test_the_help_lists_each_flag_in_its_section_with_its_default_and_variable() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    assert "PydanticUndefined" not in text
    sections = {name: text.index(f"\n{name.capitalize()}:\n") for name in GROUPS}
    assert list(sections.values()) == sorted(sections.values())  # in GROUPS' order
    ends = [*sorted(sections.values())[1:], len(text)]
    bounds = dict(zip(sections, zip(sorted(sections.values()), ends, strict=True), strict=True))
    for name, group in FIELD_GROUPS.items():
        if name == "model_repository":
            continue
        start, end = bounds[group]
        section = " ".join(text[start:end].split())  # the help's line breaks undone
        assert flag(name) in section, (name, group)
        assert f"INFERPOOL_{name.upper()}" in section, name
    assert "MLSERVER_HTTP_PORT" in text and "MLSERVER_PARALLEL_WORKERS" in text


def test_each_default_shown_is_the_one_applied() -> None:
    settings = ServerSettings()
    for name, field in ServerSettings.model_fields.items():
        shown = default_text(name, field)
        value = getattr(settings, name)
        if name == "workers":
            assert shown == "the number of CPU cores"
        elif name in ("environments_dir", "storage_cache_dir"):
            assert shown.startswith("$XDG_CACHE_HOME") and value is None
        elif value is None:
            assert shown == "unset", name
        elif isinstance(value, bool):
            assert shown == ("on" if value else "off"), name
        elif isinstance(value, list) and not value:
            assert shown == "none", name
        elif isinstance(value, list):  # the histograms' bounds, as the flag takes them
            assert [float(bound) for bound in shown.split(",")] == value, name
        elif isinstance(value, dict):
            assert shown == "none" and not value, name
        else:
            assert shown == str(value), name


def test_mlserver_variables_are_named_only_for_plain_renames() -> None:
    names = mlserver_names()
    assert names["workers"] == "parallel_workers"
    assert names["http_port"] == "http_port"
    assert names["model_repository"] == "model_repository_root"
    # MLSERVER_DEBUG sets two settings; use_structured_logging maps a bool to a format.
    assert "access_log" not in names and "log_format" not in names


def test_allowed_values_come_from_the_settings_constraints() -> None:
    fields = ServerSettings.model_fields
    assert allowed(fields["http_port"]) == "a whole number from 1 to 65535"
    assert allowed(fields["grpc_port"]) == "a whole number of at most 65535"
    assert allowed(fields["workers"]) == "a whole number of at least 0"
    assert allowed(fields["shutdown_timeout"]) == "a number of at least 0"
    assert allowed(fields["log_format"]) == "one of text, json"


def refused(repository: Path | None, overrides: dict) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        load_server_settings(repository, overrides)
    return sentences(caught.value, overrides, repository)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"http_port": "99999"}, "--http-port (REST (V2 HTTP) port) must be a whole number "
         "from 1 to 65535, not 99999."),
        ({"workers": "-3"}, "--workers (worker processes; 0 runs models in the server process) "
         "must be a whole number of at least 0, not -3."),
        ({"log_format": "yaml"}, "must be one of text, json, not yaml."),
        ({"drain_delay": "soon"}, "--drain-delay"),
        ({"model_timeout": "inf"}, "must be a number of at least 0, not inf."),
        ({"log_level": "loud"}, "--log-level: unknown log level 'loud': use one of"),
    ],
)  # fmt: skip
def test_a_refused_flag_is_one_sentence_naming_it(
    tmp_path: Path, overrides: dict, expected: str
) -> None:
    (line,) = refused(tmp_path, overrides)
    assert expected in line and flag(next(iter(overrides))) in line
    assert "\n" not in line and "pydantic" not in line and line.endswith(".")


def test_the_source_named_is_the_one_that_set_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLSERVER_HTTP_PORT", "70000")
    assert refused(tmp_path, {})[0].startswith("MLSERVER_HTTP_PORT ")
    (tmp_path / "settings.json").write_text(json.dumps({"http_port": 0}))
    assert refused(tmp_path, {})[0].startswith(f"{tmp_path / 'settings.json'} key 'http_port' ")
    monkeypatch.setenv("INFERPOOL_HTTP_PORT", "-1")
    assert refused(tmp_path, {})[0].startswith("INFERPOOL_HTTP_PORT ")
    assert refused(tmp_path, {"http_port": "65536"})[0].startswith("--http-port ")
    monkeypatch.delenv("INFERPOOL_HTTP_PORT")
    monkeypatch.delenv("MLSERVER_HTTP_PORT")
    (tmp_path / "settings.json").write_text(json.dumps({"parallel_workers": -2}))
    assert refused(tmp_path, {})[0].startswith(
        f"{tmp_path / 'settings.json'} key 'parallel_workers' "
    )
    assert source_of("workers", {}, None, environ={}) == "the setting workers"
