"""One proxy's routing state, built from the configuration, and the questions the proxy asks
of it for each request.

The five routing modules each own one concern (``health``, ``limits``, ``strategies``,
``attempts``, ``affinity``); :class:`Routing` holds one instance of each for the whole proxy
and composes them the way ``tests/test_routing_loop.py`` shows: the strategy orders a route's
healthy endpoints, affinity moves the conversation's endpoint to the front when it is
usable, and the attempt loop (the relay's failover job, or the direct path's single try)
reports every outcome back so health and affinity learn from it.

Health and caps are keyed by the model as the route sends it (the route's alias, else the
client's model) — the name ``max_concurrency_per_model`` uses too — not by an Azure
deployment name, which differs per endpoint.

A fleet of proxies shares what one of them learns: an :class:`Observer` hears each cooldown
this proxy starts (to tell the others), :meth:`Routing.served` says whether a turn taught
affinity something new (a pin the others must know before the client's next turn), and
:meth:`Routing.adopt_cooldown` and :meth:`Routing.adopt_pin` take in what the others learned.
The sharing itself is I/O, done by the proxy's shell.

Sans-IO: ``now`` is a monotonic time passed in; randomness is an injected ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

from llmitm.routing.affinity import Affinity, prefer
from llmitm.routing.attempts import RetryPolicy
from llmitm.routing.config import Config, Route, stream_idle_limit
from llmitm.routing.health import Health, HealthPolicy
from llmitm.routing.limits import Limiter, WaitPolicy
from llmitm.routing.outcomes import Outcome
from llmitm.routing.strategies import Choice, choose


@dataclass(frozen=True, slots=True)
class Order:
    """The endpoints to try for one request, best first, and what was left out."""

    endpoints: tuple[str, ...]
    choice: Choice
    """The strategy's choice before affinity (its ``cooling`` and ``retry_at``)."""
    required: bool = False
    """Only ``endpoints[0]`` can serve the request (it owns the previous response)."""


class Observer(Protocol):
    """Hears what this proxy's routing learns (for a fleet's shared state)."""

    def cooled(self, endpoint: str, model: str | None, seconds: float, reason: str) -> None:
        """A cooldown of ``seconds`` started (or grew) for an endpoint or endpoint-model."""


class Routing:
    """Health, caps, affinity and strategy state of one proxy."""

    observer: Observer | None = None

    def __init__(self, config: Config, *, rng: random.Random | None = None) -> None:
        self.config = config
        settings = config.routing
        self.health = Health(
            HealthPolicy(
                cooldown=settings.cooldown,
                failure_threshold=settings.failure_threshold,
                max_retry_after=settings.max_retry_after,
            )
        )
        self.limiter = Limiter(
            {name: e.max_concurrency for name, e in config.endpoints.items()},
            {
                (name, model): cap
                for name, e in config.endpoints.items()
                for model, cap in e.max_concurrency_per_model.items()
            },
            WaitPolicy(
                max_waiters=settings.queue_size,
                timeout=settings.queue_timeout,
                retry_after=settings.queue_retry_after,
            ),
        )
        self.affinity = Affinity(conversation_ttl=settings.affinity_ttl)
        self.rng = rng or random.Random()
        self._weights = {name: e.weight for name, e in config.endpoints.items()}

    # --- per route ------------------------------------------------------------------------

    def relayed(self, route: Route) -> bool:
        """Whether a request on ``route`` may need a second attempt, so it must go through
        the relay (mitmproxy cannot retry). A single endpoint without retries stays on
        mitmproxy's direct path, which costs half the CPU per streamed event."""
        return len(route.endpoints) > 1 or route.max_attempts > 1

    def retry_policy(self, route: Route) -> RetryPolicy:
        settings = self.config.routing
        return RetryPolicy(
            max_attempts=route.max_attempts,
            max_total=route.timeout if route.timeout is not None else settings.timeout,
            backoff_base=settings.backoff,
            backoff_max=max(settings.backoff_max, settings.backoff),
        )

    def first_byte_timeout(self, route: Route) -> float:
        if route.first_byte_timeout is not None:
            return route.first_byte_timeout
        return self.config.routing.first_byte_timeout

    def stream_idle_timeout(self, route: Route) -> float:
        """Seconds a started stream on ``route`` may go without an upstream byte."""
        return stream_idle_limit(self.config, route)

    def choose(
        self,
        route: Route,
        model: str | None,
        now: float,
        *,
        single_attempt: bool = False,
        previous_response_id: str | None = None,
        fingerprint: str | None = None,
        owner_required: bool = False,
    ) -> Order:
        """The endpoints an attempt of a request on ``route`` may go to, best first: the
        one choice both the direct path and the failover job make.

        ``single_attempt``: the request gets one try on mitmproxy's direct path (nothing
        can retry it): the route's first endpoint, whatever its health, since there is no
        later attempt to wait for or move to. Otherwise :meth:`order`."""
        if single_attempt:
            first = route.endpoints[0]
            return Order((first,), Choice((first,)), required=True)
        return self.order(
            route,
            model,
            now,
            previous_response_id=previous_response_id,
            fingerprint=fingerprint,
            owner_required=owner_required,
        )

    def order(
        self,
        route: Route,
        model: str | None,
        now: float,
        *,
        previous_response_id: str | None = None,
        fingerprint: str | None = None,
        owner_required: bool = False,
    ) -> Order:
        """The route's endpoints for one attempt: the strategy's order of the healthy ones,
        with the conversation's endpoint first when it is healthy and under its cap.

        ``owner_required``: the owner of ``previous_response_id`` is the only endpoint that
        can serve the request (a native Responses endpoint holds the conversation's state),
        so it is the whole order whatever its health.
        """
        choice = choose(
            route.strategy,  # type: ignore[arg-type]
            route.endpoints,
            health=self.health,
            now=now,
            model=model,
            weights=self._weights,
            rng=self.rng,
            in_flight=self.limiter.in_flight,
        )
        affine = None
        if route.affinity:
            affine = self.affinity.endpoint_for(
                now, previous_response_id=previous_response_id, fingerprint=fingerprint
            )
        required = bool(
            owner_required
            and previous_response_id
            and affine is not None
            and affine == self.affinity.owner_of(previous_response_id, now)
        )
        ordered = prefer(
            choice.order,
            affine,
            lambda endpoint: self.limiter.has_room(endpoint, model),
            required=required,
        )
        return Order(tuple(ordered), choice, required)

    def owner(
        self, previous_response_id: str | None, now: float, *, remembered: str | None = None
    ) -> str | None:
        """The endpoint that produced ``previous_response_id``, if known: from this process's
        memory, else ``remembered`` (the store's owner, from before a restart), which then
        seeds the memory so the attempt order puts that endpoint first."""
        if not previous_response_id:
            return None
        owner = self.affinity.owner_of(previous_response_id, now)
        if owner is None and remembered is not None and remembered in self.config.endpoints:
            self.affinity.served(remembered, now, response_id=previous_response_id)
            owner = remembered
        return owner

    # --- outcomes -------------------------------------------------------------------------

    def record(self, endpoint: str, outcome: Outcome, now: float, model: str | None) -> None:
        cooled = self.health.record(endpoint, outcome, now, model)
        if cooled is not None and self.observer is not None:
            (name, scope), until = cooled
            self.observer.cooled(name, scope, until - now, outcome.kind)

    def served(
        self,
        endpoint: str,
        now: float,
        *,
        response_id: str | None = None,
        fingerprint: str | None = None,
    ) -> bool:
        """Remember who served a conversation's turn (affinity); ``True`` when that is new
        (a response id, or a conversation that lived elsewhere or nowhere), not a refresh."""
        affinity = self.affinity
        new = bool(response_id and affinity.owner_of(response_id, now) != endpoint) or bool(
            fingerprint and affinity.conversations.get(fingerprint, now) != endpoint
        )
        affinity.served(endpoint, now, response_id=response_id, fingerprint=fingerprint)
        return new

    def adopt_cooldown(
        self, endpoint: str, model: str | None, remaining: float, now: float
    ) -> None:
        """A cooldown another proxy started, ``remaining`` seconds from ``now``."""
        if endpoint in self.config.endpoints and remaining > 0:
            self.health.cool(endpoint, model, now + remaining)

    def adopt_pin(
        self,
        endpoint: str,
        now: float,
        *,
        response_id: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """An affinity another proxy learned (its pin, read from the shared table)."""
        if endpoint in self.config.endpoints:
            self.affinity.served(endpoint, now, response_id=response_id, fingerprint=fingerprint)

    def knows(self, previous_response_id: str | None, fingerprint: str | None, now: float) -> bool:
        """Whether this proxy's memory already answers a request's affinity question (the
        previous response's owner first, else the conversation's endpoint)."""
        if previous_response_id:
            return self.affinity.owner_of(previous_response_id, now) is not None
        if fingerprint:
            return self.affinity.conversations.get(fingerprint, now) is not None
        return True

    # --- for people -----------------------------------------------------------------------

    def snapshot(self, now: float) -> dict[str, Any]:
        """Counters and health per endpoint, as JSON-ready data (the status route)."""
        endpoints: dict[str, Any] = {}
        for name in self.config.endpoints:
            state = self.health.state(name)
            cooling = max(0.0, self.health.available_at(name) - now)
            models = {}
            for model in self.health.models(name):
                model_state = self.health.state(name, model)
                models[model] = {
                    "in_flight": self.limiter.in_flight(name, model),
                    "cooling_s": round(max(0.0, model_state.cooling_until - now), 3),
                    "failures": model_state.failures,
                    "last_outcome": model_state.last,
                }
            endpoints[name] = {
                "in_flight": self.limiter.in_flight(name),
                "max_concurrency": self.limiter.cap(name),
                "cooling_s": round(cooling, 3),
                "failures": state.failures,
                "last_outcome": state.last,
                "models": models,
            }
        return {
            "endpoints": endpoints,
            "in_flight": self.limiter.total_in_flight(),
            "waiting": self.limiter.waiting,
            "affinity": {
                "responses": len(self.affinity.responses),
                "conversations": len(self.affinity.conversations),
            },
        }
