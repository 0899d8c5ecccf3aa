"""The five routing modules composed the way the proxy will drive them, on a fake clock and
fake upstreams: 429 → next endpoint and cooldown; the only endpoint retried after backoff;
everything down → one error listing the attempts; leases back to zero on every path."""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import pairwise

from llmitm.routing.affinity import Affinity, prefer
from llmitm.routing.attempts import (
    AttemptLog,
    AttemptsError,
    RetryPolicy,
    attempts_error,
    next_step,
)
from llmitm.routing.health import Health, HealthPolicy
from llmitm.routing.limits import Limiter
from llmitm.routing.outcomes import Outcome, outcome_for_status
from llmitm.routing.strategies import StrategyName, choose

Upstream = Callable[[str, float], tuple[Outcome, float]]  # (endpoint, now) -> outcome, seconds


class Clock:
    def __init__(self) -> None:
        self.now = 0.0


def serve(
    route: tuple[str, ...],
    upstream: Upstream,
    *,
    clock: Clock,
    health: Health,
    limiter: Limiter,
    affinity: Affinity,
    fp: str | None = None,
    strategy: StrategyName = "failover",
    policy: RetryPolicy | None = None,
) -> tuple[str, AttemptLog] | AttemptsError:
    """One request, as the proxy's async layer would run it (sleeps advance the fake clock)."""
    policy = policy or RetryPolicy(max_attempts=4, max_total=20.0)
    rng = random.Random(0)
    log = AttemptLog(started=clock.now)
    while True:
        choice = choose(
            strategy, route, health=health, now=clock.now, in_flight=limiter.in_flight, rng=rng
        )
        order = prefer(
            choice.order, affinity.endpoint_for(clock.now, fingerprint=fp), limiter.has_room
        )
        step = next_step(log, clock.now, order, choice.cooling, policy=policy, rng=rng)
        if step.action == "give_up":
            return attempts_error(log, retry_at=choice.retry_at, now=clock.now)
        clock.now += step.delay  # await asyncio.sleep(step.delay)
        lease = limiter.try_acquire(step.endpoint)  # type: ignore[arg-type]
        assert lease is not None
        try:
            started = clock.now
            outcome, took = upstream(step.endpoint, clock.now)  # type: ignore[arg-type]
            clock.now += took
        finally:
            lease.release()
        log.add(step.endpoint, outcome, started, clock.now)  # type: ignore[arg-type]
        health.record(step.endpoint, outcome, clock.now)  # type: ignore[arg-type]
        if outcome.kind == "success":
            affinity.served(step.endpoint, clock.now, fingerprint=fp)  # type: ignore[arg-type]
            return step.endpoint, log  # type: ignore[return-value]


def world() -> dict:
    return {
        "clock": Clock(),
        "health": Health(HealthPolicy(cooldown=5.0)),
        "limiter": Limiter({"east": 2, "west": 2}),
        "affinity": Affinity(),
    }


def test_429_fails_over_and_the_endpoint_cools_for_what_it_asked() -> None:
    w = world()

    def upstream(endpoint: str, now: float) -> tuple[Outcome, float]:
        if endpoint == "east" and now < 10:
            return outcome_for_status(429, {"retry-after": "10"}), 0.1
        return Outcome("success", 200), 1.0

    result = serve(("east", "west"), upstream, **w)
    assert not isinstance(result, AttemptsError)
    endpoint, log = result
    assert endpoint == "west" and [a.endpoint for a in log.attempts] == ["east", "west"]
    # The next request goes straight to west: east is cooling for the 10 s it asked for.
    endpoint, log = serve(("east", "west"), upstream, **w)  # type: ignore[misc]
    assert [a.endpoint for a in log.attempts] == ["west"]
    w["clock"].now = 10.2
    endpoint, log = serve(("east", "west"), upstream, **w)  # type: ignore[misc]
    assert endpoint == "east"
    assert w["limiter"].total_in_flight() == 0


def test_the_only_endpoint_is_retried_after_a_backoff() -> None:
    w = world()
    failures = iter([outcome_for_status(500), outcome_for_status(503)])

    def upstream(endpoint: str, now: float) -> tuple[Outcome, float]:
        return next(failures, Outcome("success", 200)), 0.1

    endpoint, log = serve(("east",), upstream, **w)  # type: ignore[misc]
    assert endpoint == "east" and len(log) == 3
    gaps = [b.started - (a.started + a.duration) for a, b in pairwise(log.attempts)]
    assert all(gap >= 5.0 for gap in gaps)  # the cooldown outlasts the backoff here


def test_everything_down_gives_one_error_listing_the_attempts() -> None:
    w = world()

    def upstream(endpoint: str, now: float) -> tuple[Outcome, float]:
        if endpoint == "east":
            return Outcome("connect_error", message="connection refused"), 0.01
        return Outcome("timeout"), 3.0

    error = serve(
        ("east", "west"), upstream, policy=RetryPolicy(max_attempts=3, max_total=6.0), **w
    )
    assert isinstance(error, AttemptsError) and error.status == 502
    attempts = error.body["error"]["attempts"]
    assert [(a["endpoint"], a["outcome"]) for a in attempts] == [
        ("east", "connect_error"),
        ("west", "timeout"),
        ("east", "connect_error"),  # east's cooldown ended within the 6 s budget: retried
    ]
    assert w["limiter"].total_in_flight() == 0


def test_a_conversation_follows_its_endpoint() -> None:
    w = world()

    def upstream(endpoint: str, now: float) -> tuple[Outcome, float]:
        return Outcome("success", 200), 0.5

    w["affinity"].served("west", 0.0, fingerprint="conv")
    for _ in range(3):
        endpoint, _log = serve(("east", "west"), upstream, fp="conv", **w)  # type: ignore[misc]
        assert endpoint == "west"
