"""Re-rendering a chat backend's reasoning fields for a chat client (same API in and out).

Chat backends spell reasoning as ``reasoning_content`` (DeepSeek, llama.cpp) or ``reasoning``
(vLLM, Ollama, OpenRouter, which adds ``reasoning_details``). Not every client reads the
spelling its backend sends: openai-node's ``ChatCompletionStream`` keeps only the last
fragment of a delta field it does not know, so a long ``reasoning_content`` reaches the app
as its last two characters. Asked for (an endpoint's ``reasoning_passthrough``), the chat
normaliser renders the fields in one :data:`~llmitm.translate.context.ReasoningMode`:

- ``think-tags``: inside ``content`` between ``<think>`` and ``</think>``, as the Responses →
  chat translator writes them; every client keeps ``content`` whole;
- ``reasoning_content`` / ``reasoning``: the one field of that name;
- ``drop``: not at all.

:class:`DeltaReasoning` does it for one choice of a stream, delta by delta (the tags open at
the first reasoning fragment and close before the first answer, tool call or finish);
:func:`render_message_reasoning` for a whole message.
"""

from __future__ import annotations

from typing import Any

from llmitm.translate.body_to_chat import THINK_CLOSE, THINK_OPEN
from llmitm.translate.context import ReasoningMode

_FIELDS = ("reasoning_content", "reasoning")
_DETAILS = "reasoning_details"
"""OpenRouter's structured copy of ``reasoning``: dropped with it, kept beside a field."""


def _take_reasoning(holder: dict[str, Any]) -> str | None:
    """Remove the reasoning fields from ``holder``; their text (``None``: there was none)."""
    text = None
    for name in _FIELDS:
        if name in holder:
            value = holder.pop(name)
            # A backend sending both spellings sends the same text twice: keep the first.
            if isinstance(value, str) and text is None:
                text = value
    return text


def _has_reasoning(holder: dict[str, Any]) -> bool:
    return any(name in holder for name in _FIELDS) or (
        _DETAILS in holder and holder[_DETAILS] is not None
    )


class DeltaReasoning:
    """One streamed choice's reasoning, rendered in ``mode``; think tags stay balanced."""

    __slots__ = ("mode", "think_open")

    def __init__(self, mode: ReasoningMode) -> None:
        self.mode = mode
        self.think_open = False
        """Inside ``<think>``: the next answer, tool call or finish closes it first."""

    def render(self, delta: dict[str, Any], finishing: bool) -> bool:
        """Rewrite ``delta`` in place; whether it changed. ``finishing``: the choice's
        finish reason rides on this chunk."""
        if self.mode == "think-tags":
            return self._think_tags(delta, finishing)
        if not _has_reasoning(delta):
            return False
        if self.mode == "drop":
            _take_reasoning(delta)
            delta.pop(_DETAILS, None)
            return True
        other = "reasoning" if self.mode == "reasoning_content" else "reasoning_content"
        if other not in delta:
            return False  # already the asked-for spelling
        text = _take_reasoning(delta)
        if text is not None:
            delta[self.mode] = text
        return True

    def _think_tags(self, delta: dict[str, Any], finishing: bool) -> bool:
        had_details = delta.pop(_DETAILS, None) is not None
        reasoning = _take_reasoning(delta) if _has_reasoning(delta) else None
        content = delta.get("content")
        answer = content if isinstance(content, str) else ""
        rendered = ""
        if reasoning:
            if not self.think_open:
                rendered = THINK_OPEN
                self.think_open = True
            rendered += reasoning
        if self.think_open and (answer or delta.get("tool_calls") or finishing):
            rendered += THINK_CLOSE
            self.think_open = False
        if not rendered:
            # Nothing to add; an empty reasoning field or a details list was still removed.
            return reasoning is not None or had_details
        delta["content"] = rendered + answer
        return True

    def closing(self) -> str | None:
        """The ``</think>`` still owed when the stream ends without a finish reason."""
        if not self.think_open:
            return None
        self.think_open = False
        return THINK_CLOSE


def render_message_reasoning(message: dict[str, Any], mode: ReasoningMode) -> bool:
    """A whole ``chat.completion`` message's reasoning in ``mode``, in place; whether it
    changed."""
    if not _has_reasoning(message):
        return False
    if mode in ("reasoning_content", "reasoning"):
        other = "reasoning" if mode == "reasoning_content" else "reasoning_content"
        if other not in message:
            return False
        text = _take_reasoning(message)
        if text is not None:
            message[mode] = text
        return True
    message.pop(_DETAILS, None)
    text = _take_reasoning(message)
    if mode == "think-tags" and text:
        content = message.get("content")
        message["content"] = THINK_OPEN + text + THINK_CLOSE + (content or "")
    return True
