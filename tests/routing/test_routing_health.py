"""Endpoint health: Retry-After in all its forms, cooldowns on a fake clock, the two scopes
(endpoint vs endpoint-model), thresholds and the half-open probe after a cooldown."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from llmitm.routing import health as health_module
from llmitm.routing.health import Health, HealthPolicy
from llmitm.routing.outcomes import Outcome, outcome_for_status, parse_retry_after

WALL = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()


# --- Retry-After --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": " 1.5 "}, 1.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"Retry-After": "30", "retry-after-ms": "1200"}, 1.2),  # the precise one wins
        ({"retry-after-ms": "junk", "retry-after": "3"}, 3.0),
        ({"Retry-After": "Sun, 01 Mar 2026 12:00:42 GMT"}, 42.0),
        ({"Retry-After": "Sun, 01 Mar 2026 11:59:00 GMT"}, 0.0),  # past: go now
        ({"Retry-After": "Sun, 01 Mar 2026 12:00:10 -0000"}, 10.0),
        ({"Retry-After": "-5"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, wall_now=WALL) == expected


def test_retry_after_reads_pairs_and_needs_a_wall_clock_for_dates() -> None:
    assert parse_retry_after([("RETRY-AFTER", "4")]) == 4.0
    date = format_datetime(datetime.fromtimestamp(WALL + 9, UTC), usegmt=True)
    assert parse_retry_after({"retry-after": date}) is None
    assert parse_retry_after({"retry-after": date}, wall_now=WALL) == 9.0


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (200, "success"),
        (400, "client_error"),
        (404, "client_error"),
        (408, "timeout"),
        (429, "rate_limited"),
        (500, "server_error"),
        (503, "server_error"),
    ],
)
def test_status_classification(status: int, kind: str) -> None:
    assert outcome_for_status(status).kind == kind


def test_retry_after_is_read_only_where_it_means_something() -> None:
    assert outcome_for_status(429, {"retry-after": "2"}).retry_after == 2.0
    assert outcome_for_status(503, {"retry-after": "2"}).retry_after == 2.0
    assert outcome_for_status(400, {"retry-after": "2"}).retry_after is None


# --- cooldowns ----------------------------------------------------------------------------


def test_failure_cools_down_for_the_configured_time_then_recovers() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    assert health.is_available("a", 0.0)
    health.record("a", Outcome("server_error", 500), now=10.0)
    assert not health.is_available("a", 10.0)
    assert not health.is_available("a", 14.999)
    assert health.available_at("a") == 15.0
    assert health.is_available("a", 15.0)
    assert health.is_available("b", 10.0)  # others unaffected


def test_429_cools_for_exactly_what_the_upstream_asked_capped() -> None:
    health = Health(HealthPolicy(cooldown=5.0, max_retry_after=60.0))
    health.record("a", outcome_for_status(429, {"retry-after-ms": "1500"}), now=0.0)
    assert health.available_at("a") == 1.5
    health.record("b", outcome_for_status(429, {"retry-after": "3600"}), now=0.0)
    assert health.available_at("b") == 60.0
    health.record("c", outcome_for_status(429), now=0.0)  # no hint: the default
    assert health.available_at("c") == 5.0


def test_429_without_hint_uses_rate_limit_cooldown_and_ignores_threshold() -> None:
    health = Health(HealthPolicy(cooldown=5.0, failure_threshold=3, rate_limit_cooldown=2.0))
    health.record("a", outcome_for_status(429), now=0.0)
    assert health.available_at("a") == 2.0


def test_threshold_counts_failures_in_a_row_and_success_resets() -> None:
    health = Health(HealthPolicy(cooldown=5.0, failure_threshold=2))
    health.record("a", Outcome("timeout"), now=0.0)
    assert health.is_available("a", 0.0)
    health.record("a", Outcome("success", 200), now=1.0)
    health.record("a", Outcome("timeout"), now=2.0)
    assert health.is_available("a", 2.0)
    health.record("a", Outcome("timeout"), now=3.0)
    assert not health.is_available("a", 3.0)
    assert health.available_at("a") == 8.0


def test_after_cooldown_one_failure_recools_and_one_success_clears() -> None:
    health = Health(HealthPolicy(cooldown=5.0, failure_threshold=2))
    health.record("a", Outcome("server_error", 502), now=0.0)
    health.record("a", Outcome("server_error", 502), now=0.0)
    assert health.is_available("a", 5.0)
    health.record("a", Outcome("server_error", 502), now=5.0)  # the probe fails
    assert not health.is_available("a", 5.0)
    health.record("a", Outcome("success", 200), now=11.0)
    health.record("a", Outcome("server_error", 502), now=12.0)  # below threshold again
    assert health.is_available("a", 12.0)


def test_503_with_retry_after_is_honoured_below_the_threshold() -> None:
    health = Health(HealthPolicy(cooldown=1.0, failure_threshold=3))
    health.record("a", outcome_for_status(503, {"retry-after": "20"}), now=0.0)
    assert health.available_at("a") == 20.0


def test_cooldowns_never_shorten() -> None:
    health = Health(HealthPolicy(cooldown=1.0))
    health.record("a", outcome_for_status(429, {"retry-after": "30"}), now=0.0)
    health.record("a", Outcome("server_error", 500), now=1.0)
    health.record("a", Outcome("success", 200), now=2.0)  # an attempt started earlier
    assert health.available_at("a") == 30.0


def test_client_errors_and_aborts_say_nothing_about_the_endpoint() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    health.record("a", outcome_for_status(400), now=0.0)
    health.record("a", Outcome("aborted"), now=0.0)
    assert health.is_available("a", 0.0)
    assert health.state("a").last is None


def test_model_scoped_failures_leave_other_models_usable() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    health.record("az", outcome_for_status(429, {"retry-after": "10"}), now=0.0, model="gpt-5")
    assert not health.is_available("az", 1.0, model="gpt-5")
    assert health.is_available("az", 1.0, model="gpt-4.1")
    assert health.is_available("az", 1.0)


def test_connect_errors_cool_the_whole_endpoint() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    health.record("az", Outcome("connect_error"), now=0.0, model="gpt-5")
    assert not health.is_available("az", 1.0)
    assert not health.is_available("az", 1.0, model="gpt-4.1")
    assert health.available_at("az", "gpt-4.1") == 5.0


def test_the_models_remembered_are_bounded_and_the_oldest_outcome_goes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health_module, "MODEL_KEYS", 3)
    health = Health(HealthPolicy(cooldown=5.0))
    health.record("az", outcome_for_status(503), now=0.0)  # the endpoint's own: never forgotten
    health.record("az", outcome_for_status(429, {"retry-after": "60"}), now=0.0, model="m1")
    health.record("az", outcome_for_status(429, {"retry-after": "60"}), now=0.0, model="m2")
    health.record("az", outcome_for_status(200), now=1.0, model="m3")
    health.record("az", outcome_for_status(429, {"retry-after": "60"}), now=2.0, model="m1")
    health.record("bz", outcome_for_status(200), now=3.0, model="m4")  # m2's is the oldest
    assert health.models("az") == ["m1", "m3"] and health.models("bz") == ["m4"]
    assert health.is_available("az", 10.0, model="m2")  # forgotten: as one never seen
    assert not health.is_available("az", 10.0, model="m1")
    assert health.state("az").last == "server_error"
    for n in range(100):
        health.cool("cz", f"spray-{n}", until=99.0)
    assert len(health.models("cz")) == 3 and not health.models("az")
    assert not health.is_available("az", 1.0)


def test_earliest_recovery() -> None:
    health = Health(HealthPolicy(cooldown=5.0))
    health.record("a", outcome_for_status(429, {"retry-after": "9"}), now=0.0)
    health.record("b", outcome_for_status(429, {"retry-after": "3"}), now=0.0)
    assert health.earliest(["a", "b"]) == ("b", 3.0)
    assert health.earliest([]) is None


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        HealthPolicy(failure_threshold=0)
    with pytest.raises(ValueError):
        HealthPolicy(cooldown=-1)
