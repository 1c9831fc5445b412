"""The worker template process, kept running and holding the models workers share.

``TemplateKeeper`` starts the template (``template_process.TemplateProcess``), has it preload the
repository's fork-safe models before it forks the first workers, and restarts it when it
dies (reaped, counted, backing off); a restarted template preloads the models served
now. A model whose load started a thread in the template is never asked of it again
(``unshareable``: each worker loads it) and the template restarts, since nothing may be
forked from a process with threads. A model whose load kills the template (a crash, an
abort, or a load hung past ``load_timeout``: the template announces each load first,
``load_blame.py``) fails with one sentence naming its file and library, and the template
restarts once, without it: the same files are never asked of it again (``verdicts``).
``Supervisor`` owns the keeper and asks it for the running template before each fork;
``Generations`` asks it to preload models loaded after start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.fingerprint import fingerprint
from inferpool.engine.pool.crashes import ExitStatuses, describe_exit
from inferpool.engine.pool.load_blame import Verdicts, blame
from inferpool.engine.pool.outages import MAX_BACKOFF, Outages
from inferpool.engine.pool.template_process import TemplateProcess
from inferpool.engine.states import ModelKey, describe_key, model_key
from inferpool.errors import ModelLoadError, NotReady, WorkerLost

logger = logging.getLogger(__name__)

# How long a fork waits for the template to be up and preloaded (or for the next model it
# begins to load): its start is imports, which a starved host (CI's installs beside it,
# measured) stretched past 60 s; a hung load is load_timeout's business.
START_TIMEOUT = 180.0
WATCH_INTERVAL = 0.5  # how often a load under way is checked against ``load_timeout``
# How many times one model's preload is asked again after the template died while loading
# another model (each death takes its own culprit out: this bounds a run of bad luck).
PRELOAD_ATTEMPTS = 4


class ServedDocuments(Protocol):
    """What the keeper asks the pool: the models a restarted template preloads."""

    def shared_documents(self) -> list[dict[str, Any]]: ...

    @property
    def started(self) -> bool: ...


class TemplateKeeper:
    """The template process: started, preloaded, restarted; what it may not hold."""

    def __init__(
        self,
        exits: ExitStatuses,
        outages: Outages,
        served: ServedDocuments,
        stopping: Callable[[], bool],
        keep: Callable[[Coroutine[Any, Any, Any]], None],
        gone: Callable[[], None],
        python: Path | None = None,
        load_timeout: float = 0.0,
    ) -> None:
        self.python = python  # another environment's interpreter; None: the server's
        self.exits = exits
        self.outages = outages
        self.served = served
        self.stopping = stopping
        self.keep = keep
        self.gone = gone  # the template exited: workers it had not forked yet never will be
        self.template: TemplateProcess | None = None
        # Model versions whose load started a thread in the template: never asked again,
        # each worker loads them (by key, the reason).
        self.unshareable: dict[ModelKey, str] = {}
        # Model versions whose load killed the template: never asked of it again with the
        # same files (``load_blame.Verdicts``).
        self.verdicts = Verdicts()
        self.load_timeout = load_timeout  # 0: a load may take forever
        self._asked: dict[ModelKey, dict[str, Any]] = {}  # documents sent, by key
        self._started_at = time.monotonic()  # of the template running or restarting now
        self.restarts = 0  # readable by metrics and tests
        self._up: asyncio.Event | None = None
        self._start_documents: list[dict[str, Any]] = []  # the repository's at start-up

    def start(self, documents: list[dict[str, Any]]) -> None:
        """Start the template; it is up once it has preloaded the fork-safe ``documents``."""
        self._up = asyncio.Event()
        self._start_documents = documents
        self._start(documents)

    def _start(self, documents: list[dict[str, Any]]) -> None:
        template = TemplateProcess(self.exits.reported, self._template_gone, self.python)
        self.template = template
        self._started_at = time.monotonic()
        self.outages.template_up(time.monotonic())
        self.keep(self._preload_then_open(template, documents))
        if self.load_timeout > 0:
            self.keep(self._watch(template))

    async def _preload_then_open(
        self, template: TemplateProcess, documents: list[dict[str, Any]]
    ) -> None:
        wanted = [d for d in documents if self._askable(d)]
        if wanted:
            try:
                if not self.note_results(await self._ask(template, wanted)):
                    return  # it exits: its restart preloads the others
            except WorkerLost:
                return  # its restart preloads them again
        if template is self.template:
            assert self._up is not None
            self._up.set()

    def note_results(self, results: list[messages.PreloadResult]) -> bool:
        """Remember the models whose load started a thread in the template (never shared);
        False if one did: the template exits, nothing may be forked from it any more."""
        safe = True
        for result in results:
            if result.forked_threads:
                safe = False
                assert self._up is not None
                self._up.clear()  # until its restart has preloaded
                key = model_key(result.name, result.version)
                self.unshareable[key] = result.error
                logger.warning(
                    "%s is not shared between workers: %s; each worker loads it, and the "
                    "worker template process restarts", describe_key(key), result.error,
                )  # fmt: skip
        return safe

    async def preload(self, document: dict[str, Any]) -> messages.PreloadResult | None:
        """The template's load of one model version, to share with the workers it forks;
        None when each worker must load it (the template does not hold it).

        ModelLoadError if its load killed the template (now or before, with these files);
        if the template died loading another model, it is asked again once restarted.
        """
        key = document_key(document)
        for _ in range(PRELOAD_ATTEMPTS):
            self._check_verdict(key, document)
            if key in self.unshareable:
                return None
            template = await self.running()
            try:
                [result] = await self._ask(template, [document])
            except WorkerLost:
                await self.running()  # restarted, and the verdict on its culprit recorded
                continue
            self.note_results([result])
            return result if result.shareable else None
        self._check_verdict(key, document)
        raise NotReady("the worker template process keeps exiting while loading models")

    def _check_verdict(self, key: ModelKey, document: dict[str, Any]) -> None:
        reason = self.verdicts.reason(key, fingerprint(document))
        if reason is not None:
            raise ModelLoadError(reason)

    def _askable(self, document: dict[str, Any]) -> bool:
        """Neither unshareable nor known to kill the template with these files."""
        key = document_key(document)
        if key in self.unshareable:
            return False
        return self.verdicts.reason(key, fingerprint(document)) is None

    async def _ask(
        self, template: TemplateProcess, documents: list[dict[str, Any]]
    ) -> list[messages.PreloadResult]:
        """``template.preload``, remembering what was asked (to blame a load that kills it)."""
        for document in documents:
            self._asked[document_key(document)] = document
        return await template.preload(documents)

    async def _watch(self, template: TemplateProcess) -> None:
        """Kill the template when one load has run past ``load_timeout`` (it hangs)."""
        while template is self.template and not self.stopping():
            await asyncio.sleep(WATCH_INTERVAL)
            elapsed = time.monotonic() - template.loading_since
            if template.loading is not None and elapsed > self.load_timeout:
                template.hung = self.load_timeout
                template.process.kill()  # its EOF restarts it, blaming that load
                return

    async def running(self) -> TemplateProcess:
        """The template, once it is up and ready to fork; NotReady if it does not come up
        within ``START_TIMEOUT`` of its start or of the last model it began to load (a big
        repository preloads for longer; a load that hangs is ``load_timeout``'s business)."""
        assert self._up is not None
        while not self._up.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._up.wait(), WATCH_INTERVAL)
            template = self.template
            progress = self._started_at if template is None else max(
                self._started_at, template.loading_since
            )  # fmt: skip
            if not self._up.is_set() and time.monotonic() - progress > START_TIMEOUT:
                raise NotReady(
                    f"the worker template process did not come up within {START_TIMEOUT:g}s"
                )
        assert self.template is not None
        return self.template

    def _documents_now(self) -> list[dict[str, Any]]:
        """What a restarted template preloads: the models served now, and until start-up
        has finished, the repository's too."""
        documents = self.served.shared_documents()
        if not self.served.started:
            served = {document_key(document) for document in documents}
            documents += [d for d in self._start_documents if document_key(d) not in served]
        return [document for document in documents if self._askable(document)]

    def _template_gone(self, template: TemplateProcess) -> None:
        if template is not self.template:
            return
        self.template = None
        self._started_at = time.monotonic()  # waiting for its restart starts now
        assert self._up is not None
        self._up.clear()
        if self.stopping():
            return
        self.outages.template_gone(time.monotonic())
        self.gone()
        self.keep(self._restart(template, template.loading))

    async def _restart(self, gone: TemplateProcess, loading: messages.Loading | None) -> None:
        status = await gone.reap()
        how = f"(pid {gone.process.pid}) {describe_exit(status)}"
        if gone.hung is not None:
            how = f"(pid {gone.process.pid}) was killed: a load hung for {gone.hung:g} s"
        delay = self.outages.template_delay(time.monotonic())
        if loading is not None:
            self._convict(loading, status, gone.hung)
            delay = 0.0  # its culprit is out: the others need it now
            how += f" while loading {describe_key(model_key(loading.name, loading.version))}"
            logger.error("the worker template process %s; restarting it without that model", how)
        else:
            logger.error("the worker template process %s; restarting it in %.1fs", how, delay)
        while not self.stopping():
            await asyncio.sleep(delay)
            try:
                self._start(self._documents_now())
            except OSError as exc:
                delay = min(MAX_BACKOFF, max(0.1, 2 * delay))
                logger.error(
                    "cannot restart the worker template process: %s; retrying in %.1fs",
                    exc, delay,
                )  # fmt: skip
                continue
            self.restarts += 1
            logger.info(
                "worker template process restarted (pid %d, restart %d)",
                self.template.process.pid if self.template else 0, self.restarts,
            )  # fmt: skip
            return

    def _convict(self, loading: messages.Loading, status: int | None, hung: float | None) -> None:
        """The load ``loading`` announced killed the template: never asked again with the
        same files (its callers get the sentence)."""
        key = model_key(loading.name, loading.version)
        document = self._asked.get(key)
        if document is not None:
            self.verdicts.record(key, fingerprint(document), blame(loading, status, hung))

    async def stop(self, timeout: float) -> None:
        template, self.template = self.template, None
        if template is not None:
            await template.stop(timeout)


def document_key(document: dict[str, Any]) -> ModelKey:
    """The key of a model version from its settings as JSON."""
    return model_key(document.get("name", ""), (document.get("parameters") or {}).get("version"))
