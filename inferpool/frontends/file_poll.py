"""Files re-read when they change: TLS certificates and keys, the API key file.

A stat poll rather than ``watchfiles`` (which the repository watcher uses): a Kubernetes
Secret or cert-manager rotates a mounted file by swapping a symbolic link over a hidden
folder, which an inotify watch on the file itself never sees, and a poll of a few files
once a second costs nothing. ``FilePoll.changed`` compares what ``os.stat`` says of every
file (following links: inode, size, modification time) with the last time it was asked.
``poll_forever`` runs one reload callback on the server's loop whenever that changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

logger = logging.getLogger("inferpool")

POLL_SECONDS = 1.0

Signature = tuple[tuple[int, int, int] | None, ...]


def signature(paths: Sequence[Path]) -> Signature:
    """What ``os.stat`` says of each file (None: missing or unreadable now)."""
    marks: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            marks.append(None)
        else:
            marks.append((info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(marks)


class FilePoll:
    """A set of files, and whether they changed since the last reload that succeeded."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.loaded = signature(self.paths)  # what the last successful load read

    def changed(self) -> Signature | None:
        """The files' signature if it differs from the loaded one, else None."""
        now = signature(self.paths)
        return now if now != self.loaded else None


async def poll_forever(
    poll: FilePoll, reload: Callable[[], None], what: str, interval: float = POLL_SECONDS
) -> None:
    """Call ``reload`` whenever ``poll``'s files change; a reload that raises (a key
    written before its certificate, a half-written file) is logged once per state of the
    files and tried again at their next change, the old contents serving meanwhile."""
    failed: Signature | None = None
    while True:
        await asyncio.sleep(interval)
        now = poll.changed()
        if now is None or now == failed:
            continue
        try:
            reload()
        except Exception as exc:  # the files are the user's: any error is theirs to fix
            failed = now
            logger.warning("%s changed but cannot be used (the previous one serves): %s", what, exc)
            continue
        poll.loaded, failed = now, None
        logger.info("%s reloaded", what)


def start_polling(
    poll: FilePoll, reload: Callable[[], None], what: str, interval: float = POLL_SECONDS
) -> asyncio.Task[None]:
    """``poll_forever`` as a task of the running loop (cancel it to stop)."""
    return asyncio.get_running_loop().create_task(poll_forever(poll, reload, what, interval))


async def stop_polling(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
