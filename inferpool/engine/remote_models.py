"""The models whose ``parameters.uri`` names a remote object (``remote_fetch``): fetched
before they load, and followed in poll mode; and a remote repository given to
``inferpool serve`` (``fetch_repository``), fetched once at start-up.

``RemoteModels.localise`` runs in the lifecycle's load, before the load goes where models
run: it describes and fetches the object in a thread (the server's loop keeps answering)
and hands back the model's settings with ``uri`` pointing at the local copy, which the
template and the workers then load as any file. A failed fetch raises ModelLoadError:
the model is FAILED with that one sentence.

In ``--model-control-mode poll`` each model version that named a remote object is
followed: every ``storage_poll_interval`` seconds its object is described again (one
request), and a new version (ETag, generation...) reloads it through the lifecycle, as a
changed model folder does: the version serving keeps serving until the new one is READY,
and a reload that fails is not retried until the object changes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferpool.engine.daemon_thread import in_daemon_thread
from inferpool.engine.remote_fetch import (
    MIB,
    Limits,
    describe,
    failure_sentence,
    fetch,
    is_remote,
)
from inferpool.engine.repository import Discovered
from inferpool.engine.states import ModelKey, describe_key
from inferpool.errors import ModelLoadError
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)
_THREAD = "inferpool-fetch"


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/inferpool/storage``, or ``~/.cache/inferpool/storage``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec: a relative value is invalid and is ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "inferpool" / "storage"


def storage_limits(settings: ServerSettings) -> Limits:
    """The cache, size limit and timeout the settings give remote fetches."""
    return Limits(
        settings.storage_cache_dir or default_cache(),
        settings.storage_max_size * MIB,
        settings.storage_timeout,
    )


def fetch_repository(uri: str, overrides: dict[str, Any]) -> Path:
    """``inferpool serve s3://bucket/models``: the local copy of a remote repository (a
    prefix of model folders), fetched once at start-up with the storage settings of
    ``overrides`` (the flags) and the environment. A snapshot: poll mode follows the remote
    objects its models name, not later changes to the repository's own files.
    ValidationError for bad settings, ModelLoadError when it cannot be fetched."""
    return fetch(uri, storage_limits(ServerSettings(**overrides)))


@dataclass
class Followed:
    """A model version loaded from a remote object, and the version it was loaded at."""

    found: Discovered
    uri: str
    version: str | None


class RemoteModels:
    """Fetches remote models before their load; follows them in poll mode."""

    def __init__(self, settings: ServerSettings) -> None:
        self.limits = storage_limits(settings)
        self.interval = settings.storage_poll_interval
        self.followed: dict[ModelKey, Followed] = {}
        self._seen: dict[ModelKey, str] = {}  # the version the last fetch saw, per key
        self._task: asyncio.Task[None] | None = None

    async def localise(self, key: ModelKey, settings: ModelSettings) -> ModelSettings:
        """``settings`` with a remote ``uri`` replaced by its local copy (fetched in a
        thread, if the cache does not hold that version); others as they are."""
        uri = settings.parameters.uri
        if not is_remote(uri):
            return settings
        assert uri is not None
        try:
            remote = await in_daemon_thread(describe, uri, self.limits, name=_THREAD)
            self._seen[key] = remote.version
            path = await in_daemon_thread(fetch, uri, self.limits, remote, name=_THREAD)
        except ModelLoadError:
            raise
        except Exception as exc:  # whatever else: the model's failure, never the server's
            raise ModelLoadError(failure_sentence(uri, exc, self.limits.timeout)) from None
        logger.info("%s: %s is at %s", describe_key(key), remote.uri, path)
        parameters = settings.parameters.model_copy(update={"uri": str(path)})
        return settings.model_copy(update={"parameters": parameters})

    def loaded(self, found: Discovered) -> None:
        """A load of ``found`` ended (READY or FAILED): follow its object from the
        version that load saw (None: it could not be described; any version reloads)."""
        settings = found.settings
        if settings is None or not is_remote(settings.parameters.uri):
            return
        assert settings.parameters.uri is not None
        version = self._seen.pop(found.key, None)
        self.followed[found.key] = Followed(found, settings.parameters.uri, version)

    def forget(self, key: ModelKey) -> None:
        """The version was unloaded: no longer followed."""
        self.followed.pop(key, None)
        self._seen.pop(key, None)

    # -- poll mode ------------------------------------------------------------------------
    def start(self, reload: Callable[[Discovered], Awaitable[object]]) -> None:
        """Check the followed objects every ``interval`` seconds, ``reload`` the changed."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll(reload))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _poll(self, reload: Callable[[Discovered], Awaitable[object]]) -> None:
        failing: set[ModelKey] = set()  # whose object could not be described (logged once)
        while True:
            await asyncio.sleep(self.interval)
            followed = list(self.followed.items())
            # Together: a silent store holds up its own objects' checks only.
            checks = [
                in_daemon_thread(describe, f.uri, self.limits, name=_THREAD) for _, f in followed
            ]
            described = await asyncio.gather(*checks, return_exceptions=True)
            for (key, entry), remote in zip(followed, described, strict=True):
                if isinstance(remote, BaseException):
                    if key not in failing:
                        failing.add(key)
                        logger.warning(
                            "%s: cannot check for a change: %s", describe_key(key), remote
                        )
                    continue
                failing.discard(key)
                if remote.version == entry.version or self.followed.get(key) is not entry:
                    continue
                logger.info("%s: %s changed: reloading", describe_key(key), remote.uri)
                entry.version = remote.version  # acted on once, whatever the reload gives
                try:
                    await reload(entry.found)
                except Exception:  # the poll must outlive any error
                    logger.exception("%s: reloading failed", describe_key(key))
