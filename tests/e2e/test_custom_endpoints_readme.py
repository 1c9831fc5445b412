"""The "Custom endpoints and feedback" guide's example (docs/custom-endpoints.md, "Example"),
run as it is written: its files,
its curl commands (against the served port) and its gRPC snippet."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support import Server
from tests.support.readme import page_section, write_example

PAGE = "docs/custom-endpoints.md"
SECTION = "## Example"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    section = page_section(PAGE, SECTION)
    root = tmp_path_factory.mktemp("readme")
    files = write_example(section, root)
    assert set(files) == {"models/churn/churn.py", "models/churn/model-settings.json"}
    with Server(root / "models", "--workers", "0") as server:
        server.wait_ready()
        yield server, section


def curl_commands(section: str, port: int) -> list[list[str]]:
    """The section's curl commands (the serve line is the fixture's), as argv lists."""
    (script,) = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    joined = script.replace("localhost:8080", f"127.0.0.1:{port}")
    commands = re.split(r"\n(?=\S)", joined.strip())
    return [shlex.split(command) for command in commands if command.startswith("curl")]


def test_the_curl_commands_answer_as_shown(example: tuple[Server, str]) -> None:
    server, section = example
    commands = curl_commands(section, server.http_port)
    assert len(commands) == 5
    outputs = [
        subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
        for argv in commands
    ]
    shown = re.findall(r"```json\n(\{\"threshold.*?)\n```", section)[0]
    assert outputs[0] == shown
    assert outputs[1] == '{"threshold":0.7}'
    assert outputs[2] == '{"threshold":0.7}'  # the bare path reaches the one model
    assert outputs[3] == "{}"
    assert outputs[4] == "n,reward\n0,1.0\n"


def test_the_grpc_snippet_prints_the_answer(example: tuple[Server, str]) -> None:
    server, section = example
    (snippet,) = re.findall(r"```python\n(import grpc.*?)```", section, re.DOTALL)
    code = snippet.replace("localhost:8081", server.grpc_address)
    printed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert printed.startswith('200 application/json b\'{"threshold":')
