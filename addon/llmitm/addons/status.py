"""``GET /_llmitm/status`` on llmitm's own address: what routing holds right now.

In-flight counters, waiters and cooldowns per endpoint (the router's routing state), the
relay's registrations and connections, and the event loop's task count; each is back to
its idle value once every flow has ended. With a fleet (a shared store), ``fleet`` adds this
proxy's id, whether the shared state answers, and every proxy of the fleet: alive or not,
its last heartbeat and the slots it holds per endpoint.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import orjson
from mitmproxy import http

from llmitm.addons.access import addressed_to_llmitm
from llmitm.addons.fleet import LlmFleet
from llmitm.addons.relay import LlmRelay
from llmitm.addons.router import LlmRouter

STATUS_PATH = "/_llmitm/status"


class LlmStatus:
    """Answers the status route (just before the router, which it reports on)."""

    name = "llmitm_status"

    def __init__(
        self, router: LlmRouter, relay: LlmRelay | None = None, fleet: LlmFleet | None = None
    ) -> None:
        self.router = router
        self.relay = relay
        self.fleet = fleet

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response or flow.error or not flow.live:
            return None
        request = flow.request
        if request.method == "GET" and request.path == STATUS_PATH and addressed_to_llmitm(flow):
            if self.fleet is not None and self.fleet.active:
                return self._with_fleet(flow, self.fleet)
            self._status(flow)
        return None

    async def _with_fleet(self, flow: http.HTTPFlow, fleet: LlmFleet) -> None:
        self._status(flow, await fleet.status())

    def _status(self, flow: http.HTTPFlow, fleet: dict[str, Any] | None = None) -> None:
        snapshot = self.router.routing.snapshot(time.monotonic())
        if fleet is not None:
            snapshot["fleet"] = fleet
        relay = self.relay.listening() if self.relay is not None else None
        if relay is not None:
            snapshot["relay"] = relay.stats()
        snapshot["process"] = {"asyncio_tasks": len(asyncio.all_tasks())}
        flow.response = http.Response.make(
            200,
            orjson.dumps(snapshot, option=orjson.OPT_INDENT_2),
            {"content-type": "application/json", "cache-control": "no-store"},
        )
