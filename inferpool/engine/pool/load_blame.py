"""The sentence for a model whose load killed the process loading it.

The template, the workers and the load probe announce each load, and each file a runtime
opens, before running it (``worker/announce.py``); when such a process dies before it
answers, its last announcement and its wait status make one sentence naming the file and
the library (``runtimes.load_errors.crashed``), e.g. ``model.txt is not a valid LightGBM
model (the process aborted while LightGBM parsed it; the file may be truncated or
corrupt)``. ``Verdicts`` keeps those sentences per model version and the files they were
about, so that the same files are never loaded again (no restart loop) while changed ones
are.
"""

from __future__ import annotations

import os
import signal

from inferpool.engine.ipc.messages import Loading
from inferpool.engine.pool.crashes import describe_exit
from inferpool.engine.states import ModelKey
from inferpool.runtimes.load_errors import crashed


def how_it_ended(status: int | None, hung: float | None = None) -> str:
    """What happened to the process, as the sentence says it: "aborted", "crashed
    (SIGSEGV)", "hung for 30 s and was killed", "exited with code 1"."""
    if hung is not None:
        return f"hung for {hung:g} s and was killed"
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number == signal.SIGABRT:
            return "aborted"
        if number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
            return f"crashed ({signal.Signals(number).name})"
    return describe_exit(status)


def blame(loading: Loading, status: int | None, hung: float | None = None) -> str:
    """Why the load ``loading`` announced failed, its process having ended with ``status``
    (a waitpid status; None: unknown) or been killed as hung after ``hung`` seconds."""
    how = how_it_ended(status, hung)
    if loading.file:
        return crashed(loading.file, loading.library, how)
    return f"the process loading it {how} while its runtime's load() ran (no model file opened yet)"


class Verdicts:
    """Model versions whose load killed its process, with the files they were loaded from
    (their fingerprint): asked again for the same files, they fail at once with the same
    sentence; once the files change, they are loaded again."""

    def __init__(self) -> None:
        self._by_key: dict[ModelKey, tuple[bytes, str]] = {}

    def record(self, key: ModelKey, fingerprint: bytes, reason: str) -> None:
        self._by_key[key] = (fingerprint, reason)

    def reason(self, key: ModelKey, fingerprint: bytes) -> str | None:
        """The sentence for this version if it killed a process with these very files."""
        verdict = self._by_key.get(key)
        if verdict is None:
            return None
        if verdict[0] != fingerprint:
            del self._by_key[key]  # changed since: worth loading again
            return None
        return verdict[1]
