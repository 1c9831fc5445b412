"""The fenced code blocks of the documentation's pages, each with its mark (the comment on
the line before its fence saying who runs it: tests/docs/test_code_blocks.py), and how a
runnable block is run against a live server."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support import Server

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```")
DEMO = "<!-- run: demo -->"
EXAMPLE = "<!-- run: example -->"
MARK = re.compile(r"^<!-- (run: demo|run: example|run by (tests/\S+\.py)|not run: (.+\S)) -->$")
# A line naming the file the block after it holds: `models/words/words.py`:
FILE = re.compile(r"^`(models/[^`]+)`:$")
SHELL = ("bash", "sh", "")  # the languages of runnable shell blocks ("": a bare fence)


@dataclass(frozen=True)
class Block:
    page: str  # from the repository's root
    line: int  # of the opening fence
    language: str
    code: str
    mark: str | None  # the comment before the fence, when it is a mark
    file: str | None  # the file the block holds, when a line before it names one


def blocks(text: str, page: str) -> Iterator[Block]:
    """The fenced code blocks of one Markdown page, each with the line before it."""
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        if FENCE.match(lines[index]):
            end = next(i for i in range(index + 1, len(lines)) if FENCE.match(lines[i]))
            mark = lines[index - 1] if index and MARK.match(lines[index - 1]) else None
            named = FILE.match(lines[index - 3]) if mark and index >= 3 else None
            yield Block(
                page,
                index + 1,
                lines[index][3:].strip(),
                "\n".join(lines[index + 1 : end]) + "\n",
                mark,
                named[1] if named and not lines[index - 2] else None,
            )
            index = end
        index += 1


def documentation_blocks() -> list[Block]:
    """Every block of every page under docs/."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    return [b for p in pages for b in blocks(p.read_text(), str(p.relative_to(ROOT)))]


@contextmanager
def served(repository: Path, *flags: str) -> Iterator[Server]:
    """A server on ``repository``, ready (generous: CI shares its cores)."""
    with Server(repository, *flags) as server:
        server.wait_ready(timeout=120)
        yield server


@contextmanager
def served_demo(root: Path) -> Iterator[Server]:
    """The demo repository (``inferpool serve --demo``'s models) built under ``root``,
    served in-process (``--workers 0``), as the pages' first requests expect it."""
    from inferpool.demo import build_demo_repository

    with served(build_demo_repository(root), "--workers", "0") as server:
        yield server


def on_ports(code: str, server: Server) -> str:
    """The block with the documented ports (8080 REST, 8081 gRPC, 8082 metrics) replaced
    by the server's."""
    ports = {8080: server.http_port, 8081: server.grpc_port, 8082: server.metrics_port}
    for documented, port in ports.items():
        code = code.replace(f":{documented}", f":{port}")
    return code


def serve_flags(block: Block) -> list[str]:
    """The flags of the block's ``inferpool serve models ...`` line (the test serves)."""
    for line in block.code.splitlines():
        if line.startswith("inferpool serve "):
            return line.removesuffix("&").split()[3:]
    return []


def run(block: Block, server: Server, cwd: Path) -> str:
    """Run a Python block in a fresh interpreter, or a shell block's commands (but the
    line starting the server, which the test has started) with bash, failing on an HTTP
    error; what it printed."""
    code = on_ports(block.code, server)
    if block.language == "python":
        argv = [sys.executable, "-c", code]
    else:
        assert block.language in SHELL, f"{block.page}:{block.line}: {block.language}"
        lines = [line for line in code.splitlines() if not line.startswith("inferpool serve")]
        script = "\n".join(lines).replace("curl ", "curl --fail-with-body ")
        argv = ["bash", "-e", "-o", "pipefail", "-c", script]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{block.page}:{block.line}\n{done.stderr}{done.stdout}"
    return done.stdout


def promised(block: Block) -> list[str]:
    """What a Python block says its prints print (a ``# ...`` comment after ``print(...)``,
    ``...`` standing for anything), as regular expressions."""
    comments = re.findall(r"print\(.*\)\s+# (.+)$", block.code, flags=re.M)
    return [re.escape(comment).replace(re.escape("..."), ".*") for comment in comments]
