"""Endpoint order per strategy: failover keeps the configured order, weighted follows the
weights (chi-square over many seeded draws) and keeps the rest as fallbacks, least-busy picks
the fewest in flight under simulated concurrent load; unhealthy endpoints are skipped."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from llmitm.routing.health import Health, HealthPolicy
from llmitm.routing.limits import Lease, Limiter, acquire_first
from llmitm.routing.outcomes import Outcome, outcome_for_status
from llmitm.routing.strategies import choose, least_busy_order, weighted_order

ROUTE = ("east", "west", "openai")


def test_failover_keeps_the_configured_order() -> None:
    choice = choose("failover", ROUTE, health=Health(), now=0.0)
    assert choice.order == ROUTE and choice.cooling == () and choice.retry_at is None


def test_unhealthy_endpoints_are_skipped_and_listed_by_recovery() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    health.record("east", outcome_for_status(429, {"retry-after": "20"}), now=0.0)
    health.record("openai", Outcome("connect_error"), now=0.0)
    choice = choose("failover", ROUTE, health=health, now=1.0)
    assert choice.order == ("west",)
    assert choice.cooling == (("openai", 5.0), ("east", 20.0))


def test_all_unhealthy_gives_an_empty_order_and_a_retry_time() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    for name in ROUTE:
        health.record(name, Outcome("timeout"), now=0.0)
    for strategy in ("failover", "weighted", "least-busy"):
        choice = choose(strategy, ROUTE, health=health, now=1.0, rng=random.Random(1))  # type: ignore[arg-type]
        assert choice.order == () and choice.retry_at == 5.0
    assert choose("failover", ROUTE, health=health, now=5.0).order == ROUTE


def test_health_is_read_per_model() -> None:
    health = Health()
    health.record("east", outcome_for_status(429, {"retry-after": "9"}), now=0.0, model="gpt-5")
    assert choose("failover", ROUTE, health=health, now=1.0, model="gpt-5").order[0] == "west"
    assert choose("failover", ROUTE, health=health, now=1.0, model="o3").order[0] == "east"


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="least-busy"):
        choose("random", ROUTE, health=Health(), now=0.0)  # type: ignore[arg-type]


# --- weighted -----------------------------------------------------------------------------


def test_weighted_first_choice_follows_the_weights() -> None:
    weights = {"east": 5, "west": 3, "openai": 2}
    rng = random.Random(20260301)
    draws = 20_000
    firsts = Counter(weighted_order(ROUTE, weights, rng)[0] for _ in range(draws))
    total = sum(weights.values())
    chi_square = sum(
        (firsts[name] - draws * w / total) ** 2 / (draws * w / total) for name, w in weights.items()
    )
    assert chi_square < 13.82  # df = 2, p = 0.001


def test_weighted_draws_without_replacement_so_the_rest_are_fallbacks() -> None:
    weights = {"east": 5, "west": 3, "openai": 2}
    rng = random.Random(7)
    seconds: Counter[str] = Counter()
    for _ in range(5_000):
        order = weighted_order(ROUTE, weights, rng)
        assert sorted(order) == sorted(ROUTE)
        if order[0] == "east":
            seconds[order[1]] += 1
    # After east, west should come second 3 times in 5.
    share = seconds["west"] / (seconds["west"] + seconds["openai"])
    assert abs(share - 0.6) < 0.03


def test_zero_weight_is_only_a_fallback_and_missing_weight_is_one() -> None:
    rng = random.Random(3)
    for _ in range(200):
        order = weighted_order(ROUTE, {"east": 0, "west": 1}, rng)
        assert order[-1] == "east"
    with pytest.raises(ValueError):
        weighted_order(ROUTE, {"east": -1}, rng)


def test_weighted_is_reproducible_with_a_seed() -> None:
    def run(seed: int) -> list[tuple[str, ...]]:
        rng = random.Random(seed)
        return [
            choose("weighted", ROUTE, health=Health(), now=0.0, rng=rng).order for _ in range(20)
        ]

    assert run(42) == run(42)
    assert run(42) != run(43)


# --- least-busy ---------------------------------------------------------------------------


def test_least_busy_ties_keep_the_configured_order() -> None:
    load = {"east": 2, "west": 1, "openai": 1}
    assert least_busy_order(ROUTE, load.__getitem__) == ["west", "openai", "east"]
    assert least_busy_order(ROUTE, lambda _e: 0) == list(ROUTE)


def test_least_busy_under_simulated_concurrent_load() -> None:
    limiter = Limiter({"east": 4, "west": 4, "openai": 4})
    rng = random.Random(11)
    health = Health()
    open_leases: list[Lease] = []
    served: Counter[str] = Counter()
    for _ in range(3_000):
        if open_leases and rng.random() < 0.5:
            open_leases.pop(rng.randrange(len(open_leases))).release()
            continue
        choice = choose("least-busy", ROUTE, health=health, now=0.0, in_flight=limiter.in_flight)
        lease = acquire_first(limiter, choice.order)
        if lease is None:
            assert all(limiter.in_flight(e) == 4 for e in ROUTE)
            continue
        # The chosen endpoint had the fewest requests in flight when it was chosen.
        assert limiter.in_flight(lease.endpoint) - 1 == min(
            limiter.in_flight(e) - (e == lease.endpoint) for e in ROUTE
        )
        served[lease.endpoint] += 1
        open_leases.append(lease)
    for lease in open_leases:
        lease.release()
    assert limiter.total_in_flight() == 0
    # Everyone took load; ties go to the configured order, so earlier endpoints take more
    # when the route is idle (least-busy is not round-robin).
    assert served["east"] >= served["west"] >= served["openai"] > 0
