"""The gzip compressor of the answers (``rest/gzip``, ``grpc/compression``): ISA-L's
(the ``isal`` package, in ``inferpool[all]``) when it is installed, else zlib's.

ISA-L's level 1 gzips a V2 JSON answer 3-4x faster than zlib's level 1, a little smaller
(benchmarks/RESULTS.md, 2026-12-06, "Response compression"). Its levels are 0-3; the
setting's zlib level maps onto them (1-3 → 1, 4-6 → 2, 7-9 → 3).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

GZIP_WBITS = 16 + zlib.MAX_WBITS


def _isal() -> Callable[[bytes, int], bytes] | None:
    try:
        from isal import isal_zlib
    except ImportError:
        return None

    def compress(body: bytes, level: int) -> bytes:
        return isal_zlib.compress(body, (level + 2) // 3, wbits=GZIP_WBITS)

    return compress


def _zlib(body: bytes, level: int) -> bytes:
    return zlib.compress(body, level, wbits=GZIP_WBITS)


#: gzip ``body`` at zlib level ``level`` (1-9): a gzip member any gzip reader inflates
gzipped: Callable[[bytes, int], bytes] = _isal() or _zlib
#: which library compresses: "isal" or "zlib"
LIBRARY = "zlib" if gzipped is _zlib else "isal"
