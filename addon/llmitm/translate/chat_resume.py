"""Where a Responses history's translation to chat messages stood after a body's items.

An agent resends its whole history every turn. Translated whole, every item is walked in
Python again and every string of the messages encoded again into the chat body: in the
conversation benchmark, the two grew from 0.3 to 0.8 ms a turn over 50 turns, on the event
loop, before the upstream sees a byte. A :class:`ChatResume` is the message builder's state
after one body's input items, with each message's JSON. The next turn's body, whose first
``count`` items are the same bytes as that body's (the caller's growing parse proves it,
:mod:`llmitm.wire.growing`), goes on from there: its resent messages are the same objects,
spelt once, and only its new items are translated. The result is the whole translation's,
value for value and byte for byte (property tests compare both on random growing
conversations).

Why that holds: a message is only ever appended, and only the last one changes when a later
item joins it (an assistant's text, calls and reasoning are one chat turn), so the builder
goes on from a copy of that one; an item's translation depends on the items before it only
through the builder's state; and what comes before the items, the system message of the
body's ``instructions``, is compared. A body with a stored history (a previous response's
items before its own) is translated whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ChatResume:
    """The builder's state after a body's first ``count`` input items (none of it changed
    afterwards: a body that goes on from it copies what it changes)."""

    count: int
    """Input items translated."""
    instructions: Any
    """The body's ``instructions``: its system message comes before the items'."""
    messages: tuple[dict[str, Any], ...]
    """The messages so far; the last one may still take later items (it is copied first)."""
    texts: tuple[bytes, ...]
    """Each message's JSON, as that body's chat request spelt it."""
    reasoning: tuple[str, ...]
    """Reasoning waiting for the next assistant message."""
    tool_media: tuple[dict[str, Any], ...]
    """Tool results' media waiting for the run of tool messages to end."""
    dropped: tuple[tuple[str, int], ...]
    """Hosted-tool items dropped so far, by type."""
    warnings: tuple[str, ...]
    """What translating the items warned of."""
    config: tuple[tuple[str, Any], ...]
    """The configuring items among them, with where each is."""
