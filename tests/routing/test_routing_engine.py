"""The proxy's routing state built from a configuration: which routes need the relay, the
weighted share within tolerance (seeded), affinity that yields to health and caps but not
when the owner of a previous response is required, and the status snapshot."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from llmitm.routing.config import Config, parse_config
from llmitm.routing.engine import Routing
from llmitm.routing.outcomes import Outcome, outcome_for_status

RAW = {
    "routing": {"cooldown": 2, "queue_size": 0},
    "endpoints": {
        "east": {"kind": "compatible", "base_url": "http://east/v1", "weight": 3},
        "west": {"kind": "compatible", "base_url": "http://west/v1", "weight": 1},
        "spare": {
            "kind": "compatible",
            "base_url": "http://spare/v1",
            "weight": 0,
            "max_concurrency": 2,
            "max_concurrency_per_model": {"big": 1},
        },
    },
    "routes": [
        {"models": ["w*"], "endpoints": ["east", "west", "spare"], "strategy": "weighted"},
        {"models": ["one"], "endpoints": ["east"]},
        {"models": ["retry"], "endpoints": ["east"], "attempts": 3, "timeout": 9},
        {"models": ["lb"], "endpoints": ["east", "west"], "strategy": "least-busy"},
    ],
}


def config() -> Config:
    return parse_config(RAW, "test.toml", {})


def routing(seed: int = 7) -> Routing:
    return Routing(config(), rng=random.Random(seed))


def route(r: Routing, index: int):
    return r.config.routes[index]


def test_only_routes_that_may_need_a_second_attempt_are_relayed() -> None:
    r = routing()
    assert r.relayed(route(r, 0))  # several endpoints
    assert not r.relayed(route(r, 1))  # one endpoint, no retries: mitmproxy's direct path
    assert r.relayed(route(r, 2))  # one endpoint with retries
    policy = r.retry_policy(route(r, 2))
    assert (policy.max_attempts, policy.max_total) == (3, 9.0)
    assert r.retry_policy(route(r, 0)).max_attempts == 3  # each endpoint once


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_weighted_first_choice_follows_the_weights_within_tolerance(seed: int) -> None:
    r = routing(seed)
    draws = 20_000
    firsts = Counter(r.order(route(r, 0), "w", 0.0).endpoints[0] for _ in range(draws))
    assert set(firsts) == {"east", "west"}  # weight 0: never first
    assert abs(firsts["east"] / draws - 0.75) < 0.015
    assert abs(firsts["west"] / draws - 0.25) < 0.015
    # The zero-weight endpoint is still a fallback, last.
    assert r.order(route(r, 0), "w", 0.0).endpoints[-1] == "spare"


def test_cooling_endpoints_are_skipped_and_recover() -> None:
    r = routing()
    r.record("east", outcome_for_status(429, {"retry-after": "5"}), 10.0, "w")
    order = r.order(route(r, 0), "w", 11.0)
    assert "east" not in order.endpoints
    assert order.choice.retry_at == 15.0
    assert "east" in r.order(route(r, 0), "w", 15.0).endpoints
    # Scoped to the model: another model on east is unaffected.
    assert "east" in r.order(route(r, 0), "w-other", 11.0).endpoints


def test_least_busy_reads_the_in_flight_counters() -> None:
    r = routing()
    lease = r.limiter.try_acquire("east", "lb")
    assert r.order(route(r, 3), "lb", 0.0).endpoints == ("west", "east")
    assert lease is not None and lease.release()
    assert r.order(route(r, 3), "lb", 0.0).endpoints == ("east", "west")


def test_a_conversation_stays_unless_its_endpoint_is_cooling_or_full() -> None:
    r = routing()
    r.served("spare", 0.0, fingerprint="conv")
    assert r.order(route(r, 0), "big", 1.0, fingerprint="conv").endpoints[0] == "spare"
    lease = r.limiter.try_acquire("spare", "big")  # the per-model cap is 1: now full
    assert r.order(route(r, 0), "big", 1.0, fingerprint="conv").endpoints[0] != "spare"
    assert lease is not None and lease.release()
    r.record("spare", Outcome("connect_error"), 2.0, "big")
    assert "spare" not in r.order(route(r, 0), "big", 2.5, fingerprint="conv").endpoints


def test_the_owner_of_a_previous_response_is_required_when_asked() -> None:
    r = routing()
    r.served("west", 0.0, response_id="resp_1")
    r.record("west", outcome_for_status(429, {"retry-after": "30"}), 1.0, "w")
    # Preferred only while healthy…
    order = r.order(route(r, 0), "w", 2.0, previous_response_id="resp_1")
    assert "west" not in order.endpoints and not order.required
    # …but a native Responses owner is the only one that can answer: it is the whole order.
    order = r.order(route(r, 0), "w", 2.0, previous_response_id="resp_1", owner_required=True)
    assert order.endpoints == ("west",) and order.required
    assert r.owner("resp_1", 2.0) == "west"


def test_an_owner_remembered_by_the_store_leads_the_order_after_a_restart() -> None:
    r = routing()  # a fresh process: its memory knows no response ids
    assert r.owner("resp_9", 0.0) is None
    assert r.owner("resp_9", 0.0, remembered="nowhere") is None  # not an endpoint of ours
    assert r.owner("resp_9", 0.0, remembered="spare") == "spare"
    assert r.order(route(r, 0), "w", 1.0, previous_response_id="resp_9").endpoints[0] == "spare"


def test_the_snapshot_shows_counters_caps_and_cooldowns() -> None:
    r = routing()
    lease = r.limiter.try_acquire("spare", "big")
    r.record("east", outcome_for_status(503), 10.0, "w")
    snapshot = r.snapshot(11.0)
    assert snapshot["in_flight"] == 1
    assert snapshot["endpoints"]["spare"]["in_flight"] == 1
    assert snapshot["endpoints"]["spare"]["max_concurrency"] == 2
    assert snapshot["endpoints"]["east"]["models"]["w"]["cooling_s"] == 1.0
    assert snapshot["endpoints"]["east"]["models"]["w"]["last_outcome"] == "server_error"
    assert lease is not None and lease.release()
    assert r.snapshot(11.0)["in_flight"] == 0
