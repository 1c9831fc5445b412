"""The generated reference pages (scripts/docs_reference.py) hold every flag, metric, error
class and endpoint the code has, and refuse what they have no words for."""

from __future__ import annotations

import argparse
import re

import pytest

from inferpool.cli import build_parser
from inferpool.errors import InferpoolError
from inferpool.frontends.metrics import FAMILIES
from scripts import docs_reference
from scripts.docs_reference import PAGES, Undocumented


def serve_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["serve"]


def test_every_serve_flag_has_its_row_with_its_variable() -> None:
    page = PAGES["reference/cli.md"]()
    flags = [a for a in serve_parser()._actions if a.option_strings and a.dest != "help"]
    assert len(flags) > 60
    first_cells = [line.split(" | ")[0] for line in page.splitlines() if line.startswith("| `--")]
    listed = {flag for cell in first_cells for flag in re.findall(r"`(--[\w-]+)`", cell)}
    for action in flags:
        assert set(action.option_strings) <= listed, action.option_strings
    [row] = [line for line in page.splitlines() if line.startswith("| `--max-body-bytes` |")]
    assert "`INFERPOOL_MAX_BODY_BYTES`" in row and "| `max_body_bytes`" in row
    assert "`MLSERVER_PARALLEL_WORKERS`" in page  # MLServer's variable, where it has one
    assert "## `inferpool env pack`" in page  # every command, not only serve


def test_every_metric_family_is_listed() -> None:
    page = PAGES["reference/metrics.md"]()
    for family in FAMILIES:
        assert f"`{family.name}" in page
    server = docs_reference.server_metric_families()
    names = {name for name, _, _ in server}
    assert {
        "inferpool_build_info",
        "inferpool_worker_restarts",
        "inferpool_process_cpu_seconds",
    } <= names
    assert "`inferpool_worker_restarts_total` | counter" in page


def test_every_error_class_is_listed_with_its_statuses() -> None:
    classes = docs_reference.error_classes()
    assert InferpoolError in classes
    page = PAGES["reference/errors.md"]()
    for cls in classes:
        assert f"| `{cls.__name__}` |" in page
    assert "| `ModelNotFound` | `inferpool.errors` | 404 | NOT_FOUND |" in page


def test_every_endpoint_is_listed() -> None:
    page = PAGES["reference/endpoints.md"]()
    for path, _ in docs_reference.rest_routes():
        assert f"`{path}`" in page
    assert "`inference.GRPCInferenceService/ModelInfer`" in page
    assert "`grpc.health.v1.Health/Watch`" in page
    assert "`/v2/models/{name}[/versions/{version}]/explain` | POST" in page


@pytest.mark.parametrize(
    ("table", "entry"),
    [
        ("REST_ROUTES", "{model}/generate"),
        ("GRPC_METHODS", "ModelInfer"),
        ("MODEL_ENDPOINTS", "explain"),
    ],
)
def test_an_endpoint_without_words_fails_the_page(
    monkeypatch: pytest.MonkeyPatch, table: str, entry: str
) -> None:
    words = dict(getattr(docs_reference, table))
    del words[entry]
    monkeypatch.setattr(docs_reference, table, words)
    with pytest.raises(Undocumented, match=entry.rpartition("/")[2]):
        PAGES["reference/endpoints.md"]()
