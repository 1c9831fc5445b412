"""The models the template process holds, shared copy-on-write by the workers it forks.

The frontend asks the template for a model (``preload``) at start-up, when it loads one
through the API or the watcher, and after the template restarted; the template loads it
once and every worker forked afterwards holds the same pages. Only runtimes whose
loading starts no native thread pool are loaded there (a parent that has run OpenMP code
must not fork): those ``runtimes.registry.is_fork_safe`` allows. A load that starts a
thread anyway (a runtime wrongly marked safe) makes the template unsafe to fork from: the
answer says so and the template exits (``template.py``); the frontend then has each
worker load that model. A worker asked to load a model takes the template's copy when
the settings and the files of the model's folder are unchanged since, and loads it
itself otherwise. ``unpreload`` drops a copy (refcounts free it; no ``gc.collect()``,
which would touch every shared page).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from inferpool.engine.ipc.fingerprint import fingerprint
from inferpool.engine.ipc.messages import Loading, PreloadResult
from inferpool.engine.worker import template
from inferpool.engine.worker.announce import announcing
from inferpool.engine.worker.heap import release_freed_memory
from inferpool.engine.worker.model import LoadedModel, failure_reason, load_model
from inferpool.runtimes.footprint import model_footprint
from inferpool.runtimes.registry import is_fork_safe, preload_modules
from inferpool.settings import ModelSettings

logger = logging.getLogger(__name__)


class _Copy(NamedTuple):
    """One model version the template holds."""

    fingerprint: bytes  # what it was loaded from (``fingerprint``)
    model: LoadedModel
    size: int  # its footprint in bytes
    epoch: int  # the template's epoch when it came in


# By (name, version): the versions of one model are held side by side.
_PRELOADED: dict[tuple[str, str | None], _Copy] = {}


# How long threads a load leaves behind may take to end on their own. A library that ran
# a thread pool for one call (joblib's, for a scikit-learn forest with ``n_jobs`` set,
# which the tree kernel's check at load calls) lets the pool's threads end after it
# returns: on a busy host they were still listed for a few milliseconds.
THREADS_SETTLE = 2.0


def thread_count() -> int:
    """The threads of this process (a fork copies only the calling one)."""
    return len(os.listdir("/proc/self/task"))


def threads_left(before: int, settle: float = THREADS_SETTLE) -> int:
    """How many more threads than ``before`` this process has once those that are ending
    have ended, waiting up to ``settle`` seconds for them."""
    deadline = time.monotonic() + settle
    while (started := thread_count() - before) > 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    return started


def preload(
    documents: list[dict[str, Any]], epoch: int, send: Callable[[Loading], None] | None = None
) -> tuple[list[PreloadResult], int]:
    """Load (or keep) the models of ``documents`` (model settings as JSON).

    ``epoch`` is the template's; each copy loaded now increments it. Each load is announced
    through ``send`` first, if given (``announce.py``). Returns one result per document and the new
    epoch. A result with ``forked_threads`` ends the list: this process must not fork any
    more.
    """
    results = []
    for document in documents:
        result = _preload_one(document, epoch + 1, send)
        epoch = max(epoch, result.epoch)
        results.append(result)
        if result.forked_threads:
            break
    # What the loaders freed (and a replaced copy) would otherwise stay mapped here and in
    # every worker forked from now on.
    release_freed_memory()
    return results, epoch


def _preload_one(
    document: dict[str, Any], epoch: int, send: Callable[[Loading], None] | None
) -> PreloadResult:
    """The result of holding one model; a copy loaded now gets ``epoch``."""
    name, version = key = _key(document)
    try:
        settings = ModelSettings(**document)
        if not is_fork_safe(settings):
            error = "its runtime may start threads while loading"
            return PreloadResult(name, version, False, error, shareable=False)
    except Exception as exc:  # the worker loads it itself and reports the reason
        return PreloadResult(name, version, False, failure_reason(exc), shareable=False)
    stamp = fingerprint(document)
    entry = _PRELOADED.get(key)
    if entry is not None and entry.fingerprint == stamp:
        return PreloadResult(name, version, True, size=entry.size, epoch=entry.epoch)
    # Its runtime's modules, here before its first model, so that every worker forked
    # from now on shares them (a missing library is skipped: the load says why).
    template.preload(preload_modules(settings))
    threads = thread_count()
    try:
        if send is None:
            model = load_model(settings)
        else:
            with announcing(send, name, version):
                model = load_model(settings)
    except Exception as exc:
        # A copy loaded from older files stays: the workers serving it share its pages.
        return PreloadResult(name, version, False, failure_reason(exc))
    started = threads_left(threads)
    if started > 0:
        error = (
            f"loading it started {started} thread(s) in the worker template process, "
            "which must stay single-threaded to fork"
        )
        return PreloadResult(name, version, False, error, shareable=False, forked_threads=True)
    size = model_footprint(model)
    _PRELOADED[key] = _Copy(stamp, model, size, epoch)
    return PreloadResult(name, version, True, size=size, epoch=epoch)


def unpreload(name: str, version: str | None) -> bool:
    """Drop the copy of a model version; whether there was one."""
    if _PRELOADED.pop((name, version), None) is None:
        return False
    release_freed_memory()
    return True


def forget(model: LoadedModel) -> None:
    """A worker unloaded ``model``: drop its inherited reference to the template's copy,
    so that the copy's pages are freed once the template drops its own."""
    for key, entry in list(_PRELOADED.items()):
        if entry.model is model:
            del _PRELOADED[key]


def preloaded(document: dict[str, Any]) -> tuple[LoadedModel, int] | None:
    """The template's copy of this model and its footprint, if it is still what the
    settings describe. (The footprint comes along: walking the copy's objects in a
    worker would write to their shared pages.)"""
    entry = _PRELOADED.get(_key(document))
    if entry is None or entry.fingerprint != fingerprint(document):
        return None
    return entry.model, entry.size


def _key(document: dict[str, Any]) -> tuple[str, str | None]:
    """(name, version) of a model's settings document, as ``preload`` keys its copies."""
    parameters = document.get("parameters") or {}
    return document.get("name", ""), parameters.get("version")
