"""``llmitm_stop_grace``: a stop lets the flows in flight end before llmitm closes anything.

mitmproxy's stop (SIGINT, SIGTERM, ``q``) runs every addon's ``done`` and then exits,
cancelling whatever is still under way. A flow's usage and record reach the store from its
last hook (``response`` or ``error``), so a flow still in flight at the stop was lost — also one
whose client already had its whole answer: a stream's ``response`` hook runs when the
upstream's body ends, which can be after its last event has reached the client, and a client
that hung up at that event ends its flow only once mitmproxy has read its close.

So this addon, whose ``done`` runs before every other llmitm addon's, returns a task that waits
until each flow in flight at the stop has ended, for at most ``llmitm_stop_grace`` seconds;
the recorder's and the store's ``done`` (which deliver the last records and close the store)
run after it. The proxy keeps serving meanwhile: mitmproxy's listeners stay open until the
process exits. A flow that started after the stop, or still runs when the grace is over, is
cut at the exit and not kept.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 5.0
"""Below the 10 s that ``llmitm run`` (and a service manager's usual stop timeout) waits
before a SIGKILL, well above the milliseconds an answered flow's last hooks take."""


class LlmDrain:
    name = "llmitm_drain"

    def __init__(self) -> None:
        self._live: set[str] = set()
        """The ids of the flows between their first hook and their last."""
        self._waiting: set[str] | None = None
        """Once stopping: the flows in flight at the stop that have not ended yet."""
        self._drained: asyncio.Event | None = None

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_stop_grace",
            float,
            DEFAULT_GRACE_S,
            "On a stop (SIGINT, SIGTERM), how many seconds the flows in flight get to end, "
            "so that their usage and recordings are kept; 0 stops at once.",
        )

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._live.add(flow.id)

    def response(self, flow: http.HTTPFlow) -> None:
        self._ended(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._ended(flow)

    def done(self) -> asyncio.Task[None] | None:
        grace = ctx.options.llmitm_stop_grace
        if not self._live or grace <= 0:
            return None
        self._waiting = set(self._live)
        self._drained = asyncio.Event()
        return asyncio.get_running_loop().create_task(
            self._drain(self._drained, grace), name="llmitm stop drain"
        )

    async def _drain(self, drained: asyncio.Event, grace: float) -> None:
        count = len(self._waiting or ())
        logger.info("llmitm: stopping once %d flow(s) in flight have ended", count)
        try:
            await asyncio.wait_for(drained.wait(), grace)
        except TimeoutError:
            left = len(self._waiting or ())
            logger.warning(
                "llmitm: stopping with %d flow(s) still in flight after %g s: they are not kept",
                left,
                grace,
            )

    def _ended(self, flow: http.HTTPFlow) -> None:
        self._live.discard(flow.id)
        waiting = self._waiting
        if waiting is None:
            return
        waiting.discard(flow.id)
        if not waiting and self._drained is not None:
            self._drained.set()
