"""The trace of a call (observe.traces → addons.traces.emit): a ``chat {model}`` client span
with the GenAI conventions' attributes and ``openai.api.type``, one child per attempt at
the times they happened, errors as span status; read back from OpenTelemetry's in-memory
exporter (skipped without the otel extra)."""

from __future__ import annotations

import pytest

from llmitm.observe.metrics import CallFacts
from llmitm.observe.traces import AttemptFacts, call_span

CALL = CallFacts(
    api="chat",
    provider="openai",
    endpoint="b",
    request_model="gpt-4o",
    response_model="qwen3:8b",
    route="fleet",
    duration=2.0,
    first_chunk=0.5,
    input_tokens=10,
    output_tokens=20,
    attempts=2,
)
ATTEMPTS = [
    AttemptFacts("a", 100.1, 100.2, "rate_limited", 429),
    AttemptFacts("b", 100.3, 102.0, "success", 200),
]


def test_the_call_span_carries_genai_attributes_and_one_child_per_attempt() -> None:
    span = call_span(CALL, 100.0, ATTEMPTS)
    assert (span.name, span.started, span.ended, span.error) == ("chat gpt-4o", 100.0, 102.0, "")
    assert span.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "qwen3:8b",
        "openai.api.type": "chat_completions",
        "llmitm.endpoint": "b",
        "llmitm.attempts": 2,
        "llmitm.route": "fleet",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.response.time_to_first_chunk": 0.5,
    }
    first, second = span.children
    assert first.name == "attempt a" and first.error == "rate_limited"
    assert first.attributes["error.type"] == "429"
    assert first.attributes["http.response.status_code"] == 429
    assert second.error == "" and "error.type" not in second.attributes
    assert [c.attributes["llmitm.attempt"] for c in span.children] == [1, 2]


def test_a_failed_call_without_usage() -> None:
    from dataclasses import replace

    call = replace(CALL, api="responses", error_type="502", input_tokens=None, first_chunk=None)
    span = call_span(call, 5.0, [])
    assert span.error == "502" and span.attributes["error.type"] == "502"
    assert span.attributes["openai.api.type"] == "responses"
    assert "gen_ai.usage.input_tokens" not in span.attributes and span.children == []


def test_spans_reach_an_in_memory_exporter() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode

    from llmitm.addons.traces import emit

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    emit(provider.get_tracer("test"), call_span(CALL, 100.0, ATTEMPTS))
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"chat gpt-4o", "attempt a", "attempt b"}
    call = spans["chat gpt-4o"]
    assert call.kind == SpanKind.CLIENT and call.parent is None
    assert call.attributes["gen_ai.request.model"] == "gpt-4o"
    assert call.attributes["openai.api.type"] == "chat_completions"
    assert (call.start_time, call.end_time) == (100_000_000_000, 102_000_000_000)
    for name in ("attempt a", "attempt b"):
        assert spans[name].parent.span_id == call.context.span_id
        assert spans[name].context.trace_id == call.context.trace_id
    assert spans["attempt a"].status.status_code == StatusCode.ERROR
    assert spans["attempt b"].status.status_code == StatusCode.UNSET
    provider.shutdown()
