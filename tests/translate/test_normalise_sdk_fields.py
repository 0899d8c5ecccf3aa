"""A Response field only the SDKs compute (``output_text``) never reaches the client from an
upstream: OpenRouter sends ``output_text: ""``, and openai-node's ``finalResponse()`` keeps a
present one instead of computing it, so the answer's text read as empty."""

from __future__ import annotations

import orjson

from llmitm.translate.pipeline import StreamPipeline
from tests.helpers.oracle import sdk_responses_stream
from tests.helpers.realfixtures import real_or_skip


def test_the_upstreams_output_text_is_not_relayed() -> None:
    raw = (real_or_skip() / "pydantic-ai-openrouter-responses-dataonly-stream.sse").read_bytes()
    assert b'"output_text":""' in raw
    pipeline = StreamPipeline("normalise-responses")
    out = pipeline.feed(raw) + pipeline.close()
    terminal = [
        orjson.loads(line[6:])
        for line in out.splitlines()
        if line.startswith(b"data: ") and b'"response.completed"' in line
    ]
    assert [event["type"] for event in terminal] == ["response.completed"]
    assert "output_text" not in terminal[0]["response"]
    _events, final = sdk_responses_stream(out)
    assert final.output_text == "4"
