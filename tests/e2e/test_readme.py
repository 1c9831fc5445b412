"""The README's examples work as written, against the demo repository's models, and every
link in it resolves: to a file of the repository and, with an anchor, to a heading of it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support import Server
from tests.support.readme import page_section

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
        server.wait_ready(timeout=120)
        port = str(server.http_port)
        curl = code_blocks("bash")[2].replace("8080", port)
        argv = shlex.split(curl.replace("\\\n", " "))
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert '"name":"predict","shape":[2],"datatype":"INT64","data":[0,2]' in out
        assert '"predict_proba"' in out
        python = code_blocks("python")[0].replace("8080", port)
        printed = subprocess.run(
            [sys.executable, "-c", python], capture_output=True, text=True, check=True
        ).stdout
        assert printed.strip() == "[0 2]"
        # the explanations guide's example (docs/explain.md, "Example")
        explain_page = page_section("docs/explain.md", "## Example")
        [explain] = re.findall(r"```bash\n(.*?)```", explain_page, flags=re.S)
        argv = shlex.split(explain.replace("8080", port).replace("\\\n", " "))
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert '"name":"contributions","shape":[1,3,5],"datatype":"FP64"' in out
        assert '"parameters":{"score":"probability","class_labels":[0,1,2]}' in out


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings, as MkDocs (Python-Markdown's toc) and
    GitHub make them: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)  # no headings in code
    anchors = set()
    for title in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M):
        plain = re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower()
        anchors.add(re.sub(r"[-\s]+", "-", plain))
    return anchors


def test_every_relative_link_names_a_file_in_the_repository():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [link for link in links if "://" not in link]
    assert "docs/deploy/kserve.md" in relative  # the Documentation section's links are among them
    assert any("#" in link for link in relative)  # and some with an anchor
    broken = []
    for link in relative:
        path, _, anchor = link.partition("#")
        target = README.parent / path if path else README
        if not target.is_file() or (anchor and anchor not in heading_anchors(target.read_text())):
            broken.append(link)
    assert broken == []


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_heading_anchors_are_those_mkdocs_makes():
    page = "# Top\n## Triton's ensembles\n```sh\n# not a heading\n```\n### The `load` API\n"
    assert heading_anchors(page) == {"top", "tritons-ensembles", "the-load-api"}
