"""Loads announced to the frontend before they run, so that a load that kills its process
is blamed on its model and file.

The template, each worker and the load probe send a ``Loading`` message before loading a
model, and another before the runtime opens each artefact (``runtimes.load_errors``
calls back): if the process crashes, aborts or is killed as hung before it answers, the
frontend's last ``Loading`` names the culprit (``engine/pool/load_blame.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from inferpool.engine.ipc.messages import Loading
from inferpool.runtimes.load_errors import listen


@contextmanager
def announcing(
    send: Callable[[Loading], None], name: str, version: str | None, only_read: bool = False
) -> Iterator[None]:
    """Announce the load of model ``name`` (``version``) and each file its runtime opens;
    ``only_read``: the load stops once its artefact is read (``load_errors.ArtefactRead``)."""
    send(Loading(name=name, version=version))

    def opening(file: str, library: str) -> None:
        send(Loading(name=name, version=version, file=file, library=library))

    listen(opening, stop_after_reading=only_read)
    try:
        yield
    finally:
        listen(None)
