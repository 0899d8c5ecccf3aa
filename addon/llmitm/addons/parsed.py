"""The client's request body parsed (and checked) once per flow, for the addons that read it.

:class:`~llmitm.addons.responses_api.LlmResponsesApi` parses and validates a Responses create
call before the router plans it; an agent resends its whole history on every turn, so that
is a body of a few MB that costs tens of milliseconds to parse and as much to validate. The
router takes the object the earlier addon left instead of doing both again — only when the
flow's body is still the very bytes it was parsed from, so anything that rewrote the body in
between (compaction, another addon, a script) makes the router parse what it finds.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

from mitmproxy import http

from llmitm.wire.growing import Grown


class Parsed(NamedTuple):
    """A flow's body as an earlier addon parsed it."""

    body: dict[str, Any]
    validated: str | None
    """The API it was validated as, if any."""
    grown: Grown | None
    """The growing parse it is, unchanged since: a later addon may carry what it made of
    the body to the next turn's (:meth:`~llmitm.wire.growing.Grown.carry`)."""


# Beside the flow, not in flow.metadata (which mitmproxy saves with the flow); weak keys: a
# flow that ends before the router takes its body takes it along.
_PARSED: weakref.WeakKeyDictionary[http.HTTPFlow, tuple[bytes, Parsed]] = (
    weakref.WeakKeyDictionary()
)


def keep_parsed(
    flow: http.HTTPFlow,
    content: bytes,
    body: dict[str, Any],
    validated: str | None,
    grown: Grown | None = None,
) -> None:
    """``body`` is ``content`` parsed (``validated``: the API it was validated as, if any;
    ``grown``: the growing parse it is)."""
    _PARSED[flow] = (content, Parsed(body, validated, grown))


def peek_parsed(flow: http.HTTPFlow, content: bytes) -> dict[str, Any] | None:
    """The body kept for exactly ``content``, left for the taker (not to be changed)."""
    kept = _PARSED.get(flow)
    return kept[1].body if kept is not None and kept[0] is content else None


def take_parsed(flow: http.HTTPFlow, content: bytes) -> Parsed | None:
    """The body kept for exactly ``content``; handed over once (the taker may change it)."""
    kept = _PARSED.pop(flow, None)
    if kept is None or kept[0] is not content:
        return None
    return kept[1]
