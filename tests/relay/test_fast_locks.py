"""httpcore's locks and events without forced turns of the event loop, and httpcore as shipped
where the patch cannot apply."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import anyio
import httpcore
import pytest
from httpcore import _synchronization as sync

from llmitm.relay import fast_locks


async def turns_taken(step: object) -> int:
    """How many other callbacks run while ``step`` (a coroutine) is awaited."""
    ticks = 0
    stop = False

    def tick() -> None:
        nonlocal ticks
        if not stop:
            ticks += 1
            asyncio.get_running_loop().call_soon(tick)

    asyncio.get_running_loop().call_soon(tick)
    await step  # type: ignore[misc]
    stop = True
    return ticks


@pytest.fixture
def shipped() -> Iterator[None]:
    """httpcore's own methods back after the test, and the patch not yet installed."""
    now = (sync.AsyncLock.setup, sync.AsyncEvent.wait, sync.AsyncSemaphore.setup)
    installed = fast_locks._installed
    assert fast_locks.SHIPPED is not None
    _put(fast_locks.SHIPPED)
    fast_locks._installed = None
    yield
    _put(now)
    fast_locks._installed = installed


def _put(methods: tuple[object, object, object]) -> None:
    lock_setup, event_wait, semaphore_setup = methods
    sync.AsyncLock.setup = lock_setup  # type: ignore[method-assign]
    sync.AsyncEvent.wait = event_wait  # type: ignore[method-assign]
    sync.AsyncSemaphore.setup = semaphore_setup  # type: ignore[method-assign]


def _installed_methods() -> tuple[object, object, object]:
    return (sync.AsyncLock.setup, sync.AsyncEvent.wait, sync.AsyncSemaphore.setup)


async def uncontended_lock_and_set_event() -> None:
    lock, event, slots = sync.AsyncLock(), sync.AsyncEvent(), sync.AsyncSemaphore(2)
    async with lock:
        pass
    await slots.acquire()
    await slots.release()
    event.set()
    await event.wait(timeout=1.0)


async def test_shipped_httpcore_yields_the_loop_an_installed_one_does_not(shipped: None) -> None:
    assert await turns_taken(uncontended_lock_and_set_event()) >= 3
    assert fast_locks.install()
    assert await turns_taken(uncontended_lock_and_set_event()) == 0


async def test_a_contended_lock_and_an_unset_event_still_wait(shipped: None) -> None:
    assert fast_locks.install()
    lock, event = sync.AsyncLock(), sync.AsyncEvent()
    order: list[str] = []

    async def second() -> None:
        async with lock:
            order.append("second")

    async with lock:
        task = asyncio.create_task(second())
        await asyncio.sleep(0.01)
        order.append("first")
    await task
    assert order == ["first", "second"]
    waiter = asyncio.create_task(event.wait(timeout=1.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    event.set()
    await waiter
    with pytest.raises(httpcore.PoolTimeout):
        await sync.AsyncEvent().wait(timeout=0.01)  # an unset event times out as shipped
    slots = sync.AsyncSemaphore(1)
    await slots.acquire()
    second_slot = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0.01)
    assert not second_slot.done()  # no slot left: waits
    await slots.release()
    await second_slot


async def test_without_anyios_fast_lock_httpcore_stays_as_shipped(
    shipped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class OldLock:
        def __init__(self) -> None:  # anyio before 4.5: no fast_acquire
            pass

    monkeypatch.setattr(anyio, "Lock", OldLock)
    assert not fast_locks.install()
    assert _installed_methods() == fast_locks.SHIPPED
