"""``inferpool serve`` with a bad value, run as a user runs it: one sentence on stderr
naming the flag (or variable, or settings.json key) and what is allowed, exit 2, no
traceback, and nothing started: the test holds the REST port itself, so a server that got
as far as binding would fail differently (address in use, exit 1)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import free_port


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port this test listens on while the command runs."""
    port = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        yield port


def run(
    args: list[str], port: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``inferpool serve ARGS`` on 127.0.0.1, its REST port the held one unless ``args`` or
    ``env`` name another; gRPC and metrics off unless named (no other port to bind)."""
    given = " ".join([*args, *(env or {})]).lower().replace("_", "-")
    command = [sys.executable, "-m", "inferpool", "serve", *args, "--host", "127.0.0.1"]
    for name, value in (("http-port", str(port)), ("grpc-port", "0"), ("metrics-port", "-1")):
        if name not in given:
            command += [f"--{name}", value]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def assert_one_sentence(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "errors.pydantic.dev" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert result.stdout == ""  # no log line: nothing was started


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--http-port", "99999"], ["--http-port", "from 1 to 65535", "99999"]),
        (["--grpc-port", "70000"], ["--grpc-port", "at most 65535", "disables gRPC"]),
        (["--metrics-port", "65536"], ["--metrics-port", "at most 65535"]),
        (["--workers", "-3"], ["--workers", "at least 0", "-3"]),
        (["--max-queue", "0"], ["--max-queue", "at least 1"]),
        (["--max-body-bytes", "lots"], ["--max-body-bytes", "a whole number", "lots"]),
        (["--log-format", "yaml"], ["--log-format", "one of text, json", "yaml"]),
        (["--grpc-implementation", "fast"], ["--grpc-implementation", "builtin, grpcio"]),
        (["--model-control-mode", "watch"], ["--model-control-mode", "none, explicit, poll"]),
        (["--shutdown-timeout", "-1"], ["--shutdown-timeout", "a number of at least 0"]),
        (["--model-timeout", "inf"], ["--model-timeout", "a number of at least 0", "inf"]),
        (["--drain-delay", "soon"], ["--drain-delay", "soon"]),
        (["--log-level", "loud"], ["--log-level", "debug, info, warning, error"]),
        (["--cors-settings", "{"], ["--cors-settings", "not valid JSON"]),
        (["--no-such-flag"], ["--no-such-flag", "--help"]),
    ],
)
def test_a_bad_flag_is_one_sentence_and_exit_2(
    iris_repo: Path, held_port: int, flags: list[str], needles: list[str]
) -> None:
    assert_one_sentence(run([str(iris_repo), *flags], held_port), *needles)


def test_a_bad_variable_is_named(iris_repo: Path, held_port: int) -> None:
    result = run([str(iris_repo)], held_port, {"INFERPOOL_WORKERS": "-3"})
    assert_one_sentence(result, "INFERPOOL_WORKERS", "at least 0")
    result = run([str(iris_repo)], held_port, {"MLSERVER_HTTP_PORT": "99999"})
    assert_one_sentence(result, "MLSERVER_HTTP_PORT", "from 1 to 65535")


def test_a_bad_settings_file_key_is_named(tmp_path: Path, held_port: int) -> None:
    (tmp_path / "settings.json").write_text(json.dumps({"parallel_workers": -2}))
    result = run([str(tmp_path)], held_port)
    assert_one_sentence(result, "settings.json key 'parallel_workers'", "at least 0", "-2")


def test_a_missing_repository_is_refused_before_any_port_is_bound(
    tmp_path: Path, held_port: int
) -> None:
    missing = tmp_path / "no-such-folder"
    assert_one_sentence(run([str(missing)], held_port), str(missing), "does not exist")
    (tmp_path / "file").write_text("")
    assert_one_sentence(run([str(tmp_path / "file")], held_port), "is not a folder")
    result = run([], held_port, {"INFERPOOL_MODEL_REPOSITORY": str(missing)})
    assert_one_sentence(result, "INFERPOOL_MODEL_REPOSITORY", "does not exist")


def test_an_unreadable_admin_token_file_is_refused_before_any_port_is_bound(
    iris_repo: Path, tmp_path: Path, held_port: int
) -> None:
    result = run([str(iris_repo), "--admin-token-file", str(tmp_path / "no-token")], held_port)
    assert_one_sentence(result, "cannot read the admin token file", str(tmp_path / "no-token"))


def test_no_repository_at_all_says_how_to_name_one(held_port: int) -> None:
    environment = {k: "" for k in os.environ if k.startswith(("INFERPOOL_", "MLSERVER_"))}
    assert_one_sentence(run([], held_port, environment), "name a model repository", "--demo")
