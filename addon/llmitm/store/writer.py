"""The write path every backend shares: a bounded queue fed by ``submit`` and drained, in
batches, by one writer task.

This module owns the rules of the hook path and nothing about any database: ``submit`` never
blocks or awaits (an awaited write in mitmproxy's ``response`` hook delays the client's end of
stream: mitmproxy runs that hook before it sends the terminating chunk), works from other
threads, and drops with a counted, rate-limited warning when the queue is full. A backend
passes in the coroutine that applies one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmitm.store.api import StoreStats, StoreUnreachable, Write

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """How many writes of one batch became durable and how many failed (and were logged)."""

    written: int
    failed: int


BatchApplier = Callable[[list[Write]], Awaitable[BatchOutcome]]


class WriteQueue:
    """One bounded queue and the one task that drains it.

    ``max_queue`` bounds memory and is the point where llmitm chooses losing a write over
    slowing the proxy; ``batch_size`` bounds how many queued writes share one transaction.
    Batches form naturally: whatever queued while the previous batch was being written goes
    into the next one, so an idle proxy writes at once and a busy one writes in bulk.
    """

    def __init__(
        self,
        apply_batch: BatchApplier,
        *,
        max_queue: int,
        batch_size: int,
        name: str = "store",
        warn_interval: float = 10.0,
    ) -> None:
        if max_queue < 1 or batch_size < 1:
            raise ValueError("max_queue and batch_size must be at least 1")
        self._apply_batch = apply_batch
        self._batch_size = batch_size
        self._name = name
        self._max_queue = max_queue
        self._queue: asyncio.Queue[Write] = asyncio.Queue(maxsize=max_queue)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        # Counters written on the loop thread only, except the drop counters, which other
        # threads reach when the loop is gone (hence the lock).
        self._submitted = 0
        self._settled = 0
        self._written = 0
        self._failed = 0
        self._batches = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._drop_lock = threading.Lock()
        self._dropped = 0
        self._unreported_drops = 0
        self._warn_interval = warn_interval
        self._next_warning = 0.0

    def start(self) -> None:
        """Start the writer on the running loop; ``submit`` accepts writes from now on."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        # A fresh queue per start: an asyncio.Queue binds to the loop that first waits on it,
        # and a store reopened in another loop (a second test, a CLI command) needs its own.
        self._queue = asyncio.Queue(maxsize=self._max_queue)
        self._loop_thread = threading.get_ident()
        self._accepting = True
        self._task = self._loop.create_task(self._run(), name=f"llmitm {self._name} writer")
        self._task.add_done_callback(self._writer_ended)

    def submit(self, write: Write) -> None:
        """Queue ``write`` without blocking; from another thread, hand it to the loop."""
        loop = self._loop
        if loop is None or not self._accepting:
            self._drop(write, "the store is not open")
        elif threading.get_ident() == self._loop_thread:
            self._enqueue(write)
        else:
            try:
                loop.call_soon_threadsafe(self._enqueue, write)
            except RuntimeError:  # the loop is closed: nothing will ever write this
                self._drop(write, "the event loop is closed")

    async def flush(self) -> None:
        """Wait until every write submitted before this call is settled."""
        if self._task is None:
            return
        # Writes that other threads submitted before this call are callbacks already in the
        # loop's ready queue; yielding once lets them reach the queue and count.
        await asyncio.sleep(0)
        target = self._submitted
        if self._settled >= target:
            return
        if self._task.done():
            raise RuntimeError(f"the {self._name} writer has stopped")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        await waiter

    async def close(self) -> None:
        """Stop accepting writes, wait for the queue to drain, stop the writer."""
        task = self._task
        if task is None:
            return
        await asyncio.sleep(0)  # as in flush: accept what other threads already handed over
        self._accepting = False
        try:
            if not task.done():
                await self.flush()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._task = None

    def stats(self) -> StoreStats:
        with self._drop_lock:
            dropped = self._dropped
        return StoreStats(
            submitted=self._submitted,
            written=self._written,
            failed=self._failed,
            dropped=dropped,
            batches=self._batches,
            queued=self._queue.qsize(),
        )

    def _enqueue(self, write: Write) -> None:
        if not self._accepting:
            self._drop(write, "the store is closing")
            return
        try:
            self._queue.put_nowait(write)
        except asyncio.QueueFull:
            self._drop(write, f"the write queue is full ({self._queue.maxsize})")
            return
        self._submitted += 1

    def _drop(self, write: Write, reason: str) -> None:
        # A slow disk can drop thousands of writes a second; one line every warn_interval
        # seconds, with the count, says the same without flooding the log.
        with self._drop_lock:
            self._dropped += 1
            self._unreported_drops += 1
            now = time.monotonic()
            if now < self._next_warning:
                return
            count, self._unreported_drops = self._unreported_drops, 0
            total = self._dropped
            self._next_warning = now + self._warn_interval
        log.warning(
            "%s: dropped %d write(s), the last of kind %r, because %s (%d dropped in all)",
            self._name,
            count,
            getattr(write, "kind", type(write).__name__),
            reason,
            total,
        )

    async def _run(self) -> None:
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while len(batch) < self._batch_size:
                try:
                    batch.append(queue.get_nowait())
                except asyncio.QueueEmpty:
                    break
            try:
                outcome = await self._apply_batch(batch)
            except Exception as error:
                # The backend isolates failing writes itself; reaching here means the batch
                # as a whole failed (a lost connection, a full disk). Keep writing: the next
                # batch may succeed, and a dead writer would make flush hang.
                kinds = sorted({w.kind for w in batch})
                lost = (self._name, len(batch), kinds)
                if isinstance(error, StoreUnreachable):  # expected, and said: no traceback
                    log.error("%s: lost a batch of %d write(s) %s: %s", *lost, error)
                else:
                    log.exception("%s: lost a batch of %d write(s) %s", *lost)
                outcome = BatchOutcome(written=0, failed=len(batch))
            self._written += outcome.written
            self._failed += outcome.failed
            self._batches += 1
            self._settled += len(batch)
            self._wake_flushers()
            # Not held while waiting for the next write: the last batch's records (bodies
            # and all) would otherwise stay alive until the proxy writes again.
            del batch

    def _wake_flushers(self) -> None:
        still: list[tuple[int, asyncio.Future[None]]] = []
        for target, waiter in self._waiters:
            if self._settled >= target:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                still.append((target, waiter))
        self._waiters = still

    def _writer_ended(self, task: asyncio.Task[None]) -> None:
        # The writer only ends when close cancels it, but if it ever died, flush must fail
        # rather than wait forever.
        self._accepting = False
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("%s: the writer stopped", self._name, exc_info=error)
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(RuntimeError(f"the {self._name} writer has stopped"))
        self._waiters = []
