"""Reads that wait, a bounded time, for a response another proxy is still storing.

Proxies sharing one store each write through their own queue, which never delays an answer:
when a client's next turn (``previous_response_id``), or its ``GET``, reaches another proxy
than the one that answered, the first one's write may not be committed yet. So a lookup that
finds nothing asks whether the id is coming before it answers "not found":

- the id is *pending* (:class:`~llmitm.responses_api.records.PendingResponse`, marked when
  the create call was sent upstream, long before its answer ends): poll until it is stored,
  for at most ``wait`` seconds;
- nothing says so: poll for ``grace`` seconds only (``wait / 20``), for the window where
  the mark itself is not committed yet (a background create is answered at once);
- a native endpoint owns the id (an owner row): no wait, it is not llmitm's to store.

Each id is waited for once per :class:`WaitingReader` (one per request), so a lookup that
asks twice does not wait twice. ``wait = 0`` turns waiting off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from llmitm.responses_api.records import (
    PendingResponse,
    ResponseOwner,
    ResponseReader,
    RunLease,
    StoredResponse,
    readable,
)

T = TypeVar("T")

POLL = 0.02
"""Seconds between two reads of an id that is coming."""


class WaitingReader(ResponseReader):
    """``inner``, whose ``response`` and ``chain`` wait for an id that is coming."""

    def __init__(
        self,
        inner: ResponseReader,
        wait: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.inner = inner
        self.wait = max(0.0, wait)
        self.grace = self.wait / 20
        self._clock = clock
        self._sleep = sleep
        self._waited: set[str] = set()

    async def response(
        self, response_id: str, credential: str | None = None
    ) -> StoredResponse | None:
        return await self._until_found(
            response_id, credential, lambda: self.inner.response(response_id, credential)
        )

    async def chain(
        self, response_id: str, max_depth: int = 10_000, credential: str | None = None
    ) -> list[StoredResponse]:
        return await self._until_found(
            response_id, credential, lambda: self.inner.chain(response_id, max_depth, credential)
        )

    async def _until_found(
        self, response_id: str, credential: str | None, read: Callable[[], Awaitable[T]]
    ) -> T:
        found = await read()
        if found or self.wait <= 0 or response_id in self._waited:
            return found
        self._waited.add(response_id)
        if await self.inner.owner(response_id) is not None:
            return found  # a native endpoint's id
        started = self._clock()
        deadline = started + self.grace
        coming = False
        while True:
            if not coming:
                pending = await self.inner.pending(response_id)
                if pending is not None and readable(pending.credential, credential):
                    coming, deadline = True, started + self.wait
            if self._clock() >= deadline:
                return found
            await self._sleep(POLL)
            found = await read()
            if found:
                return found

    # -- the rest reads through ---------------------------------------------------------------

    async def items(
        self, item_ids: Sequence[str], credential: str | None = None
    ) -> dict[str, dict[str, Any]]:
        return await self.inner.items(item_ids, credential)

    async def events(self, response_id: str, after: int = -1) -> list[bytes]:
        return await self.inner.events(response_id, after)

    async def owner(self, response_id: str) -> ResponseOwner | None:
        return await self.inner.owner(response_id)

    async def seal_key(self) -> bytes | None:
        return await self.inner.seal_key()

    async def fingerprint_key(self) -> bytes | None:
        return await self.inner.fingerprint_key()

    async def pending(self, response_id: str) -> PendingResponse | None:
        return await self.inner.pending(response_id)

    async def run_lease(self, response_id: str) -> RunLease | None:
        return await self.inner.run_lease(response_id)

    async def owned_leases(self, owner: str) -> list[RunLease]:
        return await self.inner.owned_leases(owner)
