"""Waiting in the limiter's queue on an asyncio loop: served when a slot frees, None on a full
queue or a timeout, and never a leaked slot when the waiter is cancelled as it is served."""

from __future__ import annotations

import asyncio

import pytest

from llmitm.routing.limits import Limiter, WaitPolicy
from llmitm.routing.wait import wait_for_slot


def full_limiter(**wait: float) -> tuple[Limiter, object]:
    limiter = Limiter({"a": 1}, wait=WaitPolicy(**wait))  # type: ignore[arg-type]
    held = limiter.try_acquire("a")
    assert held is not None
    return limiter, held


async def test_a_waiter_gets_the_slot_a_release_frees() -> None:
    limiter, held = full_limiter(max_waiters=1, timeout=5)
    waiting = asyncio.ensure_future(wait_for_slot(limiter, [("a", None)]))
    await asyncio.sleep(0)
    held.release()  # type: ignore[attr-defined]
    lease = await waiting
    assert lease is not None and limiter.in_flight("a") == 1
    lease.release()
    assert limiter.in_flight("a") == 0


@pytest.mark.parametrize(
    "wait", [{"max_waiters": 0, "timeout": 5}, {"max_waiters": 1, "timeout": 0.01}]
)
async def test_a_full_queue_or_a_timeout_gives_none(wait: dict[str, float]) -> None:
    limiter, _held = full_limiter(**wait)
    assert await wait_for_slot(limiter, [("a", None)]) is None
    assert limiter.in_flight("a") == 1


async def test_a_slot_delivered_as_the_waiter_is_cancelled_is_given_back() -> None:
    limiter, held = full_limiter(max_waiters=1, timeout=5)
    waiting = asyncio.ensure_future(wait_for_slot(limiter, [("a", None)]))
    await asyncio.sleep(0)
    held.release()  # type: ignore[attr-defined]  # delivers to the waiter's future…
    waiting.cancel()  # …which is cancelled before it runs again (a client abort)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert limiter.in_flight("a") == 0
