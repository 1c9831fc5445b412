"""docs/runtimes/onnx.md's example, as written: its Python converts a classifier, a server
serves the folder, and its curl request gets the answer the page describes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support import Server

PAGE = Path(__file__).resolve().parents[2] / "docs" / "runtimes" / "onnx.md"


def test_the_pages_example_serves_what_it_says(tmp_path: Path) -> None:
    text = PAGE.read_text()
    example = text[text.index("## Example") : text.index("## Metadata")]
    (script,) = re.findall(r"```python\n(.*?)```", example, re.DOTALL)
    (shell,) = re.findall(r"```sh\n(.*?)```", example, re.DOTALL)
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, env=os.environ)
    body = json.loads(re.search(r"-d '(.*?)'", shell, re.DOTALL).group(1))

    with Server(tmp_path / "models", "--workers", "0") as server:
        server.wait_ready(timeout=120)
        metadata = httpx.get(f"{server.url}/v2/models/iris-onnx", timeout=10).json()
        reply = httpx.post(f"{server.url}/v2/models/iris-onnx/infer", json=body, timeout=30)

    assert metadata["platform"] == "onnx"
    assert reply.status_code == 200, reply.text
    label, probabilities = reply.json()["outputs"]
    assert (label["name"], label["datatype"], label["data"]) == ("output_label", "INT64", [0, 2])
    assert (probabilities["name"], probabilities["datatype"]) == ("output_probability", "FP32")
    assert probabilities["shape"] == [2, 3]
