"""The README's examples work as written, against the demo repository's models."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from tests.support import Server

README = Path(__file__).resolve().parents[2] / "README.md"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_setup_commands_are_the_two_documented_ones():
    commands = [b.strip() for b in code_blocks("bash")[:2]]
    assert commands == [
        "pip install -e '.[sklearn]' && python -m inferpool serve --demo",
        "pip install tox && python -m tox",
    ]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "tox" in ci


def test_curl_and_tritonclient_examples(tmp_path):
    from inferpool.demo import build_demo_repository

    repository = build_demo_repository(tmp_path)
    with Server(repository, "--workers", "0") as server:
        server.wait_ready()
        port = str(server.http_port)
        curl = code_blocks("bash")[2].replace("8080", port)
        argv = shlex.split(curl.replace("\\\n", " "))
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert '"name":"predict","shape":[2],"datatype":"INT64","data":[0,2]' in out
        assert '"predict_proba"' in out
        python = code_blocks("python")[0].replace("8080", port)
        printed = subprocess.run(
            ["python", "-c", python], capture_output=True, text=True, check=True
        ).stdout
        assert printed.strip() == "[0 2]"
        [explain] = [block for block in code_blocks("bash") if "/explain" in block]
        argv = shlex.split(explain.replace("8080", port).replace("\\\n", " "))
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert '"name":"contributions","shape":[1,3,5],"datatype":"FP64"' in out
        assert '"parameters":{"score":"probability","class_labels":[0,1,2]}' in out


def test_every_relative_link_names_a_file_in_the_repository():
    links = re.findall(r"\]\(([^)#]+)\)", README.read_text())
    relative = [link for link in links if "://" not in link]
    assert "docs/deploy/kserve.md" in relative  # the Deploy section's links are among them
    missing = [link for link in relative if not (README.parent / link).exists()]
    assert missing == []
