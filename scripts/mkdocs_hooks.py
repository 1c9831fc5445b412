"""MkDocs hooks (``hooks:`` in mkdocs.yml): the reference pages of scripts/docs_reference.py
added to the site as it builds, so that the published reference is always the code's; and
the repository's files the pages link to (deploy/ manifests, benchmark results and charts)
published beside them under ``repo/``, so that a link that works on the repository's own
pages works on the site too. A link to a file that does not exist is left as it is, and
``mkdocs build --strict`` fails on it."""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # mkdocs loads this file by path: the checkout's packages
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File, Files  # noqa: E402
from mkdocs.structure.pages import Page  # noqa: E402

from scripts.docs_reference import PAGES  # noqa: E402

# A Markdown link or image target: ](path) or ](path#anchor).
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")
PUBLISHED = "repo"  # where the repository's linked files land in the site


def _where(src_uri: str) -> str:
    """The repository folder a site file comes from: docs/..., or a published file's own."""
    folder = posixpath.dirname(src_uri)
    if folder == PUBLISHED or folder.startswith(PUBLISHED + "/"):
        return folder[len(PUBLISHED) + 1 :]
    return posixpath.join("docs", folder)


def _outside_file(src_uri: str, target: str) -> str | None:
    """The repository path of ``target`` linked from the site file ``src_uri`` when it is
    a file of the repository outside docs/, else None."""
    if "://" in target or target.startswith(("mailto:", "/")):
        return None
    resolved = posixpath.normpath(posixpath.join(_where(src_uri), target))
    if resolved.startswith(("docs/", "../")) or not (ROOT / resolved).is_file():
        return None
    return resolved


def _docs_page(src_uri: str, target: str) -> str | None:
    """The path under docs/ of ``target`` linked from a published file, else None (a page
    of docs/ links to its neighbours as they are)."""
    if not src_uri.startswith(PUBLISHED + "/") or "://" in target or target.startswith("/"):
        return None
    resolved = posixpath.normpath(posixpath.join(_where(src_uri), target))
    return resolved.removeprefix("docs/") if resolved.startswith("docs/") else None


def on_files(files: Files, config: Any) -> Files:
    """Each generated page (written in memory: nothing lands in docs/), and each file of
    the repository a page links to, under ``repo/``."""
    for path, write in PAGES.items():
        files.append(File.generated(config, path, content=write()))
    # The files the pages link to, and those the published Markdown files link to in turn.
    pending = [
        (page.src_uri, Path(page.abs_src_path))
        for page in files.documentation_pages()
        if page.abs_src_path is not None  # not the generated reference
    ]
    published: set[str] = set()
    while pending:
        src_uri, source = pending.pop()
        if source.suffix != ".md":
            continue
        for target, _ in LINK.findall(source.read_text()):
            outside = _outside_file(src_uri, target)
            if outside is not None and outside not in published:
                published.add(outside)
                pending.append((f"{PUBLISHED}/{outside}", ROOT / outside))
    for path in sorted(published):
        files.append(File.generated(config, f"{PUBLISHED}/{path}", abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    """Links to the repository's files point at their published copies."""

    here = posixpath.dirname(page.file.src_uri) or "."

    def published(match: re.Match[str]) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        outside = _outside_file(page.file.src_uri, target)
        if outside is not None:
            return f"]({posixpath.relpath(f'{PUBLISHED}/{outside}', here)}{anchor})"
        inside = _docs_page(page.file.src_uri, target)
        if inside is not None:  # a published file (the README) linking into docs/
            return f"]({posixpath.relpath(inside, here)}{anchor})"
        return match.group(0)

    return LINK.sub(published, markdown)
