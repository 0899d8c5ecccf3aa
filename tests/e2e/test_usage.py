"""Token usage accounting through a real llmitm process, read back with ``llmitm usage``.

Chat and Responses clients, streamed and not, in both translation directions and passthrough,
against the deterministic fake upstream; then llmitm is stopped with SIGTERM right after the
last answer, and the totals per endpoint and per model must equal what the fake upstream
reported for the requests it received — recomputed here with the fake's own functions.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

from llmitm.testing import fake_upstream as fu

from .processes import LLMITM, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[endpoints.responses-only]
kind = "openai"
base_url = "{url}/v1"
apis = ["responses"]

[[routes]]
name = "to-chat"
models = ["c-*"]
endpoints = ["chat-only"]

[[routes]]
models = ["r-*"]
endpoints = ["responses-only"]
"""

HEADERS = {"x-fake-scenario": "reasoning"}  # reasoning tokens too, whatever the model
MESSAGES: Any = [{"role": "user", "content": "Say hello."}]
QUIET_CHAT_MODEL = "c-chat-quiet"
"""A chat passthrough stream whose client did not ask for usage: llmitm asks the upstream
for the usage chunk, accounts it, and strips it before the client sees it."""


def fake_usage(body: dict[str, Any]) -> tuple[int, int, int, int]:
    """(input, cached, output, reasoning) as the fake computed them for ``body``."""
    scenario = fu.choose_scenario("reasoning", body)
    plan = fu.build_plan(scenario, body, lambda: "call")
    usage = fu.Usage(fu.input_chars(body) // 4 + 1, plan.output_tokens(), plan.reasoning_tokens())
    return usage.input, usage.cached, usage.output, usage.reasoning


def drive(client: openai.OpenAI) -> None:
    chat = client.chat.completions
    # chat client → Responses upstream (translated), and the passthrough Responses client
    chat.create(model="r-chat", messages=MESSAGES, extra_headers=HEADERS)
    for _ in chat.create(
        model="r-chat",
        messages=MESSAGES,
        stream=True,
        extra_headers=HEADERS,
        stream_options={"include_usage": True},
    ):
        pass  # fmt: skip
    # The client did not ask for usage: the upstream's terminal event still has it.
    for _ in chat.create(
        model="r-chat-quiet", messages=MESSAGES, stream=True, extra_headers=HEADERS
    ):
        pass
    client.responses.create(model="r-responses", input="Say hello.", extra_headers=HEADERS)
    for _ in client.responses.create(
        model="r-responses", input="Say hello.", stream=True, extra_headers=HEADERS
    ):
        pass
    # Responses client → chat upstream (translated; llmitm asks for the usage chunk)
    client.responses.create(model="c-responses", input="Say hello.", extra_headers=HEADERS)
    for _ in client.responses.create(
        model="c-responses", input="Say hello.", stream=True, extra_headers=HEADERS
    ):
        pass
    # chat passthrough: with the usage chunk, and without (llmitm asks for it and strips it)
    chat.create(model="c-chat", messages=MESSAGES, extra_headers=HEADERS)
    for _ in chat.create(
        model="c-chat",
        messages=MESSAGES,
        stream=True,
        extra_headers=HEADERS,
        stream_options={"include_usage": True},
    ):
        pass  # fmt: skip
    chunks = list(
        chat.create(model=QUIET_CHAT_MODEL, messages=MESSAGES, stream=True, extra_headers=HEADERS)
    )
    assert chunks and all(chunk.choices for chunk in chunks)  # no usage chunk reached it
    assert all(chunk.usage is None for chunk in chunks)


def usage_json(db: Path, by: str) -> dict[str, Any]:
    result = subprocess.run(
        [str(LLMITM), "usage", "--json", "--db", str(db), "--by", by],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return orjson.loads(result.stdout)


def test_usage_totals_equal_what_the_upstream_reported(tmp_path: Path) -> None:
    db = tmp_path / "usage.db"
    with fake_upstream(tmp_path) as upstream:
        with llmitm_proxy(
            tmp_path,
            config=CONFIG.format(url=upstream.url),
            extra=["--set", f"llmitm_store={db}"],
        ) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-client", max_retries=0)
            drive(client)
            # leaving the block sends SIGTERM at once: the last rows must still reach the disk
        received = httpx.get(f"{upstream.url}/_requests").json()

    assert len(received) == 10
    expected: dict[str, dict[str, list[int]]] = {"endpoint": {}, "model": {}}
    for request in received:
        body = request["body"]
        if body["model"] == QUIET_CHAT_MODEL:
            assert body["stream_options"] == {"include_usage": True}  # llmitm asked for it
        endpoint = "chat-only" if request["api"] == "chat" else "responses-only"
        for by, key in (("endpoint", endpoint), ("model", body["model"])):
            totals = expected[by].setdefault(key, [0, 0, 0, 0, 0])
            for i, value in enumerate((1, *fake_usage(body))):
                totals[i] += value

    for by in ("endpoint", "model"):
        report = usage_json(db, by)
        got = {
            row["key"]: [
                row["requests"], row["input_tokens"], row["cached_tokens"],
                row["output_tokens"], row["reasoning_tokens"],
            ]
            for row in report["rows"]
        }  # fmt: skip
        assert got == expected[by], by
    assert set(expected["model"]) == {
        "r-chat",
        "r-chat-quiet",
        "r-responses",
        "c-responses",
        "c-chat",
        QUIET_CHAT_MODEL,
    }
    # Every number is non-trivial, so a field mapped to the wrong column cannot pass.
    assert all(value > 0 for totals in expected["model"].values() for value in totals)

    by_route = {row["key"]: row["requests"] for row in usage_json(db, "route")["rows"]}
    assert by_route == {"to-chat": 5, "r-*": 5}  # unnamed: its pattern
    per_route: dict[str, int] = defaultdict(int)
    for row in usage_json(db, "day")["rows"]:
        per_route[row["key"]] += row["requests"]
    assert sum(per_route.values()) == 10
