"""The "Custom Python runtimes" guide's example (docs/custom-runtimes.md), run as it is
written: its files are taken from the page, served, and asked the request the page shows."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

from tests.support import Server
from tests.support.readme import page_section, write_example

PAGE = "docs/custom-runtimes.md"
SECTION = "# Custom Python runtimes"


def example_exchange(section: str) -> tuple[dict, dict]:
    """The request body of the page's curl command and the answer it shows."""
    request = json.loads(re.search(r"-d '(\{.*?\})'", section, re.DOTALL).group(1))
    blocks = re.findall(r"```json\n(.*?)```", section, re.DOTALL)
    answer = json.loads(next(block for block in blocks if "outputs" in block))
    return request, answer


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    section = page_section(PAGE, SECTION)
    root = tmp_path_factory.mktemp("readme")
    files = write_example(section, root)
    assert set(files) == {
        "models/fahrenheit/converter.py",
        "models/fahrenheit/coefficients.json",
        "models/fahrenheit/model-settings.json",
    }
    with Server(root / "models", "--workers", "0") as server:
        server.wait_ready()
        yield server, section


def test_readme_request_gets_the_readme_answer(example):
    server, section = example
    request, answer = example_exchange(section)
    response = httpx.post(f"{server.url}/v2/models/fahrenheit/infer", json=request)
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["model_name"] == answer["model_name"]
    expected = answer["outputs"][0]
    (output,) = document["outputs"]
    assert {k: output[k] for k in expected} == expected


def test_readme_metadata_comes_from_the_runtime(example):
    server, _ = example
    metadata = httpx.get(f"{server.url}/v2/models/fahrenheit").json()
    assert metadata["platform"] == "python"
    assert metadata["inputs"] == [{"name": "celsius", "datatype": "FP64", "shape": [-1]}]
    assert metadata["outputs"] == [{"name": "fahrenheit", "datatype": "FP64", "shape": [-1]}]


def test_readme_validation_error_is_the_documented_400(example):
    server, section = example
    message = re.search(r'`\{"error": "(.*?)"\}`', section).group(1)
    body = {"inputs": [{"name": "celsius", "shape": [1], "datatype": "FP64", "data": [-300]}]}
    response = httpx.post(f"{server.url}/v2/models/fahrenheit/infer", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": message}
