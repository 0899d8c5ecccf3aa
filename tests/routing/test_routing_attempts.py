"""Retries and failover: what is retryable, immediate failover, backoff with jitter that
honours Retry-After and cooldowns, the budget (attempts and time), and the one error that
lists every attempt."""

from __future__ import annotations

import random

import pytest

from llmitm.routing.attempts import (
    AttemptLog,
    RetryPolicy,
    attempts_error,
    backoff_delay,
    next_step,
    retryable,
)
from llmitm.routing.health import Health, HealthPolicy
from llmitm.routing.outcomes import Outcome, outcome_for_status
from llmitm.routing.strategies import choose

POLICY = RetryPolicy(max_attempts=4, max_total=30.0, backoff_base=0.5, backoff_max=4.0)


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome("connect_error"), True),
        (Outcome("timeout"), True),
        (outcome_for_status(408), True),
        (outcome_for_status(429), True),
        (outcome_for_status(500), True),
        (outcome_for_status(503), True),
        (outcome_for_status(400), False),
        (outcome_for_status(401), False),
        (outcome_for_status(404), False),
        (Outcome("aborted"), False),
        (Outcome("cut", after_first_byte=True), False),
        (outcome_for_status(500, after_first_byte=True), False),
        (Outcome("success", 200), False),
    ],
)
def test_what_is_retryable(outcome: Outcome, expected: bool) -> None:
    assert retryable(outcome) is expected


def test_backoff_grows_exponentially_with_equal_jitter_and_a_cap() -> None:
    rng = random.Random(5)
    for retry, step in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        for _ in range(50):
            delay = backoff_delay(retry, POLICY, rng)
            assert step / 2 <= delay <= step


def test_backoff_sequence_is_reproducible_with_a_seed() -> None:
    def seq(seed: int) -> list[float]:
        rng = random.Random(seed)
        return [backoff_delay(i, POLICY, rng) for i in range(5)]

    assert seq(1) == seq(1) and seq(1) != seq(2)


def test_first_attempt_goes_to_the_head_of_the_order() -> None:
    log = AttemptLog(started=0.0)
    step = next_step(log, 0.0, ["a", "b"], policy=POLICY, rng=random.Random(0))
    assert (step.action, step.endpoint, step.delay) == ("try", "a", 0.0)


def test_failover_is_immediate_to_an_untried_endpoint() -> None:
    log = AttemptLog(started=0.0)
    log.add("a", outcome_for_status(502), 0.0, 0.2)
    step = next_step(log, 0.2, ["a", "b"], policy=POLICY, rng=random.Random(0))
    assert (step.action, step.endpoint, step.delay) == ("try", "b", 0.0)


def test_non_retryable_and_success_end_the_loop() -> None:
    log = AttemptLog(started=0.0)
    log.add("a", outcome_for_status(400), 0.0, 0.1)
    assert next_step(log, 0.1, ["b"], policy=POLICY, rng=random.Random()).reason == (
        "not retryable"
    )
    log = AttemptLog(started=0.0)
    log.add("a", Outcome("cut", after_first_byte=True), 0.0, 1.0)
    assert next_step(log, 1.0, ["b"], policy=POLICY, rng=random.Random()).action == "give_up"
    log = AttemptLog(started=0.0)
    log.add("a", Outcome("success", 200), 0.0, 1.0)
    assert next_step(log, 1.0, ["b"], policy=POLICY, rng=random.Random()).reason == "succeeded"


def test_the_only_endpoint_is_retried_with_backoff_until_the_attempt_budget() -> None:
    rng = random.Random(9)
    log = AttemptLog(started=0.0)
    now = 0.0
    delays = []
    while True:
        step = next_step(log, now, ["only"], policy=POLICY, rng=rng)
        if step.action == "give_up":
            break
        assert step.endpoint == "only"
        delays.append(step.delay)
        now += step.delay
        log.add("only", outcome_for_status(500), now, now + 0.1)
        now += 0.1
    assert step.reason == "attempts" and len(log) == POLICY.max_attempts
    assert delays[0] == 0.0
    for retry, delay in enumerate(delays[1:]):
        cap = min(POLICY.backoff_max, POLICY.backoff_base * 2**retry)
        assert cap / 2 <= delay <= cap


def test_retry_waits_at_least_what_the_upstream_asked() -> None:
    log = AttemptLog(started=0.0)
    log.add("only", outcome_for_status(429, {"retry-after": "6"}), 0.0, 1.0)
    step = next_step(log, 1.0, ["only"], policy=POLICY, rng=random.Random(0))
    assert step.action == "try" and step.delay == pytest.approx(6.0)


def test_retry_waits_for_the_cooldown_and_picks_the_soonest_recovery() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    log = AttemptLog(started=0.0)
    for name, wait in (("a", "8"), ("b", "3")):
        outcome = outcome_for_status(429, {"retry-after": wait})
        log.add(name, outcome, 0.0, 0.0)
        health.record(name, outcome, now=0.0)
    choice = choose("failover", ["a", "b"], health=health, now=0.0)
    assert choice.order == ()
    step = next_step(log, 0.0, choice.order, choice.cooling, policy=POLICY, rng=random.Random(0))
    assert (step.action, step.endpoint, step.delay) == ("try", "b", 3.0)


def test_a_first_attempt_on_a_cooling_route_waits_for_the_cooldown_alone() -> None:
    log = AttemptLog(started=0.0)
    step = next_step(log, 0.0, [], [("a", 2.0)], policy=POLICY, rng=random.Random(0))
    assert (step.action, step.endpoint, step.delay) == ("try", "a", 2.0)


def test_time_budget_refuses_a_wait_that_ends_past_the_deadline() -> None:
    policy = RetryPolicy(max_attempts=10, max_total=5.0)
    log = AttemptLog(started=0.0)
    log.add("only", outcome_for_status(429, {"retry-after": "10"}), 0.0, 0.5)
    step = next_step(log, 0.5, ["only"], policy=policy, rng=random.Random(0))
    assert (step.action, step.reason) == ("give_up", "time")
    assert (
        next_step(AttemptLog(started=0.0), 5.0, ["a"], policy=policy, rng=random.Random()).reason
        == "time"
    )


def test_nothing_to_try_gives_up() -> None:
    step = next_step(AttemptLog(started=0.0), 0.0, [], policy=POLICY, rng=random.Random())
    assert (step.action, step.reason) == ("give_up", "no endpoint")


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(backoff_factor=0.5)


# --- the error listing attempts -----------------------------------------------------------


def test_error_lists_every_attempt() -> None:
    log = AttemptLog(started=0.0)
    log.add("east", outcome_for_status(429, {"retry-after": "7"}), 0.0, 0.12, model="gpt-5")
    log.add("west", Outcome("connect_error", message="connection refused"), 0.12, 0.125)
    log.add("openai", Outcome("timeout"), 0.125, 30.125)
    error = attempts_error(log)
    assert error.status == 502
    body = error.body["error"]
    assert body["type"] == "server_error" and body["code"] == "upstream_failed"
    assert body["param"] is None
    assert body["message"] == (
        "All 3 upstream attempts failed: east: 429 rate_limited after 120 ms; "
        "west: connect_error after 5 ms; openai: timeout after 30000 ms"
    )
    assert body["attempts"] == [
        {
            "endpoint": "east",
            "outcome": "rate_limited",
            "status": 429,
            "duration_ms": 120,
            "model": "gpt-5",
            "retry_after": 7.0,
        },
        {
            "endpoint": "west",
            "outcome": "connect_error",
            "status": None,
            "duration_ms": 5,
            "message": "connection refused",
        },
        {"endpoint": "openai", "outcome": "timeout", "status": None, "duration_ms": 30000},
    ]


def test_all_rate_limited_is_a_429_with_retry_after() -> None:
    log = AttemptLog(started=0.0)
    log.add("a", outcome_for_status(429, {"retry-after": "9"}), 0.0, 0.1)
    log.add("b", outcome_for_status(429, {"retry-after": "4"}), 0.1, 0.2)
    error = attempts_error(log)
    assert error.status == 429 and error.retry_after == 4.0
    assert error.body["error"]["code"] == "rate_limit_exceeded"
    assert attempts_error(log, retry_at=12.0, now=10.0).retry_after == 2.0


def test_all_timeouts_is_a_504_and_a_single_attempt_reads_naturally() -> None:
    log = AttemptLog(started=0.0)
    log.add("a", Outcome("timeout"), 0.0, 2.0)
    error = attempts_error(log)
    assert error.status == 504
    assert error.body["error"]["message"] == "The upstream attempt failed: a: timeout after 2000 ms"


def test_nothing_tried_is_a_503_naming_the_recovery() -> None:
    error = attempts_error(AttemptLog(started=0.0), retry_at=13.0, now=10.0)
    assert error.status == 503 and error.retry_after == 3.0
    assert error.body["error"]["attempts"] == []
    assert "3.0 s" in error.body["error"]["message"]
