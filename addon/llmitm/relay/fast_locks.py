"""httpcore's asyncio locks and events without anyio's forced turns of the event loop.

httpcore 1.x builds its asyncio locks and events with anyio, whose uncontended
``Lock.acquire``, uncontended ``Semaphore.acquire`` and ``Event.wait`` on an event already
set still yield to the event loop once (a checkpoint: trio's fairness rule). A relayed
request passes about six of them between its upstream request and its answer's head — the
connection's and its state's locks, the pool handing it a connection, an HTTP/2
connection's stream slots — and on a busy proxy each one is a whole turn of the loop: every
other stream's ready callbacks run before the request goes on, on the path to the client's
first byte. asyncio's own primitives do not yield there, and anyio offers the same for its
lock and semaphore (``fast_acquire=True``).

:func:`install` gives httpcore's locks and semaphores anyio's fast ones, and returns at once
from a wait on an event already set, as ``asyncio.Event.wait`` does. A contended lock, a
semaphore with no slot left and an unset event wait as before. Guarded: where httpcore's or
anyio's code is not as expected (another major version) nothing is changed and httpcore runs
as shipped.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

try:
    from httpcore import _synchronization as _sync

    SHIPPED: tuple[Any, Any, Any] | None = (
        _sync.AsyncLock.setup,
        _sync.AsyncEvent.wait,
        _sync.AsyncSemaphore.setup,
    )
    """httpcore's own methods, as :func:`install` found them."""
except (ImportError, AttributeError):
    SHIPPED = None

_installed: bool | None = None


def install() -> bool:
    """Patch httpcore once; whether its locks and events now skip the forced turns."""
    global _installed
    if _installed is None:
        _installed = _patch()
        if not _installed:
            logger.debug("llmitm: httpcore's locks left as shipped (not the expected code)")
    return _installed


def _patch() -> bool:
    if SHIPPED is None:
        return False
    try:
        import anyio

        anyio.Lock(fast_acquire=True)
        anyio.Semaphore(1, max_value=1, fast_acquire=True)
    except (ImportError, TypeError):
        return False
    setup, wait, semaphore_setup = SHIPPED

    def fast_setup(self: Any) -> None:
        setup(self)
        if self._backend == "asyncio":
            self._anyio_lock = anyio.Lock(fast_acquire=True)

    def fast_semaphore_setup(self: Any) -> None:
        semaphore_setup(self)
        if self._backend == "asyncio":
            bound = self._bound
            self._anyio_semaphore = anyio.Semaphore(bound, max_value=bound, fast_acquire=True)

    async def fast_wait(self: Any, timeout: float | None = None) -> None:
        if self._backend == "asyncio" and self._anyio_event.is_set():
            return
        await wait(self, timeout)

    _sync.AsyncLock.setup = fast_setup  # type: ignore[method-assign]
    _sync.AsyncEvent.wait = fast_wait  # type: ignore[method-assign]
    _sync.AsyncSemaphore.setup = fast_semaphore_setup  # type: ignore[method-assign]
    return True
