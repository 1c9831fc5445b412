"""The getting-started page's KServe SDK example (docs/getting-started.md), run as it is
written against the demo repository, in a Python process of its own (kserve and
tritonclient cannot share one: conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Server
from tests.support.code_blocks import ROOT, blocks, promised, run, served_demo

PAGE = "docs/getting-started.md"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served_demo(tmp_path_factory.mktemp("demo")) as server:
        yield server


def test_the_kserve_sdk_example_prints_what_it_says(demo: Server, tmp_path: Path) -> None:
    text = (ROOT / PAGE).read_text()
    [example] = [b for b in blocks(text, PAGE) if "from kserve import" in b.code]
    assert example.mark is not None and "tests/clients/test_docs_examples.py" in example.mark
    printed = run(example, demo, tmp_path)
    assert promised(example) == [r"\[0\ 2\]"]
    assert printed.strip() == "[0 2]"
