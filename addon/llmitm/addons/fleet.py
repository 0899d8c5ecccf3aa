"""``llmitm_fleet``: routing state shared by every proxy using one shared store.

When the store is a database server (``store.fleet.is_shared``), the proxies using it form a
fleet: this addon joins it in ``running``, heartbeats every third of ``[routing] fleet_lease``,
and leaves in ``done`` (freeing this proxy's slots at once). While it is a member:

- concurrency caps hold across the fleet (``fleet_slots``; the router and the failover job
  take their slots through :meth:`LlmFleet.taker`);
- a cooldown this proxy starts is written for all, and one another proxy starts reaches this
  proxy's routing by NOTIFY (and by a re-read at each heartbeat, in case a notice was lost);
- affinity pins (response id → endpoint, conversation → endpoint): a new one is in the shared
  table before the client hears the end of the answer that made it (so its next turn finds
  it on any proxy), a refresh goes in the next small batch; a request whose affinity this
  proxy does not know asks the shared table first (:meth:`LlmFleet.lookup`). A new
  conversation's pin goes with its request's slot (:meth:`LlmFleet.slot_pin`: in the take
  statement, before the request reaches its endpoint); a new response id's pin, and a
  conversation's whose endpoint has no cap (no slot to carry it), are written as the answer
  ends, and the answer's end waits for them.

With a local store (SQLite) or none, or ``--set llmitm_fleet=false``, nothing here runs and
each proxy decides alone. When the database is unreachable the same holds until it answers
again (``fleet_link``), and nothing waits longer than ``[routing] fleet_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from functools import partial
from typing import Any

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

from llmitm.addons.fleet_batch import TurnBatch
from llmitm.addons.fleet_link import FleetLink
from llmitm.addons.fleet_slots import SharedSlots, SlotPin
from llmitm.addons.settings import LlmitmSettings
from llmitm.routing.engine import Routing
from llmitm.routing.limits import Key, Lease
from llmitm.routing.wait import SlotTaker
from llmitm.store.fleet import Cooldown, FleetState, Pin
from llmitm.store.open import open_fleet

logger = logging.getLogger(__name__)

PIN_BATCH_S = 0.05
"""Pins learned within this long go to the shared table in one statement."""
PINS_MAX = 10_000
"""Pins waiting for their batch at most; beyond, a pin stays this proxy's own."""
CLOSE_WAIT_S = 2.0


class LlmFleet:
    name = "llmitm_fleet"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings
        self.link: FleetLink | None = None
        self.slots: SharedSlots | None = None
        self._lookups: TurnBatch[tuple[str | None, str | None], dict[str, str]] | None = None
        self._new_pins: TurnBatch[Sequence[Pin], None] | None = None
        self._routing: Routing | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._joined = False
        self._pins: list[Pin] = []
        self.pins_dropped = 0

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_fleet",
            bool,
            True,
            "Share routing state (concurrency caps, cooldowns, affinity) with every proxy "
            "using the same store, when the store is a database server (PostgreSQL). "
            "false: this proxy decides alone.",
        )

    # --- lifecycle --------------------------------------------------------------------------

    def running(self) -> asyncio.Task[None] | None:
        if self.link is not None or not ctx.options.llmitm_fleet:
            return None
        option = ctx.options.llmitm_store
        location = option if option is not None else self.settings.config.settings.store
        routing = self.settings.config.routing
        state = open_fleet(location, lease=routing.fleet_lease, timeout=routing.fleet_timeout)
        if state is None:
            return None
        self.link = FleetLink(state)
        self.slots = SharedSlots(self.link)
        self._lookups = TurnBatch(self.link, state.pinned, "llmitm fleet lookups")
        self._new_pins = TurnBatch(self.link, partial(_pin_all, state), "llmitm fleet pins")
        # Returned: mitmproxy awaits it, so the first flows already share (or, when the
        # database does not answer within the timeout, start alone and join later).
        return asyncio.get_running_loop().create_task(self._start(state), name="llmitm fleet")

    async def _start(self, state: FleetState) -> None:
        await self._join(state)
        if not self._joined:
            logger.warning("llmitm: cannot join the fleet yet; deciding alone, retrying")
        self._upkeep = asyncio.get_running_loop().create_task(
            self._keep_up(state), name="llmitm fleet upkeep"
        )

    async def _join(self, state: FleetState) -> None:
        assert self.link is not None
        joined = await self.link.call(partial(self._open, state), retry=True)
        if joined:
            self._joined = True
            logger.info("llmitm: joined the fleet as %s", state.proxy)

    async def _open(self, state: FleetState) -> bool:
        await state.open(self._heard)
        await self._catch_up(state)
        return True

    async def _keep_up(self, state: FleetState) -> None:
        assert self.link is not None and self.slots is not None
        link, slots = self.link, self.slots
        while True:
            await asyncio.sleep(state.lease / 3)
            try:
                await self._beat(state, link, slots)
            except Exception:  # a bug must not end the heartbeat: the fleet would drop us
                logger.exception("llmitm: the fleet's upkeep failed; trying again")

    async def _beat(self, state: FleetState, link: FleetLink, slots: SharedSlots) -> None:
        if not self._joined:
            await self._join(state)
            return
        held = list(slots.held.values())
        if await link.call(partial(state.heartbeat, held), retry=True) is None:
            return
        await slots.release_shared(list(slots.unreleased.values()))
        await link.call(partial(self._catch_up, state))

    async def _catch_up(self, state: FleetState) -> None:
        """Take in every running cooldown (a notice may have been missed)."""
        routing = self._routing
        if routing is None:
            return
        now = time.monotonic()
        for cooling in await state.cooldowns():
            routing.adopt_cooldown(cooling.endpoint, cooling.model, cooling.remaining, now)

    def done(self) -> asyncio.Task[None] | None:
        link, self.link = self.link, None
        if link is None:
            return None
        if self._upkeep is not None:
            self._upkeep.cancel()
        return asyncio.get_running_loop().create_task(self._close(link), name="llmitm fleet close")

    async def _close(self, link: FleetLink) -> None:
        await link.drain(CLOSE_WAIT_S)
        if self._joined:
            await link.state.close()  # frees what is still held, at once

    # --- what the router uses ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        """This proxy is in a fleet (the store is a shared database)."""
        return self.link is not None

    def attach(self, routing: Routing) -> None:
        """Share what ``routing`` learns (the router's routing state, new or rebuilt)."""
        self._routing = routing
        routing.observer = self  # it tells the fleet nothing until this proxy is in one
        if self.link is not None:
            self.link.spawn(self._adopt_running(), "llmitm fleet cooldowns")

    async def _adopt_running(self) -> None:
        if self.link is not None:
            await self.link.call(partial(self._catch_up, self.link.state))

    def taker(self, routing: Routing, pin: SlotPin | None = None) -> SlotTaker | None:
        """How ``routing``'s requests take slots in the fleet (a request's ``pin`` with its
        slot); ``None`` without a fleet."""
        if self.link is None or self.slots is None:
            return None
        slots = self.slots

        async def take(candidates: Sequence[Key]) -> Lease | None:
            return await slots.take(routing.limiter, candidates, pin)

        return take

    def slot_pin(self, routing: Routing, fingerprint: str | None) -> SlotPin | None:
        """The pin a request's take carries: its conversation's, when neither this proxy nor
        (after :meth:`lookup`) the fleet knows where it lives — a new conversation."""
        if self.link is None or fingerprint is None:
            return None
        if routing.knows(None, fingerprint, time.monotonic()):
            return None  # known: its answer refreshes the pin (in a batch) or moves it
        return SlotPin(fingerprint, routing.affinity.conversations.ttl)

    async def lookup(
        self, routing: Routing, previous_response_id: str | None, fingerprint: str | None
    ) -> None:
        """Teach ``routing`` the fleet's affinity for a request this proxy knows nothing of."""
        lookups = self._lookups
        if lookups is None or routing.knows(previous_response_id, fingerprint, time.monotonic()):
            return
        # The look-ups of a burst's requests go in one statement.
        pins = await lookups.ask((previous_response_id, fingerprint))
        if not pins:
            return
        now = time.monotonic()
        if previous_response_id and "response" in pins:
            routing.adopt_pin(pins["response"], now, response_id=previous_response_id)
        if fingerprint and "conversation" in pins:
            routing.adopt_pin(pins["conversation"], now, fingerprint=fingerprint)

    # --- what this proxy learned -------------------------------------------------------------

    def cooled(self, endpoint: str, model: str | None, seconds: float, reason: str) -> None:
        link = self.link
        if link is None or not link.up:
            return
        cooldown = Cooldown(endpoint, model, seconds, reason)
        link.spawn(link.call(partial(link.state.cool, cooldown)), "llmitm fleet cool")

    def share_turn(
        self,
        routing: Routing,
        endpoint: str,
        response_id: str | None,
        fingerprint: str | None,
        new: bool,
        slot_pin: SlotPin | None = None,
    ) -> Awaitable[None] | None:
        """Tell the fleet who served a turn: at once when it is ``new`` (the caller awaits
        it, bounded by the timeout, before the client's answer ends; the new pins of one turn
        of the event loop in one statement), else in the next batch. A conversation's pin
        that went with the request's slot (``slot_pin``, on this endpoint) is there already."""
        link, new_pins = self.link, self._new_pins
        if link is None or new_pins is None or not link.up:
            return None
        affinity = routing.affinity
        pins = []
        if response_id:
            pins.append(Pin("response", response_id, endpoint, affinity.responses.ttl))
        if fingerprint and not (new and slot_pin is not None and slot_pin.endpoint == endpoint):
            pins.append(Pin("conversation", fingerprint, endpoint, affinity.conversations.ttl))
        if not pins:
            return None
        if new:
            return new_pins.ask(pins)
        if len(self._pins) + len(pins) > PINS_MAX:
            self.pins_dropped += len(pins)
            return None
        if not self._pins:
            link.spawn(self._flush_pins(link), "llmitm fleet pins")
        self._pins += pins
        return None

    async def _flush_pins(self, link: FleetLink) -> None:
        await asyncio.sleep(PIN_BATCH_S)
        pins, self._pins = self._pins, []
        await link.call(partial(link.state.pin, pins))

    # --- what the others say ----------------------------------------------------------------

    def _heard(self, kind: str, notice: dict[str, Any]) -> None:
        if kind == "free" and self.slots is not None:
            endpoint = notice.get("endpoint")
            self.slots.freed(endpoint if isinstance(endpoint, str) else None)
        elif kind == "cool" and self._routing is not None:
            endpoint, model = notice.get("endpoint"), notice.get("model")
            remaining = notice.get("remaining")
            if isinstance(endpoint, str) and isinstance(remaining, int | float):
                model = model if isinstance(model, str) else None
                self._routing.adopt_cooldown(endpoint, model, remaining, time.monotonic())

    # --- for people -------------------------------------------------------------------------

    async def status(self) -> dict[str, Any] | None:
        """The fleet as the status route shows it; ``None`` without a fleet."""
        link, slots = self.link, self.slots
        if link is None or slots is None:
            return None
        members = await link.call(link.state.members) if self._joined else None
        return {
            "proxy": link.state.proxy,
            "shared": link.up,
            "lease_s": link.state.lease,
            "slots_held": len(slots.held),
            "waiting": slots.waiting,
            "fallbacks": link.fallbacks,
            "failures": link.failures,
            "pins_dropped": self.pins_dropped,
            "proxies": None
            if members is None
            else [
                {
                    "id": m.id,
                    "host": m.host,
                    "pid": m.pid,
                    "alive": m.alive,
                    "last_heartbeat_s": round(m.heartbeat_age, 3),
                    "slots": m.slots,
                }
                for m in members
            ],
        }


async def _pin_all(state: FleetState, asked: Sequence[Sequence[Pin]]) -> list[None]:
    """Several requests' new pins in one call."""
    await state.pin([pin for pins in asked for pin in pins])
    return [None] * len(asked)
