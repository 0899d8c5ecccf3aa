"""A small Codex-style Responses stream consumer, written independently of llmitm.

It mirrors what ``codex-rs/codex-api/src/sse/responses.rs`` (``process_sse``) does with a
Responses SSE body, so tests can check that llmitm's output would drive Codex:

- SSE framing is parsed here from scratch (not with llmitm's decoder), so it also cross-checks
  the encoder;
- conversation history is built **only** from ``response.output_item.done`` items, each of which
  must deserialize as one of Codex's ``ResponseItem`` shapes (an item that does not is skipped by
  Codex, which loses it silently: here it becomes a :class:`SkippedItem` tests can look for);
- UI deltas come from ``output_text.delta``, ``reasoning_summary_text.delta`` (needs
  ``summary_index``), ``reasoning_text.delta`` (needs ``content_index``) and
  ``reasoning_summary_part.added``;
- ``response.completed`` must carry ``response.id`` and, when ``usage`` is present, the three
  integer totals (and ``cached_tokens`` / ``reasoning_tokens`` when the details objects are
  present); Codex emits ``Completed`` only once the byte stream ends;
- the stream ending without ``response.completed`` is an error, and ``response.failed`` maps
  ``error.code`` the way Codex does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Created:
    pass


@dataclass(frozen=True)
class OutputItemAdded:
    item: dict[str, Any]


@dataclass(frozen=True)
class OutputItemDone:
    item: dict[str, Any]


@dataclass(frozen=True)
class SkippedItem:
    """An ``output_item.done`` item Codex would fail to deserialize and drop (not a Codex
    event: recorded so tests can insist there are none)."""

    item: dict[str, Any]
    problem: str


@dataclass(frozen=True)
class OutputTextDelta:
    delta: str


@dataclass(frozen=True)
class ReasoningSummaryDelta:
    delta: str
    summary_index: int


@dataclass(frozen=True)
class ReasoningContentDelta:
    delta: str
    content_index: int


@dataclass(frozen=True)
class ReasoningSummaryPartAdded:
    summary_index: int


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    reasoning_output_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class Completed:
    response_id: str
    token_usage: TokenUsage | None


type CodexEvent = (
    Created
    | OutputItemAdded
    | OutputItemDone
    | SkippedItem
    | OutputTextDelta
    | ReasoningSummaryDelta
    | ReasoningContentDelta
    | ReasoningSummaryPartAdded
    | Completed
)


@dataclass
class CodexStreamError(Exception):
    """What Codex's stream would end with instead of ``Completed``."""

    kind: str  # "stream" | "context_window_exceeded" | "quota_exceeded" | ...
    message: str
    events: list[Any] = field(default_factory=list)
    delay_seconds: float | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


# -- SSE framing (the eventsource_stream crate's behaviour) -----------------------------------


def iter_sse(body: bytes) -> list[tuple[str | None, str]]:
    """``(event name, data)`` for each dispatched event of a whole SSE body."""
    text = body.decode("utf-8")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    events: list[tuple[str | None, str]] = []
    name: str | None = None
    data: list[str] | None = None
    for line in [*text.split("\n"), ""]:
        if line == "":
            if data is not None:
                events.append((name, "\n".join(data)))
            name, data = None, None
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "data":
            data = [*(data or []), value]
        elif key == "event":
            name = value or None
    return events


def sse_json_events(body: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a Responses SSE body (``[DONE]`` and non-JSON data skipped); each
    ``event:`` line, when present, must repeat the JSON ``type``."""
    out = []
    for name, data in iter_sse(body):
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            if name is not None and obj.get("type") != name:
                raise AssertionError(f"event line {name!r} but JSON type {obj.get('type')!r}")
            out.append(obj)
    return out


# -- ResponseItem (codex_protocol::models::ResponseItem, the shapes llmitm emits) --------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def response_item_problem(item: dict[str, Any]) -> str | None:
    """Why Codex could not deserialize ``item`` into the ResponseItem variant it names, or
    ``None`` when it can. Codex's ``ContentItem`` knows only ``input_text``, ``input_image`` and
    ``output_text``: a message with a ``refusal`` part does not deserialize."""
    kind = item.get("type")
    if kind == "message":
        content = item.get("content")
        if not isinstance(item.get("role"), str) or not isinstance(content, list):
            return "message without role or content list"
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                "output_text",
                "input_text",
                "input_image",
            ):
                return f"message part {part!r} is not a Codex ContentItem"
            if part["type"] != "input_image" and not isinstance(part.get("text"), str):
                return "message text part without text"
        return None
    if kind == "function_call":
        for key in ("name", "arguments", "call_id"):
            if not isinstance(item.get(key), str):
                return f"function_call without {key}"
        if item.get("namespace") is not None and not isinstance(item["namespace"], str):
            return "function_call namespace is not a string"
        return None
    if kind == "custom_tool_call":
        for key in ("name", "input", "call_id"):
            if not isinstance(item.get(key), str):
                return f"custom_tool_call without {key}"
        return None
    if kind == "reasoning":
        summary = item.get("summary")
        if not isinstance(item.get("id"), str) or not isinstance(summary, list):
            return "reasoning without id or summary list"
        for part in summary:
            if not (
                isinstance(part, dict)
                and part.get("type") == "summary_text"
                and isinstance(part.get("text"), str)
            ):
                return "reasoning summary part without text"
        return None
    return f"output item type {kind!r} is not one llmitm emits"


def _token_usage(usage: Any) -> TokenUsage | None:
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise CodexStreamError("stream", f"failed to parse ResponseCompleted: usage {usage!r}")
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        if not _is_int(usage.get(key)):
            raise CodexStreamError("stream", f"failed to parse ResponseCompleted: {key} missing")
    cached = reasoning = 0
    input_details = usage.get("input_tokens_details")
    if input_details is not None:
        if not _is_int(input_details.get("cached_tokens")):
            raise CodexStreamError("stream", "failed to parse ResponseCompleted: cached_tokens")
        cached = input_details["cached_tokens"]
    output_details = usage.get("output_tokens_details")
    if output_details is not None:
        if not _is_int(output_details.get("reasoning_tokens")):
            raise CodexStreamError("stream", "failed to parse ResponseCompleted: reasoning_tokens")
        reasoning = output_details["reasoning_tokens"]
    return TokenUsage(
        input_tokens=usage["input_tokens"],
        cached_input_tokens=cached,
        output_tokens=usage["output_tokens"],
        reasoning_output_tokens=reasoning,
        total_tokens=usage["total_tokens"],
    )


_RETRY_AFTER = re.compile(r"(?i)try again in\s*(\d+(?:\.\d+)?)\s*(s|ms|seconds?)")


def _failed_error(response: dict[str, Any]) -> CodexStreamError:
    error = response.get("error")
    if not isinstance(error, dict):
        return CodexStreamError("stream", "response.failed event received")
    code = error.get("code")
    message = error.get("message") or ""
    if code == "context_length_exceeded":
        return CodexStreamError("context_window_exceeded", message)
    if code == "insufficient_quota":
        return CodexStreamError("quota_exceeded", message)
    if code == "usage_not_included":
        return CodexStreamError("usage_not_included", message)
    delay = None
    match = _RETRY_AFTER.search(message) if code == "rate_limit_exceeded" else None
    if match:
        value = float(match.group(1))
        delay = value / 1000 if match.group(2).lower() == "ms" else value
    return CodexStreamError("retryable", message, delay_seconds=delay)


def parse_codex_stream(body: bytes, *, require_usage: bool = True) -> list[CodexEvent]:
    """The events Codex would produce from ``body``; raises :class:`CodexStreamError` where
    Codex's stream would end in an error (its ``events`` holds what was produced before).

    ``require_usage`` additionally insists that ``response.completed`` carries ``usage`` (Codex
    itself accepts a missing one; llmitm sends usage whenever the upstream reported it).
    """
    events: list[CodexEvent] = []
    completed: Completed | None = None
    pending_error: CodexStreamError | None = None
    for name, data in iter_sse(body):
        del name  # Codex keys off the JSON type, like the SDK
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            continue  # Codex skips unparseable data ([DONE] included)
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            continue
        kind = event["type"]
        delta = event.get("delta")
        if kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, dict):
                problem = response_item_problem(item)
                # Codex logs and skips an item it cannot deserialize: it never reaches history.
                if problem is None:
                    events.append(OutputItemDone(item))
                else:
                    events.append(SkippedItem(item, problem))
        elif kind == "response.output_item.added":
            item = event.get("item")
            if isinstance(item, dict):
                events.append(OutputItemAdded(item))
        elif kind == "response.output_text.delta":
            if isinstance(delta, str):
                events.append(OutputTextDelta(delta))
        elif kind == "response.reasoning_summary_text.delta":
            if isinstance(delta, str) and _is_int(event.get("summary_index")):
                events.append(ReasoningSummaryDelta(delta, event["summary_index"]))
        elif kind == "response.reasoning_text.delta":
            if isinstance(delta, str) and _is_int(event.get("content_index")):
                events.append(ReasoningContentDelta(delta, event["content_index"]))
        elif kind == "response.reasoning_summary_part.added":
            if _is_int(event.get("summary_index")):
                events.append(ReasoningSummaryPartAdded(event["summary_index"]))
        elif kind == "response.created":
            if event.get("response") is not None:
                events.append(Created())
        elif kind == "response.failed":
            response = event.get("response")
            if isinstance(response, dict):
                pending_error = _failed_error(response)
        elif kind == "response.completed":
            response = event.get("response")
            if isinstance(response, dict):
                if not isinstance(response.get("id"), str):
                    pending_error = CodexStreamError(
                        "stream", "failed to parse ResponseCompleted: id"
                    )
                    continue
                try:
                    usage = _token_usage(response.get("usage"))
                except CodexStreamError as error:
                    pending_error = error
                    continue
                completed = Completed(response["id"], usage)
    # The byte stream ended: only now does Codex report completion.
    if completed is None:
        error = pending_error or CodexStreamError(
            "stream", "stream closed before response.completed"
        )
        error.events = events
        raise error
    if require_usage and completed.token_usage is None:
        raise CodexStreamError("stream", "response.completed without usage", events)
    events.append(completed)
    return events


def history(events: list[CodexEvent]) -> list[dict[str, Any]]:
    """The items Codex records in its conversation history (and runs tools from)."""
    return [event.item for event in events if isinstance(event, OutputItemDone)]
