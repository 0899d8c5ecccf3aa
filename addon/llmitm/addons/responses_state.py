"""The state the local Responses API's addons share (:class:`ResponsesState`), and the
few ways they answer a flow themselves.

One :class:`ResponsesState` per proxy holds the store (or, without one, memory), the
reasoning seal, the credential fingerprint key, the live background runs (and their leases,
for the other proxies sharing the store) and the native ids this process saw minted. Its
options (``llmitm_responses_store``, ``llmitm_responses_ttl``, ``llmitm_responses_wait_ms``,
``llmitm_run_lease_ms``) are set by :class:`~llmitm.addons.responses_api.LlmResponsesApi`'s
``configure``.

With a store, other proxies may share it: reads wait a bounded time for a response another
proxy is still storing (:mod:`llmitm.responses_api.waiting`), and a background response
another proxy runs is settled (a dead owner's ends failed) and followed through the store
(:mod:`llmitm.responses_api.remote_runs`).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson
from mitmproxy import http

from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import flow_mint
from llmitm.addons.store import LlmStore
from llmitm.relay.client import UpstreamClient, UpstreamRequest
from llmitm.relay.frames import FramesJob
from llmitm.responses_api import remote_runs
from llmitm.responses_api.answers import LocalAnswer
from llmitm.responses_api.background import BackgroundRun
from llmitm.responses_api.conversation_records import ConversationReader
from llmitm.responses_api.leases import DEFAULT_LEASE, RunKeeper
from llmitm.responses_api.records import (
    ResponseOwner,
    ResponseReader,
    ResponseSaved,
    ResponsesPurged,
    RunLease,
    RunStarted,
    StoredResponse,
)
from llmitm.responses_api.scope import creator, reader_credential
from llmitm.responses_api.seal import ReasoningSeal
from llmitm.responses_api.waiting import WaitingReader
from llmitm.routing.affinity import TtlLru
from llmitm.store.api import Write
from llmitm.store.memory_conversations import MemoryConversations
from llmitm.store.memory_responses import MemoryResponses
from llmitm.wire.ids import IdFactory, random_id


class ResponsesState:
    """What the Responses addons share: the store, the seal, the live background runs."""

    def __init__(self, settings: LlmitmSettings, store: LlmStore, relay: LlmRelay) -> None:
        self.settings = settings
        self.store = store
        self.relay = relay
        self.runs: dict[str, BackgroundRun] = {}
        self.owners: TtlLru[str, ResponseOwner] = TtlLru(100_000, 24 * 3600.0)
        """Native ids this process saw minted → endpoint and creator, for synchronous
        lookups (the store has them all, for as long as the TTL option says)."""
        self.memory = MemoryResponses()
        self.conversations_memory = MemoryConversations()
        self.store_default = True
        """``llmitm_responses_store``: store a create call that does not say."""
        self.ttl = 0
        """``llmitm_responses_ttl``: seconds a stored response is kept (0: until deleted)."""
        self.wait = 2.0
        """``llmitm_responses_wait_ms``: seconds a read waits for a response another proxy
        sharing the store is still storing."""
        self.lease = DEFAULT_LEASE
        """``llmitm_run_lease_ms``: seconds without a heartbeat after which another proxy's
        background run is taken for dead."""
        self.proxy_id = secrets.token_hex(8)
        """This process, as the owner of its background runs' leases."""
        self._keeper: RunKeeper | None = None
        self._seal: ReasoningSeal | None = None
        self._fingerprint_key: bytes | None = None
        self._purged = False

    async def reader(self) -> ResponseReader:
        """The store's Responses state, or the in-memory one when llmitm keeps no store."""
        store = await self.store.ready()
        if not self._purged:
            self._purged = True
            self.submit(ResponsesPurged(time.time()))
        if isinstance(store, ResponseReader):
            return WaitingReader(store, self.wait)
        return self.memory

    @property
    def shared(self) -> bool:
        """Whether state lives in a store, which other proxies may share."""
        return isinstance(self.store.store, ResponseReader)

    async def conversations(self) -> ConversationReader:
        """The store's conversations, or the in-memory ones when llmitm keeps no store."""
        store = await self.store.ready()
        return store if isinstance(store, ConversationReader) else self.conversations_memory

    def submit(self, write: Write) -> None:
        """Hand a write to the store's queue (never awaited), or apply it in memory."""
        if isinstance(self.store.store, ResponseReader):
            self.store.submit(write)
        else:
            self.memory.apply(write)
            self.conversations_memory.apply(write)

    async def seal(self) -> ReasoningSeal:
        if self._seal is None:
            key = await (await self.reader()).seal_key()
            # Without a store the key lives as long as the process: tokens then only carry
            # reasoning within one run, which is all a store-less proxy can promise.
            self._seal = ReasoningSeal(key)
        return self._seal

    async def creator(self, flow: http.HTTPFlow) -> str:
        """Who ``flow``'s request is, as stored with what it creates (a fingerprint)."""
        if self._fingerprint_key is None:
            key = await (await self.reader()).fingerprint_key()
            # Without a store the key lives as long as the process, as its state does.
            self._fingerprint_key = key or secrets.token_bytes(32)
        return creator(flow.request.headers.items(multi=True), self._fingerprint_key)

    def credential(self, created_by: str) -> str | None:
        """The credential a request by ``created_by`` reads stored state with."""
        return reader_credential(self.settings.config.settings.responses_scope, created_by)

    def expires_at(self, now: float) -> float | None:
        return now + self.ttl if self.ttl > 0 else None

    def known_owner(self, response_id: str) -> ResponseOwner | None:
        """The native endpoint known to own ``response_id``, and for whom it minted it."""
        return self.owners.get(response_id, time.monotonic())

    def save(self, record: StoredResponse) -> None:
        self.submit(ResponseSaved(record))

    def run_started(self, run: BackgroundRun) -> None:
        """``run`` (already in :attr:`runs`) begins: its lease, kept while it runs when the
        store may be shared. Call before the run's first save."""
        if not self.shared:
            self.submit(RunStarted(RunLease(run.id, self.proxy_id, time.time())))
            return
        if self._keeper is None:
            self._keeper = RunKeeper(
                self.proxy_id, self.runs, submit=self.submit, reader=self.reader, lease=self.lease
            )
        self._keeper.started(run)

    def stop_runs(self, message: str) -> None:
        """llmitm is stopping: its runs end failed, their leases are no longer kept."""
        for run in list(self.runs.values()):
            run.abandon(message)
        if self._keeper is not None:
            self._keeper.stop()

    async def settle(self, record: StoredResponse, reader: ResponseReader) -> StoredResponse:
        """``record`` as every proxy sees it: a background response another proxy ran, and
        whose lease went stale, ends failed (:func:`remote_runs.settle`)."""
        if record.id in self.runs:
            return record
        return await remote_runs.settle(
            record, reader, now=time.time(), lease=self.lease, submit=self.submit
        )


def answer(flow: http.HTTPFlow, local: LocalAnswer) -> None:
    """Answer the client with ``local``; the request goes nowhere."""
    flow.response = http.Response.make(
        local.status,
        orjson.dumps(local.body),
        {"content-type": "application/json", **local.headers},
    )


async def point_at_relay(flow: http.HTTPFlow, relay: LlmRelay, job: FramesJob) -> None:
    """Stream ``job`` to the client: mitmproxy cannot stream a body an addon makes, so the
    flow goes to the relay, which serves the job."""
    server = await relay.ready()
    flow.request.method = "GET"
    flow.request.content = b""
    relay.point(flow, server.register(job))


async def open_upstream(upstream: UpstreamRequest, relay: LlmRelay) -> Any:
    """Send a call no flow carries (a background run's) with the relay's TLS settings."""
    server = relay.server
    if server is None:
        return await UpstreamClient().send(upstream, connect_timeout=30.0)
    return await server.client.send(upstream, connect_timeout=server.connect_timeout)


def flow_ids(flow: http.HTTPFlow) -> IdFactory:
    """The flow's id source: its mint when it is recorded or replayed."""
    mint = flow_mint(flow)
    return random_id if mint is None else mint.id
