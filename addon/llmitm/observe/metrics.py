"""llmitm's Prometheus metrics: their names, labels and buckets, and what one call adds.

Named after OpenTelemetry's GenAI semantic conventions where one exists, in Prometheus's
spelling (dots become underscores, the unit a suffix):

- ``gen_ai_client_token_usage`` (histogram, tokens; ``gen_ai_token_type`` input/output),
- ``gen_ai_client_operation_duration_seconds`` (histogram; ``error_type`` when it failed),
- ``gen_ai_client_operation_time_to_first_chunk_seconds`` (histogram, streamed calls only),

each labelled ``gen_ai_operation_name``, ``gen_ai_provider_name``, ``gen_ai_request_model``,
``gen_ai_response_model``, ``openai_api_type`` (chat|responses: the client's API) and
``llmitm_endpoint`` (the endpoint that answered; ``replay`` for a recording, ``cache`` for
the response cache, ``llmitm`` for
an answer llmitm gave itself, ``passthrough`` for an unrouted call). llmitm's own:
``llmitm_calls_total``, ``llmitm_failovers_total`` and, read when scraped
(:class:`StateCollector`), endpoint health, cooldowns, concurrency in use, the queue,
replay and response-cache hits and misses, and the cache's entries.

Model names are the clients' to choose (a route may match ``gpt-*``), and each label set a
metric has is kept for the process's life: the first :data:`MODEL_LABELS` request models and
as many response models are labelled by name, any later one as ``other``, so a client that
sends a new name with every call cannot grow the proxy or the scrape without end.

Every registry is the instance's own (mitmproxy may load an addon twice; the global registry
would refuse the second set of names). No I/O: :meth:`Metrics.exposition` returns the text.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

# The semantic conventions' advised bucket boundaries.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
MODEL_LABELS = 100
"""Distinct request (and response) model names labelled by name; later ones are ``other``."""
OTHER_MODEL = "other"

PROVIDERS = {"openai": "openai", "azure": "azure.ai.openai", "compatible": "compatible"}
"""``gen_ai.provider.name`` by endpoint kind (a compatible server has no well-known name)."""

_CALL_LABELS = (
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "gen_ai_request_model",
    "gen_ai_response_model",
    "openai_api_type",
    "llmitm_endpoint",
)


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What one finished call was, as llmitm knows it at the flow's end."""

    api: str
    """The client's API: ``chat`` or ``responses``."""
    provider: str
    endpoint: str
    request_model: str
    response_model: str
    route: str = ""
    duration: float | None = None
    first_chunk: float | None = None
    """Seconds from the request to the stream's first chunk (``None``: not streamed)."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    error_type: str = ""
    """Empty when it succeeded; else the status code, ``cut`` or ``aborted``."""
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class EndpointState:
    in_flight: int
    max_concurrency: int | None
    cooling_s: float
    failures: int


@dataclass(frozen=True, slots=True)
class ProxyState:
    """What the scrape reads from routing and the recorder at that moment."""

    endpoints: Mapping[str, EndpointState] = field(default_factory=dict)
    in_flight: int = 0
    waiting: int = 0
    replay_hits: int = 0
    replay_misses: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_entries: int = 0


class StateCollector:
    """Gauges and counters of the :class:`ProxyState` a scrape was handed (nothing to keep
    in step with routing between scrapes)."""

    def __init__(self) -> None:
        self.state: ProxyState | None = None

    def describe(self) -> list[Metric]:
        return []  # the families depend on the configuration; described when collected

    def collect(self) -> Iterator[Metric]:
        state = self.state
        if state is None:
            return
        endpoint = ["llmitm_endpoint"]
        healthy = GaugeMetricFamily(
            "llmitm_endpoint_healthy", "1 when the endpoint takes calls, 0 while it cools down",
            labels=endpoint,
        )  # fmt: skip
        cooling = GaugeMetricFamily(
            "llmitm_endpoint_cooldown_seconds", "Seconds left of the endpoint's cooldown",
            labels=endpoint,
        )  # fmt: skip
        failures = GaugeMetricFamily(
            "llmitm_endpoint_consecutive_failures", "Failures in a row", labels=endpoint
        )
        in_flight = GaugeMetricFamily(
            "llmitm_endpoint_in_flight", "Calls the endpoint serves now (concurrency in use)",
            labels=endpoint,
        )  # fmt: skip
        cap = GaugeMetricFamily(
            "llmitm_endpoint_max_concurrency", "The endpoint's concurrency cap", labels=endpoint
        )
        for name, facts in state.endpoints.items():
            healthy.add_metric([name], 0.0 if facts.cooling_s > 0 else 1.0)
            cooling.add_metric([name], facts.cooling_s)
            failures.add_metric([name], facts.failures)
            in_flight.add_metric([name], facts.in_flight)
            if facts.max_concurrency is not None:
                cap.add_metric([name], facts.max_concurrency)
        yield from (healthy, cooling, failures, in_flight, cap)
        yield GaugeMetricFamily("llmitm_in_flight", "Routed calls in flight", value=state.in_flight)
        yield GaugeMetricFamily(
            "llmitm_queue_waiting", "Calls waiting for a concurrency slot", value=state.waiting
        )
        yield CounterMetricFamily(
            "llmitm_replay_hits", "Calls answered from a recording", value=state.replay_hits
        )
        yield CounterMetricFamily(
            "llmitm_replay_misses", "Calls no recording answered", value=state.replay_misses
        )
        yield CounterMetricFamily(
            "llmitm_cache_hits", "Calls the response cache answered", value=state.cache_hits
        )
        yield CounterMetricFamily(
            "llmitm_cache_misses",
            "Calls the response cache was asked for and had no answer",
            value=state.cache_misses,
        )
        yield GaugeMetricFamily(
            "llmitm_cache_entries", "Answers the response cache holds", value=state.cache_entries
        )


class _Names:
    """The first :data:`MODEL_LABELS` names seen, each its own label value; the rest one."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def label(self, name: str) -> str:
        if name in self._seen:
            return name
        if len(self._seen) < MODEL_LABELS:
            self._seen.add(name)
            return name
        return OTHER_MODEL


class Metrics:
    """One process's metrics, in its own registry."""

    def __init__(self) -> None:
        self._request_models = _Names()
        self._response_models = _Names()
        self.registry = CollectorRegistry()
        self._state = StateCollector()
        self._lock = threading.Lock()
        """One exposition at a time: each hands the collector its own state."""
        self.token_usage = Histogram(
            "gen_ai_client_token_usage",
            "Tokens used per call (gen_ai.client.token.usage)",
            [*_CALL_LABELS, "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "gen_ai_client_operation_duration",
            "Seconds from the request to the answer's end (gen_ai.client.operation.duration)",
            [*_CALL_LABELS, "error_type"],
            unit="seconds",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.first_chunk = Histogram(
            "gen_ai_client_operation_time_to_first_chunk",
            "Seconds from the request to the stream's first chunk "
            "(gen_ai.client.operation.time_to_first_chunk)",
            _CALL_LABELS,
            unit="seconds",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.calls = Counter(
            "llmitm_calls",
            "Create calls that ended, by outcome",
            ["openai_api_type", "llmitm_endpoint", "llmitm_route", "gen_ai_request_model",
             "error_type"],
            registry=self.registry,
        )  # fmt: skip
        self.failovers = Counter(
            "llmitm_failovers",
            "Attempts beyond the first that calls took (failover and retries)",
            ["llmitm_route", "llmitm_endpoint"],
            registry=self.registry,
        )
        self.registry.register(self._state)

    def observe(self, call: CallFacts) -> None:
        """Add one finished call."""
        request_model = self._request_models.label(call.request_model)
        labels = (
            "chat",  # both APIs are chat operations in the conventions' terms
            call.provider,
            request_model,
            self._response_models.label(call.response_model),
            call.api,
            call.endpoint,
        )
        self.calls.labels(call.api, call.endpoint, call.route, request_model, call.error_type).inc()
        if call.attempts > 1:
            self.failovers.labels(call.route, call.endpoint).inc(call.attempts - 1)
        if call.duration is not None:
            self.duration.labels(*labels, call.error_type).observe(call.duration)
        if call.first_chunk is not None:
            self.first_chunk.labels(*labels).observe(call.first_chunk)
        if call.input_tokens is not None:
            self.token_usage.labels(*labels, "input").observe(call.input_tokens)
        if call.output_tokens is not None:
            self.token_usage.labels(*labels, "output").observe(call.output_tokens)

    def exposition(self, state: ProxyState | None = None) -> bytes:
        """The registry, and ``state``'s gauges, in Prometheus's text format. Safe to call
        from a worker thread (rendering many label sets takes a while) when ``state`` was
        taken on the event loop."""
        with self._lock:
            self._state.state = state
            try:
                return generate_latest(self.registry)
            finally:
                self._state.state = None


def proxy_state(snapshot: Mapping[str, Any], hits: int, misses: int) -> ProxyState:
    """:class:`ProxyState` from routing's status snapshot and the recorder's counts."""
    endpoints = {
        name: EndpointState(
            in_flight=facts["in_flight"],
            max_concurrency=facts["max_concurrency"],
            cooling_s=facts["cooling_s"],
            failures=facts["failures"],
        )
        for name, facts in snapshot.get("endpoints", {}).items()
    }
    return ProxyState(
        endpoints=endpoints,
        in_flight=snapshot.get("in_flight", 0),
        waiting=snapshot.get("waiting", 0),
        replay_hits=hits,
        replay_misses=misses,
    )
