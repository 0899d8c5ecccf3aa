"""What the trace of one call says: span names, times and attributes as plain data.

One span per call (``chat {model}``, kind client, with the GenAI conventions' ``gen_ai.*``
attributes and ``openai.api.type``), and under it one span per attempt (the endpoint tried,
its outcome and status), so a failover shows as its tries. The addon turns these into
OpenTelemetry spans; this module imports no OpenTelemetry, so it needs no extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmitm.observe.metrics import CallFacts

OPENAI_API_TYPES = {"chat": "chat_completions", "responses": "responses"}
"""``openai.api.type`` by the client's API, as the conventions spell it."""


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """One try of one endpoint, in epoch seconds."""

    endpoint: str
    started: float
    ended: float
    outcome: str
    status: int | None = None


@dataclass(frozen=True, slots=True)
class SpanFacts:
    name: str
    started: float
    ended: float
    attributes: dict[str, Any]
    error: str = ""
    children: list[SpanFacts] = field(default_factory=list)


def call_span(call: CallFacts, started: float, attempts: list[AttemptFacts]) -> SpanFacts:
    """The call's span and its attempts' spans."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": call.provider,
        "gen_ai.request.model": call.request_model,
        "gen_ai.response.model": call.response_model,
        "openai.api.type": OPENAI_API_TYPES.get(call.api, call.api),
        "llmitm.endpoint": call.endpoint,
        "llmitm.attempts": call.attempts,
    }
    if call.route:
        attributes["llmitm.route"] = call.route
    if call.input_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = call.input_tokens
    if call.output_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = call.output_tokens
    if call.first_chunk is not None:
        attributes["gen_ai.response.time_to_first_chunk"] = call.first_chunk
    if call.error_type:
        attributes["error.type"] = call.error_type
    ended = started + (call.duration or 0.0)
    children = [attempt_span(attempt, number) for number, attempt in enumerate(attempts, 1)]
    return SpanFacts(
        f"chat {call.request_model}", started, ended, attributes, call.error_type, children
    )


def attempt_span(attempt: AttemptFacts, number: int) -> SpanFacts:
    attributes: dict[str, Any] = {
        "llmitm.endpoint": attempt.endpoint,
        "llmitm.attempt": number,
        "llmitm.attempt.outcome": attempt.outcome,
    }
    if attempt.status is not None:
        attributes["http.response.status_code"] = attempt.status
    error = "" if attempt.outcome == "success" else attempt.outcome
    if error:
        attributes["error.type"] = str(attempt.status or attempt.outcome)
    name = f"attempt {attempt.endpoint}"
    return SpanFacts(name, attempt.started, attempt.ended, attributes, error)
