"""Giving freed heap pages back (``engine/worker/heap.py``): ``malloc_trim(0)`` where glibc
has it, nothing where it does not."""

from __future__ import annotations

import ctypes

import pytest

from inferpool.engine.worker import heap


def test_freed_pages_are_trimmed_with_malloc_trim_0(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "_malloc_trim", lambda: lambda pad: calls.append(pad) or 1)
    heap.release_freed_memory()
    assert calls == [0]


def test_without_malloc_trim_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_glibc(name: object) -> object:
        raise OSError("not glibc")

    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", no_glibc)
    try:
        assert heap._malloc_trim() is None
        heap.release_freed_memory()  # and raises nothing
    finally:
        heap._malloc_trim.cache_clear()


def test_this_glibc_has_it() -> None:
    heap._malloc_trim.cache_clear()
    assert heap._malloc_trim() is not None
    heap.release_freed_memory()
