"""The response cache as an unmodified app meets it: ``llmitm run -- python app.py``, where the
app is the openai SDK at its default address (``https://api.openai.com``) and knows nothing of
llmitm or its cache, and the route that takes ``api.openai.com`` says ``cache = true``.

The fake upstream ends each stream's body a while after its last event, as servers behind
load balancers do; the SDK stops reading a chat stream at ``data: [DONE]`` and closes it, so
mitmproxy sees the client leave before the body's end. Such an answer is complete (its
terminal event was relayed) and is kept: the app's second identical call, streamed or not, in
either API, never reaches the upstream.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from .processes import Upstream, fake_upstream, llmitm_run, shown

pytestmark = pytest.mark.slow

END_DELAY_MS = 300

CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
models = ["gpt-*"]
hosts = ["api.openai.com"]
endpoints = ["local"]
cache = true
"""

APP = """
import openai
client = openai.OpenAI(api_key="sk-unmodified-app", max_retries=0, timeout=20)
assert str(client.base_url).startswith("https://api.openai.com"), client.base_url
messages = [{"role": "user", "content": "Say hello"}]

for _ in range(2):
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-5", messages=messages, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    print("CHAT-STREAM", raw.headers.get("x-llmitm-cache"), text)

with client.chat.completions.stream(model="gpt-5", messages=messages) as stream:
    print("CHAT-HELPER", stream.get_final_completion().choices[0].message.content)

for _ in range(2):
    with client.responses.stream(model="gpt-5", input="Say hello") as stream:
        final = stream.get_final_response()
    print("RESPONSES-STREAM", final.status, final.output_text)

for _ in range(2):
    raw = client.responses.with_raw_response.create(model="gpt-5", input="Say hello")
    print("RESPONSES", raw.headers.get("x-llmitm-cache"), raw.parse().output_text)
"""

ANSWER = "Hello from the fake upstream."


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    tmp = tmp_path_factory.mktemp("run-cache-upstream")
    with fake_upstream(tmp, "chat", fault=f"end_delay_ms={END_DELAY_MS}") as fake:
        yield fake


def test_an_unmodified_apps_repeated_calls_are_answered_from_the_cache(
    tmp_path: Path, upstream: Upstream
) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    result = llmitm_run(tmp_path, CONFIG.format(url=upstream.url), sys.executable, str(app))
    output = shown(result)
    assert result.returncode == 0, output
    assert result.stdout.splitlines() == [
        f"CHAT-STREAM miss {ANSWER}",
        f"CHAT-STREAM hit {ANSWER}",
        f"CHAT-HELPER {ANSWER}",
        f"RESPONSES-STREAM completed {ANSWER}",
        f"RESPONSES-STREAM completed {ANSWER}",
        f"RESPONSES miss {ANSWER}",
        f"RESPONSES hit {ANSWER}",
    ], output
    seen = orjson.loads(httpx.get(f"{upstream.url}/_requests").content)
    # One chat stream (the SDK's helper asks exactly what the first call asked), one for the
    # streamed Responses calls, one for the plain ones: every repeat was a hit.
    assert [(r["path"], r["body"].get("stream", False)) for r in seen] == [
        ("/v1/chat/completions", True),
        ("/v1/chat/completions", True),
        ("/v1/chat/completions", False),
    ], output
