"""This proxy's link to its fleet's shared routing state, and what happens when it breaks.

Every call to the shared state goes through :meth:`FleetLink.call`, which returns the call's
result or — when the database is unreachable or slow past the configured ``fleet_timeout`` —
``None``: the caller then decides alone, from this process's memory, as a proxy without a
fleet does. The first failure is logged once (a warning), and while the link is down no call
is tried at all (each would cost its timeout); the upkeep's heartbeat retries and logs when
the link is back. Decisions taken alone are counted (``fallbacks``) for the status route.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from llmitm.store.fleet import FleetState, FleetUnavailable

logger = logging.getLogger(__name__)


class FleetLink:
    def __init__(self, state: FleetState) -> None:
        self.state = state
        self.up = False
        """The shared state answers; ``False`` until it opened, and while it is unreachable."""
        self.fallbacks = 0
        """Decisions this proxy took alone because the shared state did not answer."""
        self.failures = 0
        """Calls to the shared state that failed or timed out."""
        self._was_lost = False
        self._tasks: set[asyncio.Task[Any]] = set()

    async def call[T](self, make: Callable[[], Awaitable[T]], *, retry: bool = False) -> T | None:
        """``make()``'s result, or ``None`` when the link is down or the call fails (then
        counted as a decision taken alone). ``retry``: try even while the link is down (the
        heartbeat, which is how the link comes back)."""
        if not self.up and not retry:
            self.fallbacks += 1
            return None
        try:
            result = await make()
        except FleetUnavailable as exc:
            self.failures += 1
            self.fallbacks += 1
            self.lost(exc)
            return None
        if not self.up:
            self.up = True
            if self._was_lost:
                logger.warning("llmitm: the fleet's shared routing state answers again")
        return result

    def lost(self, exc: BaseException) -> None:
        self._was_lost = True
        if self.up:
            logger.warning(
                "llmitm: the fleet's shared routing state is unreachable (%s): this proxy "
                "decides alone (its own caps, cooldowns and affinity) until it is back",
                exc,
            )
        self.up = False

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> None:
        """Run ``coroutine`` in the background, kept alive until it ends."""
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for background calls still running, e.g. releases at shutdown."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
