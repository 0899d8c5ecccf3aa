"""Non-streamed answers get the reasoning rendering their endpoint asks for, like streams:
a chat body's reasoning field in ``reasoning_passthrough``'s mode, a Responses body's raw
reasoning text as summary under ``reasoning_summary``; unset, the bodies keep their bytes."""

from __future__ import annotations

from typing import Any

import orjson

from llmitm.exchange.response import translate_body
from llmitm.routing.config import parse_config
from llmitm.routing.plan import plan_for_endpoint
from llmitm.translate.context import TranslateOptions, TranslationContext

CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "A", "reasoning_content": "why"},
            "finish_reason": "stop",
        }
    ],
}
RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "output": [
        {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "why"}],
        }
    ],
}


def answer(api: str, body: dict[str, Any], **keys: Any) -> bytes | None:
    raw = {"endpoints": {"e": {"kind": "openai", "base_url": "https://h/v1", **keys}}}
    endpoint = parse_config(raw, "llmitm.toml", {}).endpoints["e"]
    options = TranslateOptions(
        reasoning_passthrough=endpoint.reasoning_passthrough,
        reasoning_summary=endpoint.reasoning_summary,
    )
    plan = plan_for_endpoint(endpoint, api, "m")  # type: ignore[arg-type]
    out = translate_body(200, orjson.dumps(body), plan, TranslationContext(options))
    return None if out is None else out[1]


def test_a_chat_body_gets_think_tags() -> None:
    out = answer("chat", CHAT, reasoning_passthrough="think-tags")
    assert out is not None
    message = orjson.loads(out)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "<think>\nwhy\n</think>\n\nA"}


def test_a_responses_body_gets_its_raw_text_as_summary() -> None:
    out = answer("responses", RESPONSE, reasoning_summary=True)
    assert out is not None
    [item] = orjson.loads(out)["output"]
    assert item["summary"] == [{"type": "summary_text", "text": "why"}]
    assert "content" not in item


def test_unset_keys_keep_both_bodies_as_they_came() -> None:
    assert answer("chat", CHAT) is None
    assert answer("responses", RESPONSE) is None
