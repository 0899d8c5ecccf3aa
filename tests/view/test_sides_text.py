"""Both sides as text: each section labelled with its side and API, in the order given, the
upstream's headers shown, a body that is no API body shown as it is, what was not kept said."""

from __future__ import annotations

import orjson

from llmitm.view.sides import (
    CLIENT_SENT,
    SENT_UPSTREAM,
    UPSTREAM_ANSWERED,
    Section,
    sides_text,
)


def test_sections_are_labelled_in_order_with_their_conversations() -> None:
    client = orjson.dumps({"model": "m", "input": "Say hello"})
    upstream = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Say hello"}]})
    text = sides_text(
        [
            Section(CLIENT_SENT, "responses", "POST http://a/v1/responses", client),
            Section(
                SENT_UPSTREAM,
                "chat",
                "POST http://b/v1/chat/completions",
                upstream,
                (("authorization", "Bearer <redacted>"),),
            ),
        ]
    )
    first_line = text.splitlines()[0]
    assert first_line == "llmitm · client sent (Responses API) → sent upstream (Chat Completions)"
    client_at = text.index("▌ client sent (Responses API) · POST http://a/v1/responses")
    upstream_at = text.index(
        "▌ sent upstream (Chat Completions) · POST http://b/v1/chat/completions"
    )
    assert client_at < text.index("llmitm · Responses request") < upstream_at
    assert upstream_at < text.index("authorization: Bearer <redacted>")
    assert upstream_at < text.index("llmitm · Chat Completions request")
    assert text.count("Say hello") == 2


def test_other_bodies_empty_bodies_and_what_was_left_out() -> None:
    text = sides_text(
        [
            Section(UPSTREAM_ANSWERED, "chat", "502 text/plain from local", b"bad gateway\xff"),
            Section(UPSTREAM_ANSWERED, "chat", "200", b"", left_out=12_345),
            Section(UPSTREAM_ANSWERED, "chat", "200 text/event-stream", b"", kept=False),
        ]
    )
    assert text.count("(no body)") == 1 and "(not kept: an upstream stream" in text
    assert "bad gateway\ufffd" in text
    assert "(no body)" in text and "(and 12,345 more bytes, not kept)" in text
