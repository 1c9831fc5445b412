"""The ring's counters: 64-bit words stored with release and loaded with acquire semantics,
and the sequentially consistent pair for its doorbell word.

The C extension (``_atomics.c``) gives both on any CPU. An install without a C compiler
has no extension: on x86-64, whose total store order makes every aligned store a release
and every load an acquire, plain 8-byte stores and loads are exact and serve instead; on
any other CPU the ring would not be correct without it, so importing this module fails.
"""

from __future__ import annotations

import platform
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

_native: ModuleType | None
try:
    from inferpool.engine.ipc import _atomics as _native
except ImportError:  # installed without a C compiler
    _native = None

_WORD = struct.Struct("=Q")  # native byte order, as the C functions


def _store(buffer: Any, offset: int, value: int, /) -> None:
    _WORD.pack_into(buffer, offset, value)


def _load(buffer: Any, offset: int, /) -> int:
    value: int = _WORD.unpack_from(buffer, offset)[0]
    return value


Store = Callable[[Any, int, int], None]
Load = Callable[[Any, int], int]


def _choose() -> tuple[Store, Load, Store, Load]:
    if _native is not None:
        native = _native
        return native.store_release, native.load_acquire, native.store_seq_cst, native.load_seq_cst
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise ImportError(
            "inferpool.engine.ipc._atomics is not built: the worker pool's shared-memory "
            f"ring needs it on {platform.machine()}; reinstall inferpool with a C compiler"
        )
    return _store, _load, _store, _load


store_release, load_acquire, store_seq_cst, load_seq_cst = _choose()
# The C functions, not the x86-64 fallback. Without them the seq_cst pair is only a
# release store and an acquire load (x86-64 may run the load first), so the ring's
# doorbell must not rely on it: ``Ring.needs_bell`` then always says ring.
NATIVE = _native is not None
