"""Endpoint health: which endpoints (and endpoint-models) are cooling down, and until when.

This module owns one thing: turning attempt outcomes into cooldowns. It does not choose
endpoints (``strategies``), count requests in flight (``limits``) or decide retries
(``attempts``).

Two scopes, because failures have two scopes:

- a **connect error** says the server is unreachable, so the whole endpoint cools down;
- a **429, 5xx, timeout or cut** is reported for one model when the model is known (an Azure
  deployment has its own rate limit; llama.cpp may have one model loaded and not another),
  so only that endpoint-model cools down, and the endpoint's other models stay usable.

An endpoint-model is available when neither it nor its endpoint is cooling.

Rules:

- a 429 cools down for exactly what the upstream asked (``Retry-After`` / ``retry-after-ms``),
  capped by ``max_retry_after`` so a buggy "come back tomorrow" cannot bench an endpoint for
  a day; a 429 without a hint cools for ``rate_limit_cooldown``;
- other failures cool for ``cooldown`` once ``failure_threshold`` of them happened in a row;
  a 5xx with a ``Retry-After`` (a 503 during maintenance) cools for at least what it asked;
- a success resets the run of failures; a cooldown never shortens an existing one;
- after a cooldown ends the run of failures is kept, so the first request after it is a
  probe: one more failure cools again at once (a half-open circuit), one success clears it;
- client errors and client aborts say nothing about the endpoint and change nothing;
- at most :data:`MODEL_KEYS` endpoint-models are remembered, those with the latest outcomes:
  model names are the clients' to choose (a route may match ``gpt-*``), so what is kept for
  them must not grow with every name ever sent. A model forgotten is as one never seen.

Time is a monotonic ``now`` in seconds, passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmitm.routing.outcomes import Outcome, OutcomeKind

Key = tuple[str, str | None]
"""(endpoint, model); model ``None`` is the endpoint as a whole."""

MODEL_KEYS = 1024
"""The most endpoint-models remembered; the one whose last outcome is oldest goes first."""


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    cooldown: float = 5.0
    """Seconds an endpoint (or endpoint-model) rests after ``failure_threshold`` failures."""
    failure_threshold: int = 1
    """Failures in a row that start a cooldown (429s cool at once: the upstream said so)."""
    rate_limit_cooldown: float | None = None
    """Cooldown of a 429 without Retry-After (``None``: ``cooldown``)."""
    max_retry_after: float = 300.0
    """Upper bound on any cooldown taken from the upstream's Retry-After."""

    def __post_init__(self) -> None:
        if self.cooldown < 0 or self.max_retry_after < 0:
            raise ValueError("cooldowns must not be negative")
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")


@dataclass(slots=True)
class KeyHealth:
    """What is known about one endpoint or endpoint-model."""

    failures: int = 0
    """Failures in a row since the last success."""
    cooling_until: float = float("-inf")
    last: OutcomeKind | None = None
    last_at: float | None = None


# Outcomes that say the server as a whole is gone, not just one model on it.
_ENDPOINT_WIDE: frozenset[str] = frozenset({"connect_error"})


class Health:
    """Cooldown bookkeeping for every endpoint and endpoint-model seen so far."""

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.policy = policy or HealthPolicy()
        self._keys: dict[Key, KeyHealth] = {}
        """Every key known, the one touched longest ago first."""
        self._model_keys = 0

    def record(
        self, endpoint: str, outcome: Outcome, now: float, model: str | None = None
    ) -> tuple[Key, float] | None:
        """Account one attempt's outcome; may start or extend a cooldown: then the key that
        cools and until when."""
        if outcome.kind in {"client_error", "aborted"}:
            return None
        scope: Key = (endpoint, None if outcome.kind in _ENDPOINT_WIDE else model)
        state = self._touch(scope)
        state.last, state.last_at = outcome.kind, now
        if outcome.kind == "success":
            state.failures = 0
            if model is not None:
                # A success on a model proves the endpoint reachable too.
                whole = self._keys.get((endpoint, None))
                if whole is not None:
                    whole.failures = 0
            # A success that lands during a cooldown (an attempt started before it) leaves
            # the cooldown alone: a 429's pause is the upstream's to lift, not ours.
            return None
        state.failures += 1
        duration = self._cooldown_for(outcome, state.failures)
        if duration is None or now + duration <= state.cooling_until:
            return None
        state.cooling_until = now + duration
        return scope, state.cooling_until

    def cool(self, endpoint: str, model: str | None, until: float) -> None:
        """A cooldown learned elsewhere (another proxy of the fleet): extends, never shortens,
        and leaves the run of failures alone."""
        state = self._touch((endpoint, model))
        state.cooling_until = max(state.cooling_until, until)

    def _touch(self, key: Key) -> KeyHealth:
        """``key``'s state, moved to the newest end (made when new); a new endpoint-model
        beyond :data:`MODEL_KEYS` makes the oldest one go."""
        state = self._keys.pop(key, None)
        if state is None:
            state = KeyHealth()
            if key[1] is not None:
                self._model_keys += 1
                if self._model_keys > MODEL_KEYS:
                    self._forget_oldest_model()
        self._keys[key] = state
        return state

    def _forget_oldest_model(self) -> None:
        oldest = next(k for k in self._keys if k[1] is not None)
        del self._keys[oldest]
        self._model_keys -= 1

    def _cooldown_for(self, outcome: Outcome, failures: int) -> float | None:
        policy = self.policy
        asked = None
        if outcome.retry_after is not None:
            asked = min(outcome.retry_after, policy.max_retry_after)
        if outcome.kind == "rate_limited":
            if asked is not None:
                return asked
            if policy.rate_limit_cooldown is not None:
                return policy.rate_limit_cooldown
            return policy.cooldown
        if failures < policy.failure_threshold:
            return asked  # a 503 that names its own pause is honoured even below threshold
        return policy.cooldown if asked is None else max(policy.cooldown, asked)

    def available_at(self, endpoint: str, model: str | None = None) -> float:
        """The monotonic time from which ``endpoint`` (for ``model``) may be tried again;
        ``-inf`` if it never cooled."""
        when = self._state(endpoint, None).cooling_until
        if model is not None:
            when = max(when, self._state(endpoint, model).cooling_until)
        return when

    def is_available(self, endpoint: str, now: float, model: str | None = None) -> bool:
        return now >= self.available_at(endpoint, model)

    def earliest(
        self, endpoints: Iterable[str], model: str | None = None
    ) -> tuple[str, float] | None:
        """The endpoint among ``endpoints`` that becomes available first (ties: the first
        listed), and when; ``None`` for an empty list."""
        best: tuple[str, float] | None = None
        for name in endpoints:
            when = self.available_at(name, model)
            if best is None or when < best[1]:
                best = (name, when)
        return best

    def models(self, endpoint: str) -> list[str]:
        """The models of ``endpoint`` something is known about (for the status route)."""
        return sorted(m for e, m in self._keys if e == endpoint and m is not None)

    def state(self, endpoint: str, model: str | None = None) -> KeyHealth:
        """A copy of what is known about one key (for the console and tests)."""
        current = self._state(endpoint, model)
        return KeyHealth(current.failures, current.cooling_until, current.last, current.last_at)

    def _state(self, endpoint: str, model: str | None) -> KeyHealth:
        return self._keys.get((endpoint, model)) or _NEVER_SEEN


_NEVER_SEEN = KeyHealth()
