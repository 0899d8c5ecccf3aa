"""What a translator needs to know beyond the bytes it is fed.

:class:`TranslateOptions` is configuration (one per proxy or CLI run);
:class:`TranslationContext` is per request: what the request mapping learned (the client's
model, whether it asked for usage, the request fields a Response object echoes, which chat
function names stand for Responses ``custom`` or namespaced tools) and hands to the body and
stream translators of the same exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from llmitm.translate.chat_resume import ChatResume
from llmitm.wire.ids import Clock, IdFactory, random_id, system_clock
from llmitm.wire.modes import REASONING_MODES, ReasoningMode


@dataclass(frozen=True, slots=True)
class TranslateOptions:
    """Configuration shared by every translation of a run."""

    reasoning: ReasoningMode = "think-tags"
    strict: bool = False
    """Refuse (400) what cannot be carried over — hosted tools, sampling fields the target
    lacks — instead of dropping it with a warning."""
    drop_unsupported: bool = False
    """Drop fields that have no equivalent and would otherwise be a 400 (``n > 1``, ``stop``
    toward Responses)."""
    think_open_missing: bool = False
    """Chat upstream whose content starts inside ``<think>`` without the opening tag
    (R1 distills): treat everything up to ``</think>`` as reasoning."""
    reasoning_passthrough: ReasoningMode | None = None
    """Re-render the reasoning fields of a chat stream relayed to a chat client
    (``normalise-chat``) in this mode; ``None`` keeps them as the backend sent them."""
    reasoning_summary: bool = False
    """Show a Responses backend's raw ``reasoning_text`` to a Responses client as reasoning
    summary events (``normalise-responses``), which more clients display."""
    ids: IdFactory = random_id
    clock: Clock = system_clock

    def __post_init__(self) -> None:
        if self.reasoning not in REASONING_MODES:
            raise ValueError(
                f"reasoning must be one of {', '.join(REASONING_MODES)}, not {self.reasoning!r}"
            )
        if self.reasoning_passthrough not in (None, *REASONING_MODES):
            raise ValueError(
                f"reasoning_passthrough must be one of {', '.join(REASONING_MODES)}, "
                f"not {self.reasoning_passthrough!r}"
            )


@dataclass(frozen=True, slots=True)
class ToolOrigin:
    """The Responses tool behind a chat function name."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None


@dataclass(slots=True)
class TranslationContext:
    """Facts about one exchange, produced by request mapping, consumed by response mapping."""

    options: TranslateOptions = field(default_factory=TranslateOptions)
    model: str | None = None
    """The model name the client asked for; echoed in translated output."""
    include_usage: bool = False
    """A chat client asked for the trailing usage chunk (``stream_options.include_usage``)."""
    echo: dict[str, Any] = field(default_factory=dict)
    """Request fields a synthesized Response object repeats (instructions, tools, …)."""
    tools: dict[str, ToolOrigin] = field(default_factory=dict)
    """Chat function name → the Responses tool it stands for (custom and namespaced tools)."""
    response_id: str | None = None
    """Id for the synthesized Response (store emulation assigns it); minted when ``None``."""
    seal_reasoning: Callable[[dict[str, Any]], str] | None = None
    """Makes a reasoning item's ``encrypted_content`` (the local Responses API sets it when
    the client asked for ``reasoning.encrypted_content``); called once per reasoning item."""


@dataclass(slots=True)
class MappedRequest:
    """A request translated for the upstream, and what its response translation will need."""

    body: dict[str, Any]
    context: TranslationContext
    warnings: list[str] = field(default_factory=list)
    """Human-readable notes on what was dropped or approximated (the proxy logs them)."""
    message_texts: list[bytes] | None = None
    """Each of ``body["messages"]``'s JSON, when the translator spelt them (a resumable
    translation, :mod:`llmitm.translate.chat_resume`)."""
    resume: ChatResume | None = None
    """Where the translation stood after the input items, for the next turn's body."""
