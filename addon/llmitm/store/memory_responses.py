"""Responses state in memory, for a proxy that keeps no store (``llmitm_store=""``).

The same reads as the SQLite store and the same writes, applied at once; everything is
lost when the process ends (and the reasoning seal key with it). Run leases and pending
marks are kept too, to the same rules, though no other proxy can see them here. Bounded: past
``max_responses`` the oldest responses (and their events) are forgotten first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from llmitm.responses_api.records import (
    PENDING_MAX_AGE,
    PendingResponse,
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponseOwner,
    ResponsePending,
    ResponseReader,
    ResponseSaved,
    ResponsesPurged,
    RunCancelRequested,
    RunEnded,
    RunLease,
    RunsHeartbeat,
    RunStarted,
    StaleRunEnded,
    StoredResponse,
    readable,
)


class MemoryResponses(ResponseReader):
    def __init__(self, max_responses: int = 10_000) -> None:
        self.max_responses = max_responses
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self._events: dict[str, dict[int, bytes]] = {}
        self._owners: OrderedDict[str, ResponseOwner] = OrderedDict()
        self._pending: dict[str, PendingResponse] = {}
        self._leases: dict[str, RunLease] = {}

    def apply(self, write: object) -> None:
        """Apply one write of ``responses_api.records`` (others are not this store's)."""
        if isinstance(write, ResponseSaved):
            record = write.record
            if record.input_json is not None:
                # For a store that serialises: kept here, it would only hold the items twice.
                record = replace(record, input_json=None)
            self._responses[record.id] = record
            self._responses.move_to_end(write.record.id)
            self._pending.pop(write.record.id, None)
            while len(self._responses) > self.max_responses:
                old, _ = self._responses.popitem(last=False)
                self._events.pop(old, None)
        elif isinstance(write, ResponseDeleted):
            self._responses.pop(write.id, None)
            self._events.pop(write.id, None)
            self._owners.pop(write.id, None)
            self._pending.pop(write.id, None)
        elif isinstance(write, ResponseEvents):
            events = self._events.setdefault(write.response_id, {})
            for seq, event in write.events:
                events.setdefault(seq, event)  # as SQLite's INSERT OR IGNORE
        elif isinstance(write, ResponseOwned):
            self._owners[write.owner.id] = write.owner
            while len(self._owners) > self.max_responses:
                self._owners.popitem(last=False)
        elif isinstance(write, ResponsesPurged):
            for rid in [r.id for r in self._responses.values() if r.expired(write.now)]:
                self.apply(ResponseDeleted(rid))
            old = write.now - PENDING_MAX_AGE
            self._pending = {k: p for k, p in self._pending.items() if p.created_at >= old}
            self._leases = {k: r for k, r in self._leases.items() if r.heartbeat_at >= old}
        else:
            self._apply_run_write(write)

    def _apply_run_write(self, write: object) -> None:
        if isinstance(write, ResponsePending):
            self._pending[write.pending.id] = write.pending
        elif isinstance(write, RunStarted):
            self._leases[write.lease.response_id] = replace(
                write.lease, cancel_requested_at=None, delete=False
            )
        elif isinstance(write, RunsHeartbeat):
            for rid in write.response_ids:
                lease = self._leases.get(rid)
                if lease is not None and lease.owner == write.owner:
                    self._leases[rid] = replace(lease, heartbeat_at=write.at)
        elif isinstance(write, RunCancelRequested):
            lease = self._leases.get(write.response_id)
            if lease is not None:
                at = lease.cancel_requested_at
                self._leases[write.response_id] = replace(
                    lease,
                    cancel_requested_at=write.at if at is None else at,
                    delete=lease.delete or write.delete,
                )
        elif isinstance(write, RunEnded):
            self._end_run(write.response_id)
        elif isinstance(write, StaleRunEnded):
            lease = self._leases.get(write.record.id)
            if lease is None or lease.heartbeat_at >= write.stale_before:
                return
            self.apply(ResponseSaved(write.record))
            self.apply(ResponseEvents(write.record.id, write.events))
            self._end_run(write.record.id)

    def _end_run(self, response_id: str) -> None:
        lease = self._leases.pop(response_id, None)
        if lease is not None and lease.delete:
            self.apply(ResponseDeleted(response_id))

    async def response(
        self, response_id: str, credential: str | None = None
    ) -> StoredResponse | None:
        record = self._responses.get(response_id)
        if record is None or record.expired(time.time()):
            return None
        return record if readable(record.credential, credential) else None

    async def chain(
        self, response_id: str, max_depth: int = 10_000, credential: str | None = None
    ) -> list[StoredResponse]:
        chain: list[StoredResponse] = []
        next_id: str | None = response_id
        while next_id is not None and len(chain) <= max_depth:
            record = await self.response(next_id, credential)
            if record is None:
                break
            chain.append(record)
            next_id = record.previous_response_id
        return chain[::-1]

    async def items(
        self, item_ids: Sequence[str], credential: str | None = None
    ) -> dict[str, dict[str, Any]]:
        wanted = set(item_ids)
        found: dict[str, dict[str, Any]] = {}
        now = time.time()
        for record in reversed(self._responses.values()):  # newest first, as in SQLite
            if record.expired(now) or not readable(record.credential, credential):
                continue
            for item in record.items():
                item_id = item.get("id")
                if item_id in wanted and item_id not in found:
                    found[item_id] = item
        return found

    async def events(self, response_id: str, after: int = -1) -> list[bytes]:
        events = self._events.get(response_id, {})
        return [events[seq] for seq in sorted(events) if seq > after]

    async def owner(self, response_id: str) -> ResponseOwner | None:
        owner = self._owners.get(response_id)
        if owner is None or (owner.expires_at is not None and time.time() >= owner.expires_at):
            return None
        return owner

    async def seal_key(self) -> bytes | None:
        return None  # the seal makes a per-process key

    async def fingerprint_key(self) -> bytes | None:
        return None  # so does the credential scope

    async def pending(self, response_id: str) -> PendingResponse | None:
        pending = self._pending.get(response_id)
        if pending is None or time.time() - pending.created_at > PENDING_MAX_AGE:
            return None
        return pending

    async def run_lease(self, response_id: str) -> RunLease | None:
        return self._leases.get(response_id)

    async def owned_leases(self, owner: str) -> list[RunLease]:
        return [lease for lease in self._leases.values() if lease.owner == owner]
