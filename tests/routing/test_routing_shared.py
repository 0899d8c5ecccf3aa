"""What the routing core offers a fleet's shell, on a fake clock: a cooldown this proxy starts
is told to the observer (once per start or growth, never for one learned from another proxy),
a cooldown and a pin from another proxy are adopted, a served turn says whether it was new,
a lease calls back once on release, and the limiter says which keys have a cap."""

from __future__ import annotations

from llmitm.routing.config import parse_config
from llmitm.routing.engine import Routing
from llmitm.routing.limits import Limiter
from llmitm.routing.outcomes import Outcome

RAW = {
    "routing": {"cooldown": 2},
    "endpoints": {
        "a": {"kind": "compatible", "base_url": "http://a/v1", "max_concurrency": 2},
        "b": {"kind": "compatible", "base_url": "http://b/v1"},
    },
    "routes": [{"models": ["m*"], "endpoints": ["a", "b"]}],
}


def routing_with_observer() -> tuple[Routing, list[tuple[str, str | None, float, str]]]:
    routing = Routing(parse_config(RAW, "test.toml", {}))
    heard: list[tuple[str, str | None, float, str]] = []

    class Observer:
        def cooled(self, endpoint: str, model: str | None, seconds: float, reason: str) -> None:
            heard.append((endpoint, model, seconds, reason))

    routing.observer = Observer()
    return routing, heard


def test_a_cooldown_this_proxy_starts_is_told_once_per_growth() -> None:
    routing, heard = routing_with_observer()
    routing.record("a", Outcome("rate_limited", 429, retry_after=30), 100.0, "m1")
    assert heard == [("a", "m1", 30.0, "rate_limited")]
    routing.record("a", Outcome("rate_limited", 429, retry_after=5), 101.0, "m1")
    assert len(heard) == 1  # shorter than the running one: nothing new to tell
    routing.record("b", Outcome("connect_error"), 102.0, "m1")
    assert heard[-1] == ("b", None, 2.0, "connect_error")  # endpoint-wide
    routing.record("b", Outcome("success", 200), 103.0, "m1")
    assert len(heard) == 2


def test_a_cooldown_from_another_proxy_is_adopted_and_not_told_back() -> None:
    routing, heard = routing_with_observer()
    routing.adopt_cooldown("a", "m1", 20.0, 50.0)
    assert not routing.health.is_available("a", 69.0, "m1")
    assert routing.health.is_available("a", 70.0, "m1")
    assert routing.health.is_available("a", 60.0, "m2")
    routing.adopt_cooldown("a", "m1", 5.0, 50.0)  # never shortens
    assert not routing.health.is_available("a", 69.0, "m1")
    routing.adopt_cooldown("elsewhere", None, 20.0, 50.0)  # not in this configuration
    assert heard == []
    assert routing.health.state("a", "m1").failures == 0


def test_a_served_turn_says_whether_it_was_new() -> None:
    routing = Routing(parse_config(RAW, "test.toml", {}))
    assert routing.served("a", 0.0, fingerprint="conv")
    assert not routing.served("a", 1.0, fingerprint="conv")  # a refresh
    assert routing.served("b", 2.0, fingerprint="conv")  # it moved
    assert routing.served("b", 3.0, response_id="resp_1", fingerprint="conv")


def test_what_this_proxy_knows_and_a_pin_it_adopts() -> None:
    routing = Routing(parse_config(RAW, "test.toml", {}))
    assert routing.knows(None, None, 0.0)
    assert not routing.knows("resp_1", "conv", 0.0)
    routing.adopt_pin("b", 0.0, response_id="resp_1")
    assert routing.knows("resp_1", "conv", 1.0)
    assert routing.owner("resp_1", 1.0) == "b"
    assert not routing.knows(None, "conv", 1.0)
    routing.adopt_pin("a", 1.0, fingerprint="conv")
    assert routing.knows(None, "conv", 2.0)
    routing.adopt_pin("elsewhere", 1.0, fingerprint="other")
    assert not routing.knows(None, "other", 2.0)


def test_a_lease_calls_back_once_and_the_limiter_names_capped_keys() -> None:
    limiter = Limiter({"a": 2, "b": None}, {("b", "big"): 1})
    assert limiter.capped("a") and limiter.capped("a", "m")
    assert not limiter.capped("b", "m") and limiter.capped("b", "big")
    lease = limiter.try_acquire("a", "m")
    assert lease is not None
    calls: list[str] = []
    lease.then(lambda: calls.append("freed"))
    lease.release()
    lease.release()
    assert calls == ["freed"] and limiter.in_flight("a") == 0
