"""Types of the C extension built from ``_jsonscan.c`` (the JSON tensor scanner)."""

from collections.abc import Callable

import numpy as np

def scan(
    body: bytes,
    allocate: Callable[[int, str], np.ndarray],
    max_elements: int,
    max_bytes: int,
    max_ndim: int,
    /,
) -> tuple[bytes, list[tuple[int, str, tuple[int, ...], np.ndarray | int, int, int]]] | None: ...
def quick_stats() -> tuple[bool, int]: ...
def wide_stats(enable: bool | None = None, /) -> tuple[bool, bool, int]: ...
def wide512_stats(enable: bool | None = None, /) -> tuple[bool, bool, int]: ...
