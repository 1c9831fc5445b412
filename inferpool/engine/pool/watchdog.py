"""The supervisor's watch over the live workers, current, retiring, spare and standby alike.

Every ``SUPERVISE_INTERVAL`` ``Watchdog``:

- recycles a worker whose group runs past its model's timeout (504 for the group);
- kills a worker silent for ``worker_heartbeat_timeout`` (any message or reply counts as
  a sign of life; workers answer pings between requests);
- tells whether the process is wedged (no worker or template for ``WEDGED_AFTER``), and
  has the pool tick.

At shutdown it kills the workers still holding requests shortly before the grace period
ends (``arm``), so that their requests are answered in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import Reply
from inferpool.errors import DeadlineExceeded

if TYPE_CHECKING:
    from inferpool.engine.pool.handles import WorkerHandle
    from inferpool.engine.pool.supervisor import Supervisor

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 5.0
SUPERVISE_INTERVAL = 0.25  # how often running groups are checked against their timeout
KILL_MARGIN = 0.5  # at shutdown, hung workers die this long before the grace period ends


class Watchdog:
    """Timeouts, heartbeats and the shutdown deadline, checked for the supervisor."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    async def run(self) -> None:
        """Check every supervised worker every ``SUPERVISE_INTERVAL`` until stopping."""
        chief = self.supervisor
        heartbeat = chief.settings.worker_heartbeat_timeout
        ping_every = min(HEARTBEAT_INTERVAL, heartbeat / 4) if heartbeat > 0 else None
        pinged = time.monotonic()
        while not chief.stopping():
            await asyncio.sleep(SUPERVISE_INTERVAL)
            now = time.monotonic()
            for worker in chief.supervised():
                self.check(worker, now)
            if ping_every is not None and now - pinged >= ping_every:
                pinged = now
                for worker in chief.supervised():
                    with contextlib.suppress(OSError):
                        worker.post_control(messages.Ping())
            self.check_wedged(now)
            chief.events.tick(now)

    def check_wedged(self, now: float) -> None:
        """Tell whether the process is wedged (``outages.py``): the supervisor's ``wedged``."""
        chief = self.supervisor
        wedged = chief.outages.wedged(now, chief.template is not None)
        if wedged and wedged != chief.wedged:
            logger.error("not live: %s", wedged)
        chief.wedged = wedged

    def check(self, worker: WorkerHandle, now: float) -> None:
        """Recycle ``worker`` past its model's timeout, kill it if it is hung."""
        running = worker.requests.running()
        if running is not None and self._past_timeout(worker, running, now):
            return
        heartbeat = self.supervisor.settings.worker_heartbeat_timeout
        if worker.loading is not None and now - worker.loading_since > heartbeat > 0:
            worker.hung = round(now - worker.loading_since)  # its model is blamed as hung
        if heartbeat > 0 and now - worker.last_seen > heartbeat:
            if running is not None and self.supervisor.events.timeout_of(running[0]) > 0:
                return  # busy with a group its model's timeout still allows
            logger.error("%s answered nothing for %.0fs; killing it", worker.describe(), heartbeat)
            self.supervisor.kill(worker, f"{worker.describe()} exited", crash=False)

    def _past_timeout(
        self, worker: WorkerHandle, running: tuple[int, list[int], int], now: float
    ) -> bool:
        """Recycle ``worker`` if its group runs past its model's timeout: 504 for the group."""
        model_index, request_ids, started_ns = running
        events = self.supervisor.events
        timeout = events.timeout_of(model_index)
        if not timeout or now - started_ns / 1e9 <= timeout:
            return False
        name = events.model_name(model_index) or f"#{model_index}"
        message = (
            f"model '{name}' ran longer than its timeout ({timeout:g} s); "
            f"{worker.describe()} was recycled"
        )
        logger.error("%s", message)
        self.supervisor.timeout_kills += 1
        late = Reply.from_error(DeadlineExceeded(message))
        for request_id in request_ids:
            future = worker.inflight.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(late)
        self.supervisor.kill(worker, f"{worker.describe()} was recycled ({message})", crash=False)
        return True

    def arm(self, deadline: float) -> None:
        """Shutdown began: workers still hung near ``deadline`` are killed."""
        with contextlib.suppress(RuntimeError):  # no loop: nothing runs to be killed
            asyncio.get_running_loop()
            self.supervisor.keep(self._kill_hung_at(deadline))

    async def _kill_hung_at(self, deadline: float) -> None:
        """Shortly before the grace period ends, kill workers still holding requests.

        Their requests are answered 503 in time for the frontends to write them out, so
        a hung predict never stretches shutdown past ``shutdown_timeout``.
        """
        await asyncio.sleep(max(0.0, deadline - KILL_MARGIN - time.monotonic()))
        chief = self.supervisor
        for worker in chief.supervised():
            if worker.inflight:
                logger.warning(
                    "%s still runs requests at the end of the shutdown grace period; "
                    "killing it", worker.describe(),
                )  # fmt: skip
                chief.kill(worker, f"{worker.describe()} was stopped at shutdown", crash=False)
