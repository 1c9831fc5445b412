"""Children that cannot outlive the server: the parent-death signal and the lifeline pipe.

When the server dies, SIGKILL included, its template and workers must exit at once, even
busy ones that never see the EOF of their control channel (a template stuck loading a
model, a worker stuck in a ``predict``). Two kernel mechanisms do it with no help from
the dying process:

- the template asks for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``) first
  thing, before it imports anything (``command``: ``import inferpool`` alone takes seconds
  on a busy host), then checks that its parent is still the server, which may have died
  before the call. (The signal follows the *thread* that started the child: the server
  starts its templates from its event loop's thread, which lives as long as it.)
- the server holds the write end of a pipe that is never written to and that no child
  inherits (``read_end`` creates it); the template and each worker open a description of
  its read end of their own, with ``O_ASYNC`` and ``F_SETSIG`` = SIGKILL (``hold``): when
  the last write end closes (the server's exit, however it came), the kernel signals every
  such reader, and SIGKILL cannot be caught, blocked or delayed by a busy process.

Workers cannot use the parent-death signal: their parent is the template, which may exit
while they keep serving (a load started a thread in it, a crash; it is restarted). The
lifeline ties them to the server itself. Each process needs a description of its own
because the owner that ``F_SETOWN`` records is per description, which a fork shares.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_ENV = "INFERPOOL_PARENT_PID"  # the pid the prelude expects for its parent
# What ``python -c`` runs first: builtins and ctypes only, a few milliseconds. (Without
# prctl, not Linux, the channel's EOF still ends the child, once it reads it.) prctl's
# arguments after the first are unsigned longs.
PRELUDE = f"""\
import ctypes, os
prctl = getattr(ctypes.CDLL(None), "prctl", None)
if prctl is not None:
    prctl({PR_SET_PDEATHSIG}, *map(ctypes.c_ulong, ({int(signal.SIGKILL)}, 0, 0, 0)))
if os.getppid() != int(os.environ.pop({PARENT_ENV!r})):
    os._exit(1)
"""
# Then the module, as ``python -m`` runs it (``sys.argv``: the module, then its arguments).
_RUN_MODULE = """\
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
_pipe: tuple[int, int] | None = None  # this process's lifeline: (read end, write end)


def command(module: str, *args: str) -> list[str]:
    """The argv that runs ``module`` with ``args`` in this interpreter, killed when the
    thread that starts it exits; the child's environment must give this process's pid in
    ``PARENT_ENV``."""
    return [sys.executable, "-c", PRELUDE + _RUN_MODULE, module, *args]


def read_end() -> int:
    """The read end of this process's lifeline, for a child to ``hold``: created at the
    first call, both ends then kept open until this process exits (that exit is the
    signal). Close-on-exec: a child gets it only when passed explicitly."""
    global _pipe
    if _pipe is None:
        _pipe = os.pipe2(os.O_CLOEXEC)
        # A child forked without exec (``os.fork``, multiprocessing) must not keep the
        # write end: the lifeline would hold until that child too had exited.
        os.register_at_fork(after_in_child=_forget)
    return _pipe[0]


def _forget() -> None:
    global _pipe
    if _pipe is not None:
        for end in _pipe:
            os.close(end)
        _pipe = None


def hold(lifeline: int) -> int:
    """Be killed (SIGKILL) when no process holds the write end of the pipe ``lifeline``
    reads any more; exit now if none already does. Returns this process's own descriptor
    of the pipe (close-on-exec), from which a process it forks can ``hold`` in turn; -1
    where the kernel offers no way (the channel's EOF then ends this process)."""
    try:
        own = os.open(f"/proc/self/fd/{lifeline}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        fcntl.fcntl(own, fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(own, fcntl.F_SETSIG, signal.SIGKILL)
        fcntl.fcntl(own, fcntl.F_SETFL, fcntl.fcntl(own, fcntl.F_GETFL) | os.O_ASYNC)
    except (OSError, AttributeError):
        os.close(own)
        return -1
    # Armed from now on; the write end may have closed before: then a read says EOF
    # (with a writer left, an empty pipe says EAGAIN).
    try:
        if os.read(own, 1) == b"":
            os._exit(1)
    except BlockingIOError:
        pass
    return own
