"""Retries and failover for one request: what may be retried, where the next attempt goes,
how long to wait before it, when to give up, and the error that lists every attempt.

This module owns the per-request loop's decisions; the proxy owns the loop. Rules:

- **retryable** before the first byte: connect error, timeout (and 408), 429, 5xx;
- **never retried**: other 4xx (the request is wrong, another endpoint will say the same),
  a client abort, and anything after the first byte reached the client (the client has seen
  a status and maybe part of a stream; it gets a terminal error in its protocol instead);
- **failover is immediate**: an untried healthy endpoint is tried at once, no backoff;
- **retrying an endpoint already tried** (the only one, or every one failed) waits an
  exponential backoff with jitter, at least as long as the upstream's ``Retry-After`` and
  until the endpoint's cooldown ends;
- a :class:`RetryPolicy` **budget** bounds attempts and total time: a wait that would end
  past the deadline is not started, the request gives up now with the attempts so far.

:class:`AttemptLog` keeps one :class:`Attempt` per try; :func:`attempts_error` renders the
one clear OpenAI-shaped error a client gets when every attempt failed.

Pure: monotonic times and an injected ``random.Random`` in, decisions out.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llmitm.routing.outcomes import Outcome, OutcomeKind
from llmitm.wire.errors import ApiError, openai_error_body

_RETRYABLE: frozenset[str] = frozenset({"connect_error", "timeout", "rate_limited", "server_error"})


def retryable(outcome: Outcome) -> bool:
    """Whether another attempt (here or elsewhere) may turn this outcome into a success."""
    return outcome.kind in _RETRYABLE and not outcome.after_first_byte


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    """Attempts in all, the first one included."""
    max_total: float = 60.0
    """Seconds from the request's arrival after which no new attempt starts."""
    backoff_base: float = 0.5
    backoff_factor: float = 2.0
    backoff_max: float = 8.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if min(self.max_total, self.backoff_base, self.backoff_max) < 0 or self.backoff_factor < 1:
            raise ValueError("budget and backoff values must not be negative (factor >= 1)")


def backoff_delay(retry: int, policy: RetryPolicy, rng: random.Random) -> float:
    """The pause before retry number ``retry`` (0 for the first retry) of the same endpoint.

    "Equal jitter": half the exponential step is fixed, half random. Fully random delays
    ("full jitter") may be ~0, which hammers an endpoint that just failed; no jitter makes
    every client of a failed upstream come back in the same instant.
    """
    step = min(policy.backoff_max, policy.backoff_base * policy.backoff_factor**retry)
    return step / 2 + rng.uniform(0, step / 2)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of one endpoint."""

    endpoint: str
    outcome: Outcome
    started: float
    duration: float
    model: str | None = None

    def as_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "endpoint": self.endpoint,
            "outcome": self.outcome.kind,
            "status": self.outcome.status,
            "duration_ms": round(self.duration * 1000),
        }
        if self.model is not None:
            entry["model"] = self.model
        if self.outcome.retry_after is not None:
            entry["retry_after"] = self.outcome.retry_after
        if self.outcome.message:
            entry["message"] = self.outcome.message
        return entry

    def describe(self) -> str:
        what = str(self.outcome.status) if self.outcome.status else self.outcome.kind
        if self.outcome.status and self.outcome.kind not in {"client_error", "success"}:
            what += f" {self.outcome.kind}"
        return f"{self.endpoint}: {what} after {self.duration * 1000:.0f} ms"


@dataclass(slots=True)
class AttemptLog:
    """Every attempt of one request, in order (also what ``x-llmitm-attempts`` counts)."""

    started: float
    """When the request arrived (monotonic): the budget's origin."""
    attempts: list[Attempt] = field(default_factory=list)

    def add(
        self,
        endpoint: str,
        outcome: Outcome,
        started: float,
        ended: float,
        model: str | None = None,
    ) -> Attempt:
        attempt = Attempt(endpoint, outcome, started, max(0.0, ended - started), model)
        self.attempts.append(attempt)
        return attempt

    def __len__(self) -> int:
        return len(self.attempts)

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def tried(self) -> set[str]:
        return {a.endpoint for a in self.attempts}


@dataclass(frozen=True, slots=True)
class Step:
    """The next thing the request loop does."""

    action: Literal["try", "give_up"]
    endpoint: str | None = None
    delay: float = 0.0
    """Seconds to wait before the attempt (``try``)."""
    reason: str = ""
    """Why (``give_up``: ``not retryable`` / ``attempts`` / ``time`` / ``no endpoint``)."""


def next_step(
    log: AttemptLog,
    now: float,
    order: Sequence[str],
    cooling: Sequence[tuple[str, float]] = (),
    *,
    policy: RetryPolicy,
    rng: random.Random,
) -> Step:
    """Decide the next attempt from the log and the current choice (``strategies.choose``
    called again now, so endpoints that just failed are already cooling)."""
    last = log.last
    if last is not None:
        if last.outcome.kind == "success":
            return Step("give_up", reason="succeeded")
        if not retryable(last.outcome):
            return Step("give_up", reason="not retryable")
    if len(log) >= policy.max_attempts:
        return Step("give_up", reason="attempts")
    deadline = log.started + policy.max_total
    if now >= deadline:
        return Step("give_up", reason="time")
    tried = log.tried()
    for endpoint in order:
        if endpoint not in tried:
            return Step("try", endpoint)
    # Every healthy endpoint was tried (or none is healthy): retry the one that can be tried
    # soonest, after the backoff and whatever the upstream asked for.
    candidates = [(e, now) for e in order] + list(cooling)
    if not candidates:
        return Step("give_up", reason="no endpoint")
    endpoint, ready = min(candidates, key=lambda item: item[1])
    delay = max(0.0, ready - now)
    if tried:  # a first attempt on a cooling endpoint waits for the cooldown alone
        retries = sum(1 for a in log.attempts if a.endpoint == endpoint)
        delay = max(delay, backoff_delay(max(0, retries - 1), policy, rng))
        asked = _asked_wait(log, endpoint, now)
        delay = max(delay, asked)
    if now + delay > deadline:
        return Step("give_up", endpoint=endpoint, delay=delay, reason="time")
    return Step("try", endpoint, delay=delay)


def _asked_wait(log: AttemptLog, endpoint: str, now: float) -> float:
    """What remains of the Retry-After of this endpoint's latest attempt."""
    for attempt in reversed(log.attempts):
        if attempt.endpoint == endpoint:
            if attempt.outcome.retry_after is None:
                return 0.0
            ended = attempt.started + attempt.duration
            return max(0.0, ended + attempt.outcome.retry_after - now)
    return 0.0


# --- the error listing the attempts -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptsError:
    """What the client gets when no attempt succeeded."""

    status: int
    body: dict[str, Any]
    retry_after: float | None = None
    """Seconds for a ``Retry-After`` header (rounded up by the caller), if any."""


def attempts_error(
    log: AttemptLog, *, retry_at: float | None = None, now: float | None = None
) -> AttemptsError:
    """One OpenAI-shaped error (``{"error": {message, type, param, code, attempts}}``) that
    lists every attempt: endpoint, outcome, status, duration.

    Status: 429 when every attempt was rate limited (clients back off properly), 504 when
    every attempt timed out, 503 when nothing could be tried (all endpoints cooling), else
    502. ``retry_at`` (when the first endpoint recovers, ``Choice.retry_at``) with ``now``
    gives the ``Retry-After``.
    """
    kinds: set[OutcomeKind] = {a.outcome.kind for a in log.attempts}
    retry_after = None
    if retry_at is not None and now is not None:
        retry_after = max(0.0, retry_at - now)
    if not log.attempts:
        status, type_, code = 503, "server_error", "no_endpoint_available"
        message = "No upstream endpoint is available for this request"
        if retry_after is not None:
            message += f"; the first recovers in {retry_after:.1f} s"
    else:
        if kinds == {"rate_limited"}:
            status, type_, code = 429, "rate_limit_error", "rate_limit_exceeded"
            asked = [a.outcome.retry_after for a in log.attempts if a.outcome.retry_after]
            if retry_after is None and asked:
                retry_after = min(asked)
        elif kinds == {"timeout"}:
            status, type_, code = 504, "timeout_error", "upstream_timeout"
        else:
            status, type_, code = 502, "server_error", "upstream_failed"
        count = len(log.attempts)
        head = f"All {count} upstream attempts failed"
        if count == 1:
            head = "The upstream attempt failed"
        message = head + ": " + "; ".join(a.describe() for a in log.attempts)
    body = openai_error_body(ApiError(message=message, type=type_, code=code, status=status))
    body["error"]["attempts"] = [a.as_json() for a in log.attempts]
    return AttemptsError(status=status, body=body, retry_after=retry_after)
