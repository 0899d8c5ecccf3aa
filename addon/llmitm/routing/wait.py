"""Waiting in the limiter's bounded queue on an asyncio loop: the one place that turns the
limiter's ``deliver`` callback into an awaitable, for the direct path and the failover job.

No I/O: a future, a timeout, and the release of a slot delivered in the very instant the
waiter was cancelled (otherwise that slot would never be given back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from llmitm.routing.limits import Key, Lease, Limiter
from llmitm.wire.errors import ApiError

SlotTaker = Callable[[Sequence[Key]], Awaitable[Lease | None]]
"""How an attempt gets its slot: this process's :func:`take_slot`, or a fleet's, which also
holds the slot in the state the proxies share."""


async def take_slot(limiter: Limiter, candidates: Sequence[Key]) -> Lease | None:
    """A slot on the first of ``candidates`` with room now, else the first one freed within
    the queue's timeout; ``None`` when the queue is full or the wait times out."""
    for endpoint, model in candidates:
        lease = limiter.try_acquire(endpoint, model)
        if lease is not None:
            return lease
    return await wait_for_slot(limiter, candidates)


async def wait_for_slot(limiter: Limiter, candidates: Sequence[Key]) -> Lease | None:
    """The first slot freed on any of ``candidates`` (endpoint, model) within the queue's
    timeout; ``None`` when the queue is full or the wait times out."""
    future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()

    def deliver(lease: Lease) -> bool:
        if future.done():
            return False
        future.set_result(lease)
        return True

    waiter = limiter.enqueue(list(candidates), deliver)
    if waiter is None:
        return None
    try:
        return await asyncio.wait_for(future, limiter.wait.timeout)
    except TimeoutError:
        waiter.cancel()
        return None
    except asyncio.CancelledError:
        waiter.cancel()
        if future.done() and not future.cancelled():
            future.result().release()  # delivered in the same instant we were cancelled
        raise


def over_cap_error(endpoint: str, retry_after: float) -> tuple[ApiError, int]:
    """The direct path's 429 when ``endpoint`` stayed at its cap for the whole wait, and
    the whole seconds its ``Retry-After`` says."""
    seconds = max(1, round(retry_after))
    error = ApiError(
        message=f"The endpoint {endpoint} is at its concurrency limit; retry in {seconds} s.",
        type="rate_limit_error",
        code="concurrency_limit",
        status=429,
    )
    return error, seconds
