"""The direct path's first-byte bound: the limit a route gets, and the answer and outcome
it ends with (the failover job's for the same ending)."""

from __future__ import annotations

from llmitm.routing.config import parse_config
from llmitm.routing.engine import Routing
from llmitm.routing.first_byte import (
    first_byte_error,
    first_byte_limit,
    first_byte_message,
    first_byte_outcome,
)

RAW = {
    "routing": {"first_byte_timeout": 7},
    "endpoints": {"a": {"kind": "compatible", "base_url": "http://127.0.0.1:1/v1"}},
    "routes": [
        {"models": ["own-*"], "endpoints": ["a"], "first_byte_timeout": 2.5},
        {"models": ["*"], "endpoints": ["a"]},
    ],
}


def test_the_limit_is_the_routes_else_the_default_as_the_relay_reads_it() -> None:
    config = parse_config(RAW, "test.toml", {})
    own, default = config.routes
    assert first_byte_limit(config, own) == 2.5
    assert first_byte_limit(config, default) == 7
    routing = Routing(config)
    for route in config.routes:
        assert first_byte_limit(config, route) == routing.first_byte_timeout(route)


def test_the_answer_is_one_timed_out_attempt_as_a_504() -> None:
    message = first_byte_message(2.5)
    error = first_byte_error("a", message, started=10.0, ended=12.5, model="m")
    assert error.status == 504
    body = error.body["error"]
    assert (body["type"], body["code"]) == ("timeout_error", "upstream_timeout")
    assert body["attempts"] == [
        {
            "endpoint": "a",
            "outcome": "timeout",
            "status": None,
            "duration_ms": 2500,
            "model": "m",
            "message": "no first byte within 2.5 s",
        }
    ]
    assert error.retry_after is None


def test_health_counts_it_as_a_timeout_before_any_byte() -> None:
    outcome = first_byte_outcome(first_byte_message(1))
    assert outcome.kind == "timeout" and outcome.failed and not outcome.after_first_byte
