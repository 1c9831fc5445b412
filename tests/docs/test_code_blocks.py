"""Every code block of the documentation (docs/**/*.md) is run, or says why not: the line
before its opening fence is one of

- ``<!-- run: demo -->``: run here against the demo repository (a shell block's commands
  with bash, a Python block in a fresh interpreter), the documented ports the server's;
- ``<!-- run: example -->``: the page's example, run here: its blocks holding a file
  (`models/...` named on the line before) are written into a repository, which is served
  (with the flags of the page's ``inferpool serve`` line), then its other blocks are run;
- ``<!-- run by tests/....py -->``: that test file runs it, and names the page it reads;
- ``<!-- not run: REASON -->``: with the reason.

A block with none of them fails ``test_every_block_is_run_or_says_why_not``. What a Python
block says it prints (``print(x)  # [0 2]``), it prints."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Server
from tests.support.code_blocks import (
    DEMO,
    EXAMPLE,
    MARK,
    ROOT,
    Block,
    blocks,
    documentation_blocks,
    promised,
    run,
    serve_flags,
    served,
    served_demo,
)

pytestmark = pytest.mark.timeout(300)


def test_every_block_is_run_or_says_why_not() -> None:
    found = documentation_blocks()
    assert len(found) > 50  # the pages' blocks are all found
    unmarked = [f"{b.page}:{b.line}" for b in found if b.mark is None]
    assert unmarked == [], (
        "mark each: <!-- run: demo -->, <!-- run by ... -->, <!-- not run: why -->"
    )


def test_a_block_run_elsewhere_is_run_by_a_test_reading_its_page() -> None:
    elsewhere = [b for b in documentation_blocks() if b.mark and b.mark.startswith("<!-- run by")]
    assert elsewhere
    for block in elsewhere:
        test = MARK.match(block.mark or "")[2]  # type: ignore[index]
        source = (ROOT / test).read_text()
        assert block.page in source, (
            f"{test} does not read {block.page} ({block.page}:{block.line})"
        )


def test_blocks_are_read_with_their_marks_and_files() -> None:
    page = (
        "text\n\n<!-- not run: output -->\n```text\nout\n```\n\n```bash\nls\n```\n\n"
        "`models/m/m.py`:\n\n<!-- run: example -->\n```python\npass\n```\n"
    )
    found = [(b.line, b.language, b.mark, b.file) for b in blocks(page, "p.md")]
    assert found == [
        (4, "text", "<!-- not run: output -->", None),
        (8, "bash", None, None),
        (15, "python", EXAMPLE, "models/m/m.py"),
    ]


def check_prints(block: Block, printed: str) -> None:
    lines = printed.splitlines()
    for expected, line in zip(promised(block), lines, strict=False):
        assert re.fullmatch(expected, line), f"{block.page}:{block.line}: {line!r}"
    assert printed.strip(), f"{block.page}:{block.line} printed nothing"


DEMO_BLOCKS = [b for b in documentation_blocks() if b.mark == DEMO]
EXAMPLE_PAGES = sorted({b.page for b in documentation_blocks() if b.mark == EXAMPLE})


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with served_demo(tmp_path_factory.mktemp("demo")) as server:
        yield server


@pytest.mark.parametrize("block", DEMO_BLOCKS, ids=lambda b: f"{b.page}:{b.line}")
def test_demo_blocks_run(block: Block, demo: Server, tmp_path: Path) -> None:
    check_prints(block, run(block, demo, tmp_path))


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_example_blocks_run(page: str, tmp_path: Path) -> None:
    example = [b for b in documentation_blocks() if b.page == page and b.mark == EXAMPLE]
    files = [b for b in example if b.file]
    assert files, f"{page}: an example with no file"
    for block in files:
        (tmp_path / str(block.file)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / str(block.file)).write_text(block.code)
    commands = [b for b in example if not b.file]
    assert commands, f"{page}: an example with nothing to run"
    flags = [flag for block in commands for flag in serve_flags(block)]
    with served(tmp_path / "models", *flags) as server:
        for block in commands:
            check_prints(block, run(block, server, tmp_path))
