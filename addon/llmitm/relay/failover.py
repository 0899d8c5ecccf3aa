"""The failover job: try a route's endpoints until one answers, then stream that answer.

It runs the attempt loop that ``routing`` decides (``tests/test_routing_loop.py`` is its
reference, on a fake clock): order the route's healthy endpoints (strategy, affinity), take
a concurrency slot (the next endpoint when one is at its cap, else a bounded wait), send,
and wait for the first byte of the body within the route's first-byte timeout. A connect
error, a timeout, a 429 or a 5xx before that first byte is recorded (the endpoint cools
down) and the next attempt goes elsewhere, or to the same endpoint after a backoff, within
the route's budget of attempts and time. The client sees none of it: only the winner's
status, headers and body reach mitmproxy. Once that first byte is on its way nothing is
retried; a cut, or a stream silent for the route's ``stream_idle_timeout``, ends the body
cleanly and the flow's stream callable closes the client's stream with a terminal error in
its protocol.

A plain (non-streamed) answer is read whole before its head is sent: a body cut short is
then one more failed attempt (retried elsewhere, or an OpenAI-shaped 502 at the end), never
a 200 with truncated JSON — once a head is sent, nothing can be taken back, and a plain
body has no in-band way to say it failed.

When no attempt succeeds the client gets one OpenAI-shaped error listing every attempt
(``attempts.attempts_error``); when every endpoint is at its cap and the wait times out, a
429 with ``Retry-After``. The slot is released on every path: success, error, upstream cut,
and the client going away (the relay server cancels the job, and ``finally`` runs).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from llmitm.relay.client import (
    UpstreamClient,
    UpstreamCut,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamStall,
)
from llmitm.relay.jobs import RelayReply
from llmitm.routing.attempts import AttemptLog, attempts_error, next_step
from llmitm.routing.config import Route
from llmitm.routing.engine import Routing
from llmitm.routing.limits import Lease
from llmitm.routing.outcomes import Outcome, outcome_for_status
from llmitm.routing.wait import SlotTaker, take_slot

logger = logging.getLogger(__name__)

Prepare = Callable[[str], UpstreamRequest | None]
"""The upstream request for an endpoint, ``None`` when that endpoint cannot serve it."""


@dataclass(slots=True)
class FailoverResult:
    """What the flow's later hooks need to know: who answered, after how many attempts, and
    how much of the wait was llmitm's own."""

    endpoint: str | None = None
    attempts: int = 0
    overhead: float = 0.0
    """Seconds spent in the job before the answer's head, minus the upstream attempts."""
    error: bool = False
    """The answer is llmitm's own error (nothing succeeded); no endpoint's plan applies."""
    request: UpstreamRequest | None = None
    """What the answering endpoint was sent (the recorder keeps it as the upstream leg)."""
    log: AttemptLog | None = None
    """Every attempt so far, for traces (one span per attempt)."""


@dataclass(slots=True)
class FailoverJob:
    routing: Routing
    route: Route
    model: str | None
    prepare: Prepare
    client: UpstreamClient = field(default_factory=UpstreamClient)
    """The relay's (its pools); a job of its own gets a client of its own."""
    connect_timeout: float = 10.0
    previous_response_id: str | None = None
    fingerprint: str | None = None
    owner_required: bool = False
    stream: bool = True
    """A streamed request: its first byte is due within the first-byte timeout. A plain
    one's first byte is its whole answer (a long reasoning call may take minutes), so it is
    bounded by what is left of the budget instead."""
    clock: Callable[[], float] = time.monotonic
    take: SlotTaker | None = None
    """How a slot is taken (a fleet's shared one); ``None``: from this process's limiter."""
    result: FailoverResult = field(default_factory=FailoverResult)
    _lease: Lease | None = None
    _skipped: set[str] = field(default_factory=set)

    async def serve(self, reply: RelayReply) -> None:
        try:
            await self._serve(reply)
        finally:
            if self._lease is not None:
                self._lease.release()

    async def _serve(self, reply: RelayReply) -> None:
        routing, route, model = self.routing, self.route, self.model
        started = self.clock()
        log = self.result.log = AttemptLog(started=started)
        policy = routing.retry_policy(route)
        first_byte_timeout = routing.first_byte_timeout(route)
        upstream_time = 0.0
        while True:
            now = self.clock()
            order = routing.choose(
                route,
                model,
                now,
                previous_response_id=self.previous_response_id,
                fingerprint=self.fingerprint,
                owner_required=self.owner_required,
            )
            endpoints = [e for e in order.endpoints if e not in self._skipped]
            cooling = [c for c in order.choice.cooling if c[0] not in self._skipped]
            if order.required:
                cooling = []  # the owner is the whole order; waiting for others is pointless
            step = next_step(log, now, endpoints, cooling, policy=policy, rng=routing.rng)
            if step.action == "give_up":
                await self._give_up(reply, log, order.choice.retry_at, now)
                return
            if step.delay:
                await asyncio.sleep(step.delay)
            endpoint = step.endpoint
            assert endpoint is not None
            request = self.prepare(endpoint)
            if request is None:
                self._skipped.add(endpoint)  # cannot speak this request: not an attempt
                continue
            lease = await self._slot(endpoint, endpoints, model)
            if lease is None:
                await self._over_cap(reply)
                return
            if lease.endpoint != endpoint:
                # The endpoint we meant was full: the slot we got decides where we go.
                endpoint = lease.endpoint
                request = self.prepare(endpoint)
                if request is None:
                    lease.release()
                    self._skipped.add(endpoint)
                    continue
            self._lease = lease
            attempt_started = self.clock()
            wait = first_byte_timeout
            if not self.stream:
                wait = max(first_byte_timeout, started + policy.max_total - attempt_started)
            response, outcome, first = await self._attempt(request, wait)
            attempt_ended = self.clock()
            upstream_time += attempt_ended - attempt_started
            log.add(endpoint, outcome, attempt_started, attempt_ended, model)
            if outcome.kind not in {"success", "client_error"}:
                routing.record(endpoint, outcome, attempt_ended, model)
                logger.info(
                    "llmitm: %s: %s; %s",
                    endpoint,
                    log.attempts[-1].describe(),
                    "trying again" if len(log) < policy.max_attempts else "giving up",
                )
                lease.release()
                self._lease = None
                continue
            assert response is not None
            self.result.endpoint = endpoint
            self.result.request = request
            self.result.attempts = len(log)
            self.result.overhead = max(0.0, attempt_ended - started - upstream_time)
            await self._relay(reply, endpoint, response, first)
            return

    async def _slot(self, endpoint: str, order: list[str], model: str | None) -> Lease | None:
        """A slot on ``endpoint``, else on the next endpoint of ``order`` with room, else the
        first one freed within the queue's timeout; ``None`` when the queue is full or the
        wait times out."""
        candidates = [(e, model) for e in [endpoint, *(e for e in order if e != endpoint)]]
        if self.take is not None:
            return await self.take(candidates)
        return await take_slot(self.routing.limiter, candidates)

    async def _attempt(
        self, request: UpstreamRequest, first_byte_timeout: float
    ) -> tuple[UpstreamResponse | None, Outcome, list[bytes]]:
        """Send ``request`` and wait for its head and first body bytes within the timeout."""
        response: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(first_byte_timeout):
                response = await self.client.send(request, connect_timeout=self.connect_timeout)
                if response.status >= 400:
                    body = await response.read_body(64 * 1024)
                    outcome = outcome_for_status(
                        response.status,
                        response.headers,
                        wall_now=time.time(),
                        message=_error_message(body),
                    )
                    if outcome.kind == "client_error":
                        # The request is wrong: the client gets this answer, translated.
                        return response, outcome, [body]
                    return None, outcome, []
                first = await response.first_pieces()
                if not self.stream:
                    first += await _rest_of_body(response)
                return response, outcome_for_status(response.status), first
        except TimeoutError:
            if response is not None:
                await response.aclose()
            message = f"no first byte within {first_byte_timeout:g} s"
            return None, Outcome("timeout", message=message), []
        except UpstreamError as exc:
            return None, Outcome("connect_error", message=str(exc)), []
        except UpstreamCut as exc:
            # Nothing reached the client yet: a body broken this early is the server's fault
            # and as retryable as a 502.
            status = response.status if response is not None else None
            return None, Outcome("server_error", status=status, message=str(exc)), []

    async def _relay(
        self, reply: RelayReply, endpoint: str, response: UpstreamResponse, first: list[bytes]
    ) -> None:
        routing, model = self.routing, self.model
        await reply.start(response.status, response.headers, first)
        if response.status >= 400 or not self.stream:
            await response.aclose()  # a client error or a plain answer, read whole already
            if response.status < 400:
                routing.record(endpoint, Outcome("success", response.status), self.clock(), model)
            return
        idle: float | None = routing.stream_idle_timeout(self.route)
        if idle is not None and math.isinf(idle):
            idle = None  # the limit was lifted (llmitm_stream_idle_timeout < 0)
        try:
            await response.relay_body(reply.write, reply.drain, idle=idle)
        except UpstreamCut as exc:
            logger.warning("llmitm: %s: the upstream stream was cut: %s", endpoint, exc)
            kind = "timeout" if isinstance(exc, UpstreamStall) else "cut"
            routing.record(
                endpoint,
                Outcome(kind, after_first_byte=True, message=str(exc)),
                self.clock(),
                model,
            )
            return
        routing.record(endpoint, Outcome("success", response.status), self.clock(), model)

    async def _give_up(
        self, reply: RelayReply, log: AttemptLog, retry_at: float | None, now: float
    ) -> None:
        error = attempts_error(log, retry_at=retry_at, now=now)
        logger.warning("llmitm: %s", error.body["error"]["message"])
        headers: list[tuple[str, str]] = [("x-should-retry", "false")]
        if error.retry_after is not None:
            headers.append(("retry-after", str(max(1, math.ceil(error.retry_after)))))
        self.result.error = True
        self.result.attempts = len(log)
        await reply.json(error.status, error.body, headers)

    async def _over_cap(self, reply: RelayReply) -> None:
        wait = self.routing.limiter.wait
        self.result.error = True
        body = {
            "error": {
                "message": "Every endpoint of this route is at its concurrency limit; "
                f"retry in {wait.retry_after:g} s.",
                "type": "rate_limit_error",
                "param": None,
                "code": "concurrency_limit",
            }
        }
        headers = [("retry-after", str(max(1, math.ceil(wait.retry_after))))]
        await reply.json(429, body, headers)


async def _rest_of_body(response: UpstreamResponse) -> list[bytes]:
    """What follows the first pieces of a plain answer, to its end (:class:`UpstreamCut` when
    it ends early). mitmproxy buffers a plain body whole anyway, so this adds no new bound."""
    pieces: list[bytes] = []

    async def nothing() -> None:
        return None

    await response.relay_body(pieces.extend, nothing)
    return pieces


def _error_message(body: bytes) -> str:
    """The upstream error's message, for the attempts list (short)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace").strip()
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:300]
        if isinstance(error, str):
            return error[:300]
    return ""
