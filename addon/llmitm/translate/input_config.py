"""Input items that configure a Responses request instead of carrying conversation.

Codex in its default configuration sends no top-level ``tools``: it declares them in an
``additional_tools`` input item (namespaces holding ``custom`` and ``function`` tools) and
changes settings mid-conversation with a ``configuration_update`` item (reasoning effort).
OpenAI reads both natively; a chat upstream or a third-party Responses server knows neither.
:func:`read_input_config` collects what they say, in conversation order, so both translations
can declare the tools and apply the settings the way their upstream takes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llmitm.translate.errors import TranslationError

ADDITIONAL_TOOLS = "additional_tools"
CONFIGURATION_UPDATE = "configuration_update"
CONFIG_ITEM_TYPES = frozenset({ADDITIONAL_TOOLS, CONFIGURATION_UPDATE})

# What a configuration_update may change that llmitm carries; anything else is reported.
_APPLIED_UPDATES = frozenset({"type", "id", "reasoning"})


@dataclass(slots=True)
class InputConfig:
    """What the configuring items of one request say, later items overriding earlier ones."""

    tools: list[tuple[str, Any]] = field(default_factory=list)
    """The tools of every ``additional_tools`` item as ``(where, tool)``, in order
    (namespaces kept whole)."""
    reasoning_effort: str | None = None
    """The last ``configuration_update``'s reasoning effort."""
    ignored: list[str] = field(default_factory=list)
    """Settings an update carried that llmitm does not apply (for warnings)."""

    def warnings(self) -> list[str]:
        """What the proxy logs about the settings it did not apply."""
        return [
            f"ignored {where}: llmitm applies only reasoning from an update"
            for where in self.ignored
        ]


def is_config_item(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") in CONFIG_ITEM_TYPES


def read_input_config(items: Iterable[tuple[str, Any]]) -> InputConfig:
    """The configuration carried by ``items`` (``(where, item)`` pairs, history first).

    A ``configuration_update`` is a change made at that point of the conversation, so the
    latest one wins — also over the request's top-level ``reasoning``, which Codex sends
    with the same value anyway.
    """
    config = InputConfig()
    for where, item in items:
        if not is_config_item(item):
            continue
        if item["type"] == ADDITIONAL_TOOLS:
            tools = item.get("tools")
            if not isinstance(tools, list):
                raise TranslationError(
                    f"{where}.tools must be an array of tools; list the tools the item adds.",
                    param="input",
                    code="invalid_type",
                )
            config.tools.extend((f"{where}.tools[{i}]", tool) for i, tool in enumerate(tools))
            continue
        reasoning = item.get("reasoning")
        if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
            config.reasoning_effort = reasoning["effort"]
        for key in item:
            if key not in _APPLIED_UPDATES:
                config.ignored.append(f"{where}.{key}")
    return config
