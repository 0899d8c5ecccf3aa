"""llmitm's metric definitions (observe.metrics), read back with prometheus_client's own
parser: the GenAI semantic-convention names and labels, what one call adds, the gauges read
at scrape time, and that two instances (mitmproxy may load an addon twice) do not collide."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmitm.observe import metrics as metrics_module
from llmitm.observe.metrics import (
    CallFacts,
    EndpointState,
    Metrics,
    ProxyState,
    proxy_state,
)


def scrape(metrics: Metrics, state: ProxyState | None = None) -> dict[str, Any]:
    text = metrics.exposition(state).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family: Any, name: str, **labels: str) -> list[float]:
    return [
        s.value
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


CALL = CallFacts(
    api="responses",
    provider="openai",
    endpoint="local",
    request_model="gpt-4o",
    response_model="qwen3:8b",
    route="main",
    duration=0.3,
    first_chunk=0.05,
    input_tokens=12,
    output_tokens=30,
)


def _replace(**changes: Any) -> CallFacts:
    return replace(CALL, **changes)


def test_a_call_adds_token_usage_duration_and_first_chunk_under_semconv_names() -> None:
    metrics = Metrics()
    metrics.observe(CALL)
    metrics.observe(_replace(input_tokens=8))
    families = scrape(metrics)
    usage = families["gen_ai_client_token_usage"]
    assert usage.type == "histogram"
    labels = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "openai",
        "gen_ai_request_model": "gpt-4o",
        "gen_ai_response_model": "qwen3:8b",
        "openai_api_type": "responses",
        "llmitm_endpoint": "local",
    }
    assert samples(usage, "gen_ai_client_token_usage_sum", **labels, gen_ai_token_type="input") == [
        20.0
    ]
    assert samples(
        usage, "gen_ai_client_token_usage_count", **labels, gen_ai_token_type="output"
    ) == [2.0]
    duration = families["gen_ai_client_operation_duration_seconds"]
    assert samples(duration, "gen_ai_client_operation_duration_seconds_count", error_type="") == [
        2.0
    ]
    first = families["gen_ai_client_operation_time_to_first_chunk_seconds"]
    assert samples(first, "gen_ai_client_operation_time_to_first_chunk_seconds_sum") == [0.1]
    calls = families["llmitm_calls"]
    assert samples(calls, "llmitm_calls_total", llmitm_route="main") == [2.0]


def test_a_failed_unstreamed_call_without_usage_adds_no_tokens_nor_first_chunk() -> None:
    metrics = Metrics()
    metrics.observe(
        _replace(error_type="502", first_chunk=None, input_tokens=None, output_tokens=None)
    )
    families = scrape(metrics)
    assert (
        "gen_ai_client_token_usage" not in families
        or not families["gen_ai_client_token_usage"].samples
    )
    first = families.get("gen_ai_client_operation_time_to_first_chunk_seconds")
    assert first is None or not first.samples
    duration = families["gen_ai_client_operation_duration_seconds"]
    assert samples(duration, "gen_ai_client_operation_duration_seconds_count", error_type="502")


def test_attempts_beyond_the_first_count_as_failovers() -> None:
    metrics = Metrics()
    metrics.observe(_replace(attempts=3))
    metrics.observe(_replace())
    failovers = scrape(metrics)["llmitm_failovers"]
    assert samples(failovers, "llmitm_failovers_total", llmitm_route="main") == [2.0]


def test_model_names_beyond_model_labels_are_labelled_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_module, "MODEL_LABELS", 2)
    metrics = Metrics()
    for n in range(50):  # a client that sends a new model name with every call
        metrics.observe(_replace(request_model=f"m{n}", response_model=f"r{n % 3}"))
    metrics.observe(_replace(request_model="m1", response_model="r0"))
    families = scrape(metrics)
    calls = families["llmitm_calls"]
    seen = {s.labels["gen_ai_request_model"] for s in calls.samples}
    assert seen == {"m0", "m1", "other"}
    assert samples(calls, "llmitm_calls_total", gen_ai_request_model="other") == [48.0]
    assert samples(calls, "llmitm_calls_total", gen_ai_request_model="m1") == [2.0]
    usage = families["gen_ai_client_token_usage"]
    assert {s.labels["gen_ai_response_model"] for s in usage.samples} == {"r0", "r1", "other"}
    assert {s.labels["gen_ai_request_model"] for s in usage.samples} == seen


def test_gauges_show_the_state_a_scrape_was_handed() -> None:
    state = ProxyState(
        endpoints={
            "a": EndpointState(in_flight=2, max_concurrency=4, cooling_s=0.0, failures=0),
            "b": EndpointState(in_flight=0, max_concurrency=None, cooling_s=3.5, failures=2),
        },
        in_flight=2,
        waiting=1,
        replay_hits=5,
        replay_misses=1,
    )
    metrics = Metrics()
    assert "llmitm_endpoint_healthy" not in scrape(metrics)  # no state, no gauges
    families = scrape(metrics, state)
    healthy = families["llmitm_endpoint_healthy"]
    assert samples(healthy, "llmitm_endpoint_healthy", llmitm_endpoint="a") == [1.0]
    assert samples(healthy, "llmitm_endpoint_healthy", llmitm_endpoint="b") == [0.0]
    cooling = families["llmitm_endpoint_cooldown_seconds"]
    assert samples(cooling, "llmitm_endpoint_cooldown_seconds", llmitm_endpoint="b") == [3.5]
    caps = families["llmitm_endpoint_max_concurrency"]
    assert [s.labels["llmitm_endpoint"] for s in caps.samples] == ["a"]
    assert samples(families["llmitm_queue_waiting"], "llmitm_queue_waiting") == [1.0]
    assert samples(families["llmitm_replay_hits"], "llmitm_replay_hits_total") == [5.0]
    assert samples(families["llmitm_replay_misses"], "llmitm_replay_misses_total") == [1.0]
    assert "llmitm_endpoint_healthy" not in scrape(metrics)  # the state was that scrape's


def test_proxy_state_reads_routings_snapshot() -> None:
    snapshot = {
        "endpoints": {
            "a": {"in_flight": 1, "max_concurrency": None, "cooling_s": 0.25, "failures": 1,
                  "last_outcome": "429", "models": {}},
        },
        "in_flight": 1,
        "waiting": 3,
    }  # fmt: skip
    state = proxy_state(snapshot, hits=2, misses=0)
    assert state.endpoints["a"] == EndpointState(1, None, 0.25, 1)
    assert (state.in_flight, state.waiting, state.replay_hits) == (1, 3, 2)


def test_two_instances_keep_their_own_registries() -> None:
    first, second = Metrics(), Metrics()
    first.observe(CALL)
    assert samples(scrape(first)["llmitm_calls"], "llmitm_calls_total") == [1.0]
    assert not scrape(second).get("llmitm_calls") or not samples(
        scrape(second)["llmitm_calls"], "llmitm_calls_total"
    )
