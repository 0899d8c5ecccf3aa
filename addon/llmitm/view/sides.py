"""Both sides of a translated call as text, one labelled section each: what the content view
shows on a flow llmitm changed.

A request tab shows "client sent" and "sent upstream", a response tab "upstream answered" and
"client got", each headed by the API it speaks and its request or status line; each body is
shown as its conversation (:mod:`llmitm.view.text`), or as text when it is no API body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmitm.view.document import read_document
from llmitm.view.text import conversation_text

CLIENT_SENT = "client sent"
SENT_UPSTREAM = "sent upstream"
UPSTREAM_ANSWERED = "upstream answered"
CLIENT_GOT = "client got"

API_LABELS = {"responses": "Responses API", "chat": "Chat Completions"}
RULE = "═" * 60
NOT_KEPT = (
    "(not kept: an upstream stream is kept in mitmproxy and mitmweb, or when flows are saved)\n"
)


@dataclass(frozen=True, slots=True)
class Section:
    """One message of a call, as a section of the text."""

    label: str
    """One of :data:`CLIENT_SENT`, :data:`SENT_UPSTREAM`, :data:`UPSTREAM_ANSWERED`,
    :data:`CLIENT_GOT`."""
    api: str
    line: str
    """``POST http://host/v1/responses`` or ``200 text/event-stream``."""
    body: bytes
    headers: Sequence[tuple[str, str]] = ()
    """Shown for the upstream's messages, which mitmproxy's own tabs do not show."""
    left_out: int = 0
    kept: bool = True
    """``False``: the body was not kept (a stream nobody could look at when it flowed)."""


def title(section: Section) -> str:
    api = API_LABELS.get(section.api, section.api or "unknown API")
    return f"{section.label} ({api})"


def body_text(body: bytes) -> str:
    if not body:
        return "(no body)\n"
    try:
        conversation = read_document(body)
    except Exception:  # never into the UI: the bytes below stand in for it
        conversation = None
    if conversation is not None:
        return conversation_text(conversation)
    return body.decode("utf-8", "replace") + "\n"


def section_text(section: Section) -> str:
    lines = [RULE, f"▌ {title(section)} · {section.line}", RULE]
    lines += [f"  {name}: {value}" for name, value in section.headers]
    if section.headers:
        lines.append("")
    text = "\n".join(lines) + "\n"
    if not section.kept:
        return text + NOT_KEPT
    text += body_text(section.body)
    if section.left_out:
        text += f"(and {section.left_out:,} more bytes, not kept)\n"
    return text


def sides_text(sections: Sequence[Section]) -> str:
    """The sections in order, the first line naming them all."""
    heading = "llmitm · " + " → ".join(title(section) for section in sections)
    return heading + "\n\n" + "\n".join(section_text(section) for section in sections)
