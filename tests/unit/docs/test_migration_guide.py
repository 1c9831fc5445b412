"""docs/migrating-from-mlserver.md cannot go stale (issue 38, point 8): every row of its
support tables names the tests that prove it (``Tested by `tests/...py::test_name```),
each named test exists, and the rows of the settings tables say what the code's mapping
(``mlserver_env.SERVER_RULES``, ``mlserver_models``) does: supported, refused with a
warning, or refused with an error. Each refused server setting also warns or stops the
start as its row says."""

from __future__ import annotations

import ast
import json
import logging
import re
from functools import cache
from pathlib import Path

import pytest

from inferpool.cli import main
from inferpool.mlserver.contract.model_settings import (
    MODEL_REFUSED,
    MODEL_SUPPORTED,
    PARAMETERS_REFUSED,
    PARAMETERS_SUPPORTED,
)
from inferpool.mlserver.contract.server_settings import SERVER_RULES
from inferpool.settings import load_server_settings

ROOT = Path(__file__).parents[3]
GUIDE = ROOT / "docs" / "migrating-from-mlserver.md"
TESTED_BY = re.compile(r"Tested by (.*)$")
NODE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def tables() -> dict[str, list[tuple[int, list[str]]]]:
    """Each table's rows, by the heading it sits under: (line number, cells)."""
    found: dict[str, list[tuple[int, list[str]]]] = {}
    heading = ""
    lines = GUIDE.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and not line.startswith("|---"):
            if number < len(lines) and lines[number].startswith("|---"):
                continue  # a header row
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            found.setdefault(heading, []).append((number, cells))
    return found


ROWS = [(heading, number, cells) for heading, rows in tables().items() for number, cells in rows]


@cache
def defined(path: str) -> frozenset[str]:
    """The test functions a test file defines or imports (collected there)."""
    tree = ast.parse((ROOT / path).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return frozenset(name for name in names if name.startswith("test"))


def named_tests(row: str) -> list[tuple[str, str]]:
    tested = TESTED_BY.search(row)
    return NODE.findall(tested.group(1)) if tested else []


def test_the_guide_has_its_tables() -> None:
    headings = {heading for heading, _, _ in ROWS}
    for expected in ("Server settings", "Model settings", "REST", "gRPC", "Custom runtimes"):
        assert any(heading.startswith(expected) for heading in headings), expected
    assert len(ROWS) > 100


@pytest.mark.parametrize(("heading", "line", "cells"), ROWS, ids=[f"line{n}" for _, n, _ in ROWS])
def test_every_row_names_tests_that_exist(heading: str, line: int, cells: list[str]) -> None:
    row = " | ".join(cells)
    named = named_tests(row)
    hint = "end it with 'Tested by `tests/...py::test_name`'"
    assert named, f"line {line} ({heading}: {cells[0]}) names no test: {hint}"
    for path, name in named:
        assert (ROOT / path).is_file(), f"line {line}: no file {path}"
        assert name in defined(path), f"line {line}: {path} has no test {name}"


def _status(cells: list[str]) -> str:
    text = cells[1]
    if text.startswith("refused, error"):
        return "error"
    if text.startswith("refused, warning"):
        return "warning"
    assert text.startswith("supported"), cells
    return "supported"


def _rows_of(prefix: str) -> dict[str, list[str]]:
    (rows,) = [rows for heading, rows in tables().items() if heading.startswith(prefix)]
    return {re.findall(r"`([^`]+)`", cells[0])[0]: cells for _, cells in rows}


def test_each_server_setting_row_says_what_the_mapping_does() -> None:
    rows = _rows_of("Server settings")
    assert set(rows) == set(SERVER_RULES)
    for key, rule in SERVER_RULES.items():
        status = _status(rows[key])
        if rule.convert is not None:
            assert status == "supported", key
        else:
            # A refusal that can be fatal is written "refused, error when ...".
            assert status == ("error" if rule.fatal is not None else "warning"), key


def test_each_model_setting_and_parameter_row_says_what_the_mapping_does() -> None:
    for prefix, supported, refused in (
        ("Model settings", MODEL_SUPPORTED, MODEL_REFUSED),
        ("`parameters`", PARAMETERS_SUPPORTED, PARAMETERS_REFUSED),
    ):
        rows = _rows_of(prefix)
        assert set(rows) == supported | set(refused), prefix
        for key, cells in rows.items():
            assert _status(cells) == ("supported" if key in supported else "warning"), key


REFUSED = sorted(key for key, rule in SERVER_RULES.items() if rule.convert is None)
# A value that asks for what inferpool leaves out (MLServer's defaults say nothing).
ASKING = {bool: True, str: "x", int: 7}


def _asking(key: str) -> object:
    values = {
        "kafka_enabled": True,
        "root_path": "/prefix",
        "model_repository_implementation": "my.Repository",
        "model_repository_implementation_args": {"a": 1},
        "extensions": ["x"],
        "logging_settings": "logging.ini",
        "parallel_workers_timeout": 9,
    }
    return values.get(key, ASKING.get(SERVER_RULES[key].kind, "x"))


@pytest.mark.parametrize("key", REFUSED)
def test_each_refused_server_setting_warns_or_stops_the_start_as_its_row_says(
    key: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = _asking(key)
    (tmp_path / "settings.json").write_text(json.dumps({key: value}))
    if _status(_rows_of("Server settings")[key]) == "error":
        assert main(["serve", str(tmp_path)]) == 2
        assert key in capsys.readouterr().err
        return
    with caplog.at_level(logging.WARNING, "inferpool"):
        load_server_settings(tmp_path, {})
    reason = SERVER_RULES[key].reason
    assert key in caplog.text and reason in caplog.text, caplog.text


# Each supported setting given in settings.json, and what its row says it sets.
SUPPORTED = [
    ("debug", True, "log_level", "debug"),
    ("parallel_workers", 3, "workers", 3),
    ("environments_dir", "/srv/envs", "environments_dir", Path("/srv/envs")),
    ("load_models_at_startup", False, "load_models_at_startup", False),
    ("host", "0.0.0.0", "host", "0.0.0.0"),
    ("http_port", 9123, "http_port", 9123),
    ("grpc_port", 9124, "grpc_port", 9124),
    ("grpc_max_message_length", 1000, "max_body_bytes", 1000),
    ("metrics_endpoint", None, "metrics_port", -1),
    ("metrics_port", 9125, "metrics_port", 9125),
    ("use_structured_logging", True, "log_format", "json"),
    ("gzip_enabled", False, "gzip_enabled", False),
]


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"), SUPPORTED, ids=[s[0] for s in SUPPORTED]
)
def test_each_supported_server_setting_sets_what_its_row_names(
    tmp_path: Path, key: str, value: object, field: str, expected: object
) -> None:
    row = _rows_of("Server settings")[key][1]
    assert f"`{field}`" in row or f"`{field}=" in row, row
    (tmp_path / "settings.json").write_text(json.dumps({key: value}))
    settings = load_server_settings(tmp_path, {})
    actual = getattr(settings, field)
    assert (Path(actual) if isinstance(expected, Path) else actual) == expected


def test_the_supported_settings_are_each_checked() -> None:
    # cors_settings and model_repository_root (under the command-line argument, which a
    # settings.json always has) have their own tests.
    checked = {key for key, *_ in SUPPORTED} | {"cors_settings", "model_repository_root"}
    assert checked == {key for key, rule in SERVER_RULES.items() if rule.convert is not None}


def test_a_dotenv_file_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLServer's settings read ``MLSERVER_*`` lines of a ``.env`` file; inferpool does not."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("MLSERVER_HTTP_PORT=9321\nMLSERVER_PARALLEL_WORKERS=5\n")
    settings = load_server_settings(tmp_path, {})
    assert settings.http_port != 9321 and settings.workers != 5


def test_inferpool_mlserver_leaves_out_settings_and_the_repository_types() -> None:
    import inferpool.mlserver as mlserver

    assert hasattr(mlserver, "MLModel")
    for name in ("Settings", "ModelRepository"):
        assert not hasattr(mlserver, name), name
    with pytest.raises(ImportError):
        exec("from inferpool.mlserver import Settings", {})


def test_the_generated_code_carries_no_protobuf_runtime_check() -> None:
    generated = ROOT / "inferpool" / "protocol" / "generated"
    files = sorted(generated.glob("*_pb2*.py"))
    assert files
    for path in files:
        assert "ValidateProtobufRuntimeVersion" not in path.read_text(), path.name
