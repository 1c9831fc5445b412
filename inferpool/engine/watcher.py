"""``--model-control-mode poll``: the repository is watched, and its folders decide.

As in Triton's poll mode, a model folder that appears is loaded, one that changes is
reloaded (a reload that fails leaves the previous version serving) and one that is
removed is unloaded (requests already queued are answered) and dropped from the index.
The repository API works beside it: a model it loads is followed from then on, and one
it unloads stays unloaded until its folder changes. The unit is a top-level
folder of the repository and every model version ``discover`` finds in it (nested model
folders, numbered versions): when it changes, each is (re)loaded and those no longer found
are unloaded. A folder is acted on once nothing in it has changed for
``repository_debounce`` seconds, so a copy written file by file loads once it is
complete. A top-level folder whose name cannot name a model is ignored (logged once), as
are hidden files and folders, ``__pycache__`` and editor temporary files.

``RepositoryWatcher`` runs two tasks: one takes ``watchfiles`` batches and notes which
top-level folders were touched, the other acts on each folder once it is quiet. Errors
are logged; neither task dies of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from inferpool.engine.repository import Discovered, discover, name_problem
from inferpool.engine.states import ModelKey, ModelState, describe_key
from inferpool.errors import ModelNotFound

if TYPE_CHECKING:
    from inferpool.engine.client import EngineClient

logger = logging.getLogger(__name__)

STEP_MS = 50  # watchfiles hands over a batch once no change came for this long
IDLE_MS = 1000  # and an empty one this often: the folders are then compared (missed events)
RETRY_SECONDS = 5.0  # after the watch itself failed (e.g. the repository was removed)

# vim (.swp, .swx..., its "4913" write probe), emacs (#name#; .#name is hidden anyway),
# backups (name~), compiled Python, and partial downloads or copies.
_TEMPORARY = re.compile(r"(\.sw[a-z]|~|\.py[cod]|\.tmp|\.part|\.crdownload)$|^#.*#$|^4913$")


def ignored(parts: tuple[str, ...]) -> bool:
    """Whether a path (its parts below the repository) never counts as a model's change.

    Top-level names starting with ``.`` or ``_`` are not model folders (``discover``
    skips them); below, hidden files and folders, ``__pycache__`` and editor temporary
    files are not part of a model.
    """
    if not parts or parts[0].startswith((".", "_")):
        return True
    return any(
        part.startswith(".") or part == "__pycache__" or _TEMPORARY.search(part) for part in parts
    )


def touched_folders(root: Path, paths: Iterable[str]) -> set[str]:
    """The top-level names of the repository that ``paths`` (absolute) changed."""
    folders = set()
    for path in paths:
        try:
            parts = Path(path).relative_to(root).parts
        except ValueError:
            continue
        if not ignored(parts):
            folders.add(parts[0])
    return folders


def action(exists: bool, loaded_as: str | None) -> str | None:
    """What a touched folder asks for: ``load``, ``reload``, ``unload`` or nothing.

    ``exists``: the folder is (still) a folder; ``loaded_as``: the model it was loaded
    as (at start-up or by this watcher), if any.
    """
    if exists:
        return "reload" if loaded_as is not None else "load"
    return "unload" if loaded_as is not None else None


class RepositoryWatcher:
    """Follows one repository for one client: load, reload, unload per model folder."""

    def __init__(self, client: EngineClient, repository: Path, debounce: float) -> None:
        self.client = client
        self.repository = repository
        self.root = repository.absolute()
        self.debounce = max(0.0, debounce)
        # top-level folder -> the model versions loaded from it (key -> model name)
        self.models: dict[str, dict[ModelKey, str]] = {}
        self._pending: dict[str, float] = {}  # folder -> when it is acted on (monotonic)
        self._busy: set[str] = set()  # folders being acted on
        self._warned: set[str] = set()  # invalid folder names already logged
        self._wake = asyncio.Event()
        # watchfiles' thread checks this every step: setting it ends the watch promptly.
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, found: Iterable[Discovered]) -> None:
        """Start watching; ``found`` is what the start-up load is loading."""
        noisy = logging.getLogger("watchfiles")  # "N changes detected" at INFO, every batch
        if noisy.level == logging.NOTSET and not logger.isEnabledFor(logging.DEBUG):
            noisy.setLevel(logging.WARNING)
        self.adopt(found)
        for coroutine in (self._watch(), self._act()):
            task = asyncio.get_running_loop().create_task(coroutine)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        logger.info(
            "watching the model repository %s (--model-control-mode poll, %.2fs quiet)",
            self.repository,
            self.debounce,
        )

    def adopt(self, found: Iterable[Discovered]) -> None:
        """Follow the folders of models loaded elsewhere (start-up, the repository API):
        a later change reloads them, their removal unloads them."""
        for discovered in found:
            folder = self._folder_of(discovered)
            if folder is not None:
                self.models.setdefault(folder, {})[discovered.key] = discovered.name

    async def stop(self) -> None:
        self._stop.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    # -- the watch --------------------------------------------------------------------------
    async def _watch(self) -> None:
        from watchfiles import awatch

        while not self._stop.is_set():
            try:
                async for changes in awatch(
                    self.root,
                    watch_filter=self._counts,
                    debounce=max(STEP_MS, int(self.debounce * 1000)),
                    step=STEP_MS,
                    stop_event=self._stop,
                    rust_timeout=IDLE_MS,
                    yield_on_timeout=True,
                    recursive=True,
                    ignore_permission_denied=True,
                ):
                    if changes:
                        self._touch(touched_folders(self.root, (path for _, path in changes)))
                    else:
                        # Idle (and the first time, once the watch is set up): folders
                        # that appeared or went without an event seen, e.g. while
                        # start-up read the repository, are acted on too.
                        self._compare()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the watch must outlive any error
                logger.error(
                    "watching the model repository %s failed (retrying in %.0fs): %s",
                    self.repository,
                    RETRY_SECONDS,
                    exc,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), RETRY_SECONDS)

    def _counts(self, _change: object, path: str) -> bool:
        try:
            return not ignored(Path(path).relative_to(self.root).parts)
        except ValueError:
            return False

    def _touch(self, folders: Iterable[str]) -> None:
        when = time.monotonic() + self.debounce
        for folder in folders:
            self._pending[folder] = when
            self._wake.set()

    def _compare(self) -> None:
        try:
            present = {
                path.name
                for path in self.repository.iterdir()
                if path.is_dir() and not ignored((path.name,))
            }
        except OSError:
            present = set()
        differ = (present ^ self.models.keys()) - self._pending.keys() - self._busy
        self._touch(folder for folder in differ if folder not in self._warned)

    # -- acting on quiet folders ----------------------------------------------------------
    async def _act(self) -> None:
        while True:
            now = time.monotonic()
            due = [f for f, at in self._pending.items() if at <= now and f not in self._busy]
            for folder in due:
                del self._pending[folder]
                self._busy.add(folder)
                task = asyncio.get_running_loop().create_task(self._sync(folder))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            waiting = [at for f, at in self._pending.items() if f not in self._busy]
            self._wake.clear()
            timeout = max(0.0, min(waiting) - now) if waiting else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _sync(self, folder: str) -> None:
        try:
            if not self.client.stopping:
                await self._sync_folder(folder)
        except asyncio.CancelledError:
            raise
        except Exception:  # never kills the watcher; the client has logged a load's failure
            logger.exception("model folder '%s': acting on its change failed", folder)
        finally:
            self._busy.discard(folder)
            self._wake.set()  # it may have changed again meanwhile

    async def _sync_folder(self, folder: str) -> None:
        previous = self.models.get(folder, {})
        exists = (self.repository / folder).is_dir()
        if exists and not previous:
            problem = name_problem(folder)
            if problem is not None:
                if folder not in self._warned:
                    self._warned.add(folder)
                    logger.warning("ignoring the folder %r of the repository: %s", folder, problem)
                return
        everything = discover(self.repository) if exists or previous else []
        found = [d for d in everything if self._folder_of(d) == folder]
        if not found and not previous:
            # Nothing to serve in it (version policies left its versions out), or gone:
            # noted, so that the idle comparison leaves it alone until it changes.
            if exists:
                self.models[folder] = {}
            else:
                self.models.pop(folder, None)
            return
        todo = action(bool(found), next(iter(previous.values()), None))
        if todo is None:
            return
        current = {discovered.key: discovered.name for discovered in found}
        if todo == "unload":
            logger.info("model folder '%s' was removed: unloading %s", folder, _names(previous))
            del self.models[folder]
        else:
            how = "changed" if todo == "reload" else "appeared"
            logger.info("model folder '%s' %s: loading %s", folder, how, _names(current))
            self.models[folder] = current
        statuses = [await self.client.lifecycle.load_discovered(discovered) for discovered in found]
        failed = [status.reason for status in statuses if status.state is not ModelState.READY]
        for key, name in previous.items():
            if key in current:
                continue
            # Gone, or its settings now name another model or version: unloaded, unless
            # what replaces it failed; then it keeps serving until the folder changes again.
            kept = self.client.table.get(key)
            if failed and kept is not None and kept.state is ModelState.READY:
                kept.reason = "reload failed: " + "; ".join(failed)
                current[key] = name
            else:
                await self._unload(name, key)
        await self._follow_policies(folder, {*current.values(), *previous.values()}, everything)

    async def _follow_policies(
        self, folder: str, names: set[str], everything: list[Discovered]
    ) -> None:
        """MLServer's layout keeps a model's versions in several folders, and the latest
        one's version policy chooses among them all: after ``folder`` changed, versions of
        its models that other folders hold are loaded or unloaded as the policy now says
        (``everything``: what the repository holds now, policies applied)."""
        held = {d.key for d in everything if d.name in names}
        for other, models in self.models.items():
            if other == folder:
                continue
            for key, name in list(models.items()):
                if name in names and key not in held:
                    logger.info("%s: left out by its version policy", describe_key(key))
                    del models[key]
                    await self._unload(name, key)
        for discovered in everything:
            holder = self._folder_of(discovered)
            if discovered.name not in names or holder is None or holder == folder:
                continue
            if discovered.key not in self.models.setdefault(holder, {}):
                logger.info("%s: served by its version policy", describe_key(discovered.key))
                self.models[holder][discovered.key] = discovered.name
                await self.client.lifecycle.load_discovered(discovered)

    async def _unload(self, name: str, key: ModelKey) -> None:
        if any(key in keys for keys in self.models.values()):
            return  # another folder holds that model version now
        with contextlib.suppress(ModelNotFound):
            await self.client.lifecycle.unload_named(name, key)

    def _folder_of(self, discovered: Discovered) -> str | None:
        """The top-level folder a discovered model was read from (None: the root)."""
        folder = discovered.folder
        if folder is None or folder == self.repository:
            return None
        try:
            return folder.relative_to(self.repository).parts[0]
        except ValueError:
            return None


def _names(models: dict[ModelKey, str]) -> str:
    return ", ".join(f"'{name}'" for name in sorted(set(models.values())))
