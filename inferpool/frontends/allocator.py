"""glibc malloc's thresholds in the server process: request bodies of a few hundred KB stay
on the heap, instead of being faulted in again for every request.

glibc serves an allocation of 128 KiB or more (a 137 KB JSON body read whole) with an mmap
of its own, or from the top of the heap once its dynamic threshold has risen, and gives
the top of the heap back to the system whenever more than twice that threshold lies free
there. Either way each such request pays page faults in the frontend: about 4 a request
and 8-22 µs of system time for LightGBM batch 256 over REST JSON (benchmarks/RESULTS.md).
Fixed thresholds end that: allocations under ``MMAP_THRESHOLD`` come from the heap, and up
to ``TRIM_THRESHOLD`` free at its top is kept. Larger bodies are still mapped and given
back when freed, so the memory a flood of large bodies took comes back as before.
"""

from __future__ import annotations

import ctypes
import logging
import platform

logger = logging.getLogger(__name__)

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 1 << 20  # 1 MiB: what is above is mapped, and unmapped when freed
TRIM_THRESHOLD = 4 << 20  # 4 MiB free at the heap's top before it is given back


def keep_bodies_on_the_heap() -> bool:
    """Set both thresholds where the C library is glibc; False where it is not (musl,
    macOS) or refused them, and the allocator then works as it did."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done: bool = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    if not done:
        logger.debug("glibc refused the malloc thresholds; its defaults stay")
    return done
