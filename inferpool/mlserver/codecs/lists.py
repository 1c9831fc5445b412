"""Helpers for payloads that are a list of strings (bytes) or a single one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def is_list_of(payload: Any, instance_type: type | tuple[type, ...]) -> bool:
    """A list whose items are all ``instance_type`` (an empty list is one)."""
    return isinstance(payload, list) and all(isinstance(item, instance_type) for item in payload)


def as_list(payload: Any) -> Iterator[Any]:
    """The items of a list, or a single item as a list of one."""
    if isinstance(payload, list):
        yield from payload
    else:
        yield payload
