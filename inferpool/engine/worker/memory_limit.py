"""A worker's memory limits, enforced by the kernel: ``--worker-memory-limit`` and a model's
``max_memory`` (docs/operate/memory.md, "Memory limits").

The worker caps its address space (``RLIMIT_AS``) once it has started: at what it maps
then (everything it shares copy-on-write with the template: the preloaded models, the
imported libraries, the rings' shared memory) plus the limit plus a reserve for the
stacks of the threads its libraries start (``reserve``). So shared pages never count
against a worker, and an allocation past the limit fails at once, inside the worker, as
a ``MemoryError`` (numpy: ``Unable to allocate ...``), before a page of it is touched:
the host is never at risk, and the worker stays up. glibc's malloc keeps a 64 MiB
reservation per arena, one per thread that allocates: a worker under a limit keeps one
arena (``M_ARENA_MAX``), so that a thread costs its stack only.

A model's ``max_memory`` lowers the soft limit for its calls only: to what the worker
maps when the call starts plus ``max_memory``, with no reserve (two ``setrlimit`` and one read of
``/proc/self/statm`` per call of such a model; other models pay nothing).

A ``MemoryError`` under a limit becomes a 500 naming the model and the limit
(``out_of_memory``, hooked into ``Reply.from_error``). One at the worker's limit also
asks the server to replace this worker (``Recycle``): what tripped it may be a leak, and
a library that failed half-way may have left its state unusable.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
from collections.abc import Iterator

from inferpool.engine.ipc import messages
from inferpool.errors import InferpoolError, ModelError, ModelLoadError

logger = logging.getLogger(__name__)

MIB = 1 << 20
M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)
STACK = 8 * MIB  # a thread's stack when RLIMIT_STACK sets none (glibc's usual default)
SPARE_THREADS = 4  # threads beyond the native pools': the streams' thread, a runtime's own
_PAGE = os.sysconf("SC_PAGE_SIZE")


def mapped() -> int:
    """Bytes of address space this process maps now (VmSize)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[0]) * _PAGE


def reserve(threads: int) -> int:
    """Address space kept for thread stacks: each of the native pools' threads and a few
    more, at the stack size new threads get (RLIMIT_STACK)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stack = soft if 0 < soft < 256 * MIB else STACK
    return (threads + SPARE_THREADS) * stack


def _one_arena() -> None:
    """One malloc arena for every thread (glibc): no 64 MiB reservation per thread."""
    with contextlib.suppress(OSError, AttributeError):
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt(M_ARENA_MAX, 1)


def _detail(exc: MemoryError) -> str:
    """``MemoryError: Unable to allocate ...`` (Python's own has no message)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class MemoryLimit:
    """The limits of this worker process; ``limit``: bytes, 0 for none."""

    def __init__(self, limit: int, threads: int) -> None:
        self.limit = limit
        self.reserve = reserve(threads)
        self.cap = resource.RLIM_INFINITY  # the hard limit: the worker's
        self.baseline = 0
        self.model_limit = 0  # the max_memory of the call running now, in bytes
        self.tripped: str | None = None  # the worker's limit was hit: why (for Recycle)

    def apply(self) -> None:
        """Cap this process's address space at what it maps now plus the limit (if any)."""
        if self.limit <= 0:
            return
        _one_arena()
        self.baseline = mapped()
        cap = self.baseline + self.limit + self.reserve
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:  # set lower by whoever started the server
            cap = min(cap, hard)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        except (ValueError, OSError) as exc:
            logger.warning("cannot limit this worker's memory: %s", exc)
            return
        self.cap = cap

    @contextlib.contextmanager
    def call(self, max_memory: int | None) -> Iterator[None]:
        """Run a call of a model whose ``max_memory`` (MiB) lowers the limit meanwhile."""
        if not max_memory:
            yield
            return
        soft = mapped() + max_memory * MIB  # (a thread it starts takes its stack from it)
        if self.cap != resource.RLIM_INFINITY and soft >= self.cap:
            yield  # the worker's limit is the lower: it is what an allocation hits
            return
        # What was in force before: the worker's limit, or an outer call's (a predict that
        # waits in a call to another model runs other models' calls meanwhile: calls.py).
        outer_limit, outer = self.model_limit, resource.getrlimit(resource.RLIMIT_AS)
        self.model_limit = max_memory * MIB
        resource.setrlimit(resource.RLIMIT_AS, (soft, self.cap))
        try:
            yield
        finally:
            self.model_limit = outer_limit
            resource.setrlimit(resource.RLIMIT_AS, outer)

    def out_of_memory(self, exc: MemoryError, model: str) -> InferpoolError | MemoryError:
        """The error a call answers when it ran out of memory: a 500 naming the model and
        the limit it hit (the ``MemoryError`` itself when no limit applies)."""
        if self.model_limit:
            mib = self.model_limit // MIB
            reason = f"its calls may allocate {mib} MiB (its max_memory)"
        elif self.limit > 0:
            mib = self.limit // MIB
            reason = f"its worker may allocate {mib} MiB (--worker-memory-limit)"
            self.tripped = f"model '{model}' hit the worker's memory limit ({mib} MiB)"
        else:
            return exc
        message = (
            f"model '{model}' ran out of memory: {reason}; the allocation failed ({_detail(exc)})"
        )
        logger.error("%s", message)
        return ModelError(message)

    def load_failed(self, exc: Exception, model: str) -> Exception:
        """What a load that raised ``exc`` fails with: for a ``MemoryError`` under the
        worker's limit, the reason naming the model and the limit."""
        if not isinstance(exc, MemoryError) or self.limit <= 0:
            return exc
        return ModelLoadError(
            f"model '{model}' ran out of memory while loading: its worker may allocate "
            f"{self.limit // MIB} MiB (--worker-memory-limit) beyond what it shares with "
            f"the template ({_detail(exc)})"
        )

    def take_tripped(self) -> messages.Recycle | None:
        """The request to be replaced, once, after the worker's limit was hit."""
        if self.tripped is None:
            return None
        used = max(0, mapped() - self.baseline) // MIB
        reason = f"{self.tripped}; it maps {used} MiB above its start now"
        self.tripped = None
        return messages.Recycle(reason="memory_limit", detail=reason)


def install(limit: MemoryLimit) -> None:
    """Turn a ``MemoryError`` under ``limit`` into its 500, in every reply of this worker."""
    limit.apply()
    messages.set_out_of_memory(limit.out_of_memory)
