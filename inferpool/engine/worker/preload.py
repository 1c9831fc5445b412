"""Models the template process loads before it forks, shared copy-on-write by workers.

Only runtimes whose loading starts no native thread pool are loaded there (a parent
that has run OpenMP code must not fork): those the runtime registry marks ``fork_safe``
(``runtimes/registry.py``). A worker asked to load a model takes the template's copy when
the settings and the files of the model's folder are unchanged since, and loads it itself
otherwise.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson

from inferpool.engine.worker.model import LoadedModel, load_model
from inferpool.runtimes.registry import is_fork_safe
from inferpool.settings import ModelSettings

logger = logging.getLogger(__name__)

# By (name, version): the versions of one model are preloaded side by side.
_PRELOADED: dict[tuple[str, str | None], tuple[bytes, LoadedModel]] = {}


def fingerprint(document: dict[str, Any]) -> bytes:
    """The model's settings plus the size and mtime of every file in its folder."""
    folder = document.get("folder")
    files = []
    if folder and Path(folder).is_dir():
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                stat = path.stat()
                files.append((str(path), stat.st_size, stat.st_mtime_ns))
    return orjson.dumps([document, files])


def preload(documents: list[dict[str, Any]]) -> None:
    """Load the fork-safe models among ``documents`` (model settings as JSON)."""
    for document in documents:
        try:
            settings = ModelSettings(**document)
            if not is_fork_safe(settings):
                continue
            _PRELOADED[_key(document)] = (fingerprint(document), load_model(settings))
        except Exception as exc:  # the worker loads it itself and reports the reason
            logger.debug("not preloading %s: %s", document.get("name"), exc)


def preloaded(document: dict[str, Any]) -> LoadedModel | None:
    """The template's copy of this model, if it is still what the settings describe."""
    entry = _PRELOADED.get(_key(document))
    if entry is None or entry[0] != fingerprint(document):
        return None
    return entry[1]


def _key(document: dict[str, Any]) -> tuple[str, str | None]:
    """(name, version) of a model's settings document, as ``preload`` keys its copies."""
    parameters = document.get("parameters") or {}
    return document.get("name", ""), parameters.get("version")
