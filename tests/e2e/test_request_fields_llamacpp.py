"""The request fields a Responses client may send, through a real llmitm to llama.cpp's chat API.

Every field the request translator forwards or maps (safety and caching hints, moderation,
service tier, logprobs) and every one it drops reaches a real chat server in the same
request, which must still answer; the logprobs asked for in the Responses way come back on
the text, so the mapping works both ways. The tiny model babbles: the assertions are about
structure, never content.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from .processes import Proxy, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.llama-chat]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["chat"]

[[routes]]
models = ["*"]
endpoints = ["llama-chat"]
"""

EVERY_FIELD: dict[str, Any] = {
    "safety_identifier": "user-hash-1",
    "user": "u-1",
    "service_tier": "auto",
    "prompt_cache_key": "cache-1",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m", "prewarm": False},
    "moderation": {"model": "omni-moderation-latest"},
    "top_logprobs": 2,
    "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
    "truncation": "auto",
    "max_tool_calls": 2,
    "metadata": {"run": "fields"},
    "store": False,
    "parallel_tool_calls": True,
    "context_management": [{"type": "compaction", "compact_threshold": 100000}],
}


@pytest.fixture(scope="module")
def proxy(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("fields")
    with llmitm_proxy(tmp, config=CONFIG.format(llama=llama_server)) as proxy:
        yield proxy
        assert "Traceback" not in proxy.log_text(), proxy.log_text()[-3000:]


@pytest.fixture
def client(proxy: Proxy) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=proxy.base_url(), api_key="sk-llama", max_retries=0, timeout=120
    ) as client:
        yield client


def test_every_field_at_once_still_gets_an_answer_with_logprobs(client: openai.OpenAI) -> None:
    # A few tokens are enough: llama.cpp ranks the whole vocabulary for every token's
    # alternatives, so a long answer with logprobs is slow. The cut answer ends as
    # response.incomplete, which the SDK's stream helper calls an error: read the raw stream.
    events = list(
        client.responses.create(
            model="m", input="Say hi", max_output_tokens=6, stream=True, **EVERY_FIELD
        )
    )
    assert [event.sequence_number for event in events] == list(range(len(events)))
    terminal = events[-1]
    assert terminal.type == "response.incomplete"
    assert terminal.response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert deltas
    tokens = [token for delta in deltas for token in delta.logprobs]
    assert tokens, "the logprobs asked for by include/top_logprobs did not come back"
    assert all(len(token.top_logprobs) <= 2 for token in tokens)
    # The synthesized Response echoes what the client sent, whatever the upstream got.
    response = terminal.response  # type: ignore[union-attr]
    assert (response.safety_identifier, response.prompt_cache_key) == ("user-hash-1", "cache-1")
