"""The names shared by the layers that translate and the layers that route: which way a
stream is rewritten, and how a chat client is shown reasoning.

Plain vocabulary with no behaviour, so that routing can choose a direction and the
configuration can check a reasoning mode without importing the translators.
"""

from __future__ import annotations

from typing import Literal, get_args

Direction = Literal[
    "responses-to-chat", "chat-to-responses", "normalise-responses", "normalise-chat"
]
"""How a stream is rewritten: a Responses stream into chat chunks, chat chunks into a
Responses stream, or a stream of either API from an upstream that spells it loosely into the
shape clients expect."""

ReasoningMode = Literal["think-tags", "reasoning_content", "reasoning", "drop"]
"""How reasoning reaches a chat client: ``<think>`` tags inside ``content`` (the default,
understood by most chat UIs), the ``reasoning_content`` field (DeepSeek, llama.cpp), the
``reasoning`` field (vLLM, Ollama, OpenRouter), or not at all."""

REASONING_MODES: tuple[str, ...] = get_args(ReasoningMode)
