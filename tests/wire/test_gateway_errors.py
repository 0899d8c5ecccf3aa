"""The OpenAI-shaped answer for an upstream that failed before its answer began."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from llmitm.wire.gateway_errors import gateway_error, gateway_error_body


def test_an_unreachable_upstream_and_a_broken_answer_are_told_apart() -> None:
    refused = gateway_error("[Errno 111] Connect call failed", reached=False)
    broken = gateway_error("server closed connection.", reached=True)
    assert (refused.status, refused.code, refused.type) == (
        502,
        "upstream_unreachable",
        "server_error",
    )
    assert (broken.status, broken.code) == (502, "upstream_error")
    assert "Connect call failed" in refused.message
    assert broken.message.endswith("(server closed connection).")


@given(reason=st.text(max_size=200), reached=st.booleans())
def test_the_body_is_always_an_openai_error_object(reason: str, reached: bool) -> None:
    body = orjson.loads(gateway_error_body(gateway_error(reason, reached=reached)))
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and body["error"]["code"].startswith("upstream_")
