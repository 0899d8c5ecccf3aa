"""``GET /_llmitm/healthz`` and ``GET /_llmitm/readyz`` on llmitm's own address.

Served before the access checks: an orchestrator's probe carries no client key, and neither
answer says more than which of llmitm's parts is up (:mod:`llmitm.observe.health`). The
readiness checks read what the other addons expose; the store's waits at most
:data:`STORE_WAIT_S` for an opening in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Set
from typing import Any

import orjson
from mitmproxy import ctx, http

from llmitm.addons.access import addressed_to_llmitm
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.store import LlmStore
from llmitm.observe.health import HEALTHY, Check, readiness

HEALTHZ_PATH = "/_llmitm/healthz"
READYZ_PATH = "/_llmitm/readyz"
STORE_WAIT_S = 1.0


def _answer(flow: http.HTTPFlow, status: int, body: dict[str, Any]) -> None:
    flow.response = http.Response.make(
        status,
        orjson.dumps(body),
        {"content-type": "application/json", "cache-control": "no-store"},
    )


class LlmHealth:
    name = "llmitm_health"

    def __init__(self, settings: LlmitmSettings, store: LlmStore, relay: LlmRelay) -> None:
        self.settings = settings
        self.store = store
        self.relay = relay
        self._config_path = ""
        self._store_wanted = True
        self._proxyserver: Any = None

    def configure(self, updated: Set[str]) -> None:
        # Read once every addon has added its options (the store's comes after this one).
        if self._proxyserver is not None and updated & {"llmitm_config", "llmitm_store"}:
            self._read_options()

    def running(self) -> None:
        self._proxyserver = ctx.master.addons.get("proxyserver")
        self._read_options()

    def _read_options(self) -> None:
        self._config_path = ctx.options.llmitm_config
        self._store_wanted = self.store.location() is not None

    def request(self, flow: http.HTTPFlow) -> Any:
        if flow.response or flow.error or not flow.live or flow.request.method != "GET":
            return None
        path = flow.request.path.partition("?")[0]
        if path not in (HEALTHZ_PATH, READYZ_PATH) or not addressed_to_llmitm(flow):
            return None
        if path == HEALTHZ_PATH:
            _answer(flow, 200, HEALTHY)
            return None
        return self._ready(flow)

    async def _ready(self, flow: http.HTTPFlow) -> None:
        checks = [self._config_check(), await self._store_check(), self._relay_check()]
        checks.append(self._listening_check())
        _answer(flow, *readiness(checks))

    def _config_check(self) -> Check:
        if not self._config_path:
            return Check("config", True, "embedded defaults")
        source = self.settings.config.source
        if source != self._config_path:
            return Check("config", False, f"{self._config_path} is not loaded")
        return Check("config", True, source)

    async def _store_check(self) -> Check:
        if not self._store_wanted:
            return Check("store", True, "disabled")
        try:
            store = await asyncio.wait_for(self.store.ready(), STORE_WAIT_S)
        except TimeoutError:
            return Check("store", False, "still opening")
        if store is None:
            return Check("store", False, "could not be opened (see the proxy's log)")
        if not store.reachable():
            # Still ready: answers flow without the database, their writes wait for it. A
            # fleet's balancer must not take every proxy out when the database goes away.
            queued = store.stats().queued
            return Check("store", True, f"database unreachable; {queued} write(s) waiting")
        return Check("store", True)

    def _relay_check(self) -> Check:
        if self.relay.listening() is None:
            return Check("relay", False, "not started")
        return Check("relay", True)

    def _listening_check(self) -> Check:
        server = self._proxyserver
        if server is None:
            return Check("listening", False, "not running yet")
        addresses = server.listen_addrs()
        if not addresses or not all(instance.is_running for instance in server.servers):
            return Check("listening", False, "a proxy server is not running")
        return Check("listening", True, ", ".join(f"{a[0]}:{a[1]}" for a in addresses))
