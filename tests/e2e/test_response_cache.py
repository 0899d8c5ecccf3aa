"""The response cache for live traffic (issue 19), through a real llmitm process with the
openai SDK as client and fake upstreams that count what reaches them: a repeated request is
answered from the cache (the upstream's count does not move) in the client's own API, streamed
or not, translated or not; TTLs and ``max_entries`` bound it; a request opts in or out by
header or ``extra_body``; errors, 429s and cut streams are never kept; another credential never
gets a cached answer; hits are marked in the answer, the metrics and the usage records.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

from .processes import LLMITM, Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.both]
kind = "compatible"
base_url = "{both}/v1"
apis = ["chat", "responses"]

[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[[routes]]
name = "cached"
models = ["cached-*"]
endpoints = ["both"]
cache = {{ ttl = "1h" }}

[[routes]]
name = "translated"
models = ["over-chat*"]
endpoints = ["chat-only"]
cache = true

[[routes]]
name = "short"
models = ["short-*"]
endpoints = ["both"]
cache = {{ ttl = "1s" }}

[[routes]]
name = "small"
models = ["small-*"]
endpoints = ["both"]
cache = {{ max_entries = 2 }}

[[routes]]
name = "failover"
models = ["failover-*"]
endpoints = ["chat-only", "both"]
cache = true

[[routes]]
name = "shared"
models = ["shared-*"]
endpoints = ["chat-only"]
cache = {{ scope = "shared" }}

[[routes]]
name = "plain"
models = ["plain-*"]
endpoints = ["both"]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream, Upstream]]:
    tmp = tmp_path_factory.mktemp("cache")
    with (
        fake_upstream(tmp, "chat,responses") as both,
        fake_upstream(tmp, "chat") as chat,
        llmitm_proxy(tmp, config=CONFIG.format(both=both.url, chat=chat.url)) as proxy,
    ):
        yield proxy, both, chat


def sdk(proxy: Proxy, key: str = "sk-alice", **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=proxy.base_url(), api_key=key, max_retries=0, default_headers=headers or None
    )


def upstream_requests(upstream: Upstream) -> list[dict[str, Any]]:
    return httpx.get(upstream.url + "/_requests", timeout=5).json()


def count(upstream: Upstream) -> int:
    return len(upstream_requests(upstream))


def chat(client: openai.OpenAI, model: str, text: str, **kwargs: Any) -> tuple[str | None, Any]:
    """One non-streamed chat call: its ``x-llmitm-cache`` header and the completion."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], **kwargs
    )
    return raw.headers.get("x-llmitm-cache"), raw.parse()


def test_chat_repeat_is_a_hit_with_usage_marked_cached(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    before = count(both)
    first_header, first = chat(client, "cached-a", "chat, not streamed")
    second_header, second = chat(client, "cached-a", "chat, not streamed")
    assert (first_header, second_header) == ("miss", "hit")
    assert count(both) == before + 1
    assert second.id == first.id
    assert second.choices[0].message.content == first.choices[0].message.content
    assert first.usage.prompt_tokens > 0
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
    assert second.usage.completion_tokens == first.usage.completion_tokens


def test_chat_stream_is_cached_apart_from_the_unstreamed_call(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    chat(client, "cached-a", "chat, streamed")  # the same messages, not streamed
    before = count(both)
    texts, headers = [], []
    for _ in range(2):
        with client.chat.completions.with_streaming_response.create(
            model="cached-a",
            messages=[{"role": "user", "content": "chat, streamed"}],
            stream=True,
            stream_options={"include_usage": True},
        ) as raw:
            headers.append(raw.headers.get("x-llmitm-cache"))
            chunks = list(raw.parse())
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
        usage = chunks[-1].usage
    assert headers == ["miss", "hit"]
    assert count(both) == before + 1  # the streamed call's key is not the unstreamed one's
    assert texts[0] == texts[1] == "Hello from the fake upstream."
    assert usage is not None and usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens
    # The SDK's own stream helper accepts the cached stream.
    with client.chat.completions.stream(
        model="cached-a",
        messages=[{"role": "user", "content": "chat, streamed"}],
        stream_options={"include_usage": True},
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == texts[0]
    assert count(both) == before + 1


@pytest.mark.parametrize(("model", "upstream_index"), [("cached-r", 1), ("over-chat-r", 2)])
def test_responses_client_hits_streamed_and_not_native_and_translated(
    stack: tuple[Proxy, Upstream, Upstream], model: str, upstream_index: int
) -> None:
    proxy = stack[0]
    upstream = stack[upstream_index]
    client = sdk(proxy)
    before = count(upstream)
    first = client.responses.with_raw_response.create(model=model, input="responses, whole")
    second = client.responses.with_raw_response.create(model=model, input="responses, whole")
    assert [r.headers.get("x-llmitm-cache") for r in (first, second)] == ["miss", "hit"]
    one, two = first.parse(), second.parse()
    assert two.output_text == one.output_text and two.id == one.id
    assert two.usage.input_tokens_details.cached_tokens == one.usage.input_tokens
    finals = []
    for _ in range(2):
        with client.responses.stream(model=model, input="responses, streamed") as stream:
            finals.append(stream.get_final_response())
    assert finals[0].output_text == finals[1].output_text == "Hello from the fake upstream."
    assert finals[1].usage.input_tokens_details.cached_tokens == finals[1].usage.input_tokens
    assert count(upstream) == before + 2


def test_a_failover_route_s_relayed_stream_is_kept_and_served(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, _both, chat_only = stack
    client = sdk(proxy)
    before = count(chat_only)
    texts, headers = [], []
    for _ in range(2):
        with client.chat.completions.with_streaming_response.create(
            model="failover-a",
            messages=[{"role": "user", "content": "through the relay"}],
            stream=True,
        ) as raw:
            headers.append(raw.headers.get("x-llmitm-cache"))
            chunks = list(raw.parse())
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert headers == ["miss", "hit"]
    assert texts[0] == texts[1] == "Hello from the fake upstream."
    assert count(chat_only) == before + 1


def test_ttl_expiry(stack: tuple[Proxy, Upstream, Upstream]) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    before = count(both)
    assert chat(client, "short-a", "ttl")[0] == "miss"
    assert chat(client, "short-a", "ttl")[0] == "hit"
    time.sleep(1.2)  # the route's ttl is 1 s
    assert chat(client, "short-a", "ttl")[0] == "miss"
    assert count(both) == before + 2


def test_a_request_ttl_outlives_the_route_s(stack: tuple[Proxy, Upstream, Upstream]) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    before = count(both)
    chat(client, "short-a", "long ttl", extra_headers={"x-llmitm-cache": "use; ttl=1h"})
    time.sleep(1.2)
    assert chat(client, "short-a", "long ttl")[0] == "hit"
    assert count(both) == before + 1


def test_max_entries_evicts_the_least_recently_used(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    before = count(both)
    for text in ("one", "two"):
        assert chat(client, "small-a", text)[0] == "miss"
    assert chat(client, "small-a", "one")[0] == "hit"  # "one" is now the most recent
    assert chat(client, "small-a", "three")[0] == "miss"  # evicts "two"
    assert chat(client, "small-a", "one")[0] == "hit"
    assert chat(client, "small-a", "two")[0] == "miss"
    assert count(both) == before + 4


def test_opt_in_on_a_route_without_cache_by_header_and_extra_body(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    before = count(both)
    assert chat(client, "plain-a", "no cache")[0] is None
    assert chat(client, "plain-a", "no cache")[0] is None
    assert count(both) == before + 2
    use = {"x-llmitm-cache": "use"}
    assert chat(client, "plain-a", "by header", extra_headers=use)[0] == "miss"
    assert chat(client, "plain-a", "by header", extra_headers=use)[0] == "hit"
    assert chat(client, "plain-a", "by header")[0] is None  # did not ask: not read
    assert count(both) == before + 4
    field = {"llmitm": {"cache": "use"}}
    assert chat(client, "plain-a", "by body", extra_body=field)[0] == "miss"
    assert chat(client, "plain-a", "by body", extra_body=field)[0] == "hit"
    assert count(both) == before + 5
    sent = upstream_requests(both)[-1]
    assert "llmitm" not in sent["body"] and "x-llmitm-cache" not in {
        k.lower() for k in sent.get("headers", {})
    }


def test_opt_out_and_refresh_on_a_cached_route(stack: tuple[Proxy, Upstream, Upstream]) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    before = count(both)
    chat(client, "cached-b", "opt out")
    assert chat(client, "cached-b", "opt out", extra_headers={"x-llmitm-cache": "skip"})[0] == (
        "skip"
    )
    refresh = {"llmitm": {"cache": {"mode": "refresh"}}}
    assert chat(client, "cached-b", "opt out", extra_body=refresh)[0] == "refresh"
    assert chat(client, "cached-b", "opt out", extra_body={"llmitm": {"cache": False}})[0] == (
        "skip"
    )
    assert chat(client, "cached-b", "opt out")[0] == "hit"
    assert count(both) == before + 4  # the first call, skip, refresh, skip
    assert all("llmitm" not in r["body"] for r in upstream_requests(both)[before:])


@pytest.mark.parametrize(
    ("scenario", "stream"),
    [
        ("text;status=429;retry_after=0", False),
        ("text;status=500", False),
        ("error-midstream", True),
        ("text;events=6;disconnect_after=3", True),
    ],
)
def test_errors_429s_and_cut_streams_are_never_kept(
    stack: tuple[Proxy, Upstream, Upstream], scenario: str, stream: bool
) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy, **{"x-fake-scenario": scenario})
    before = count(both)
    text = f"never kept: {scenario}"
    for _ in range(2):
        with pytest.raises(openai.APIError):
            if stream:
                for _chunk in client.chat.completions.create(
                    model="cached-e", messages=[{"role": "user", "content": text}], stream=True
                ):
                    pass
            else:
                chat(client, "cached-e", text)
    assert count(both) == before + 2


def test_another_credential_misses(stack: tuple[Proxy, Upstream, Upstream]) -> None:
    proxy, both, _chat = stack
    alice, bob = sdk(proxy, "sk-alice"), sdk(proxy, "sk-bob")
    before = count(both)
    assert chat(alice, "cached-c", "whose")[0] == "miss"
    assert chat(bob, "cached-c", "whose")[0] == "miss"
    assert chat(alice, "cached-c", "whose")[0] == "hit"
    assert chat(bob, "cached-c", "whose")[0] == "hit"
    assert count(both) == before + 2


def test_a_shared_route_serves_every_credential_but_sealed_reasoning(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, _both, chat_only = stack
    alice, bob = sdk(proxy, "sk-alice"), sdk(proxy, "sk-bob")
    before = count(chat_only)
    assert chat(alice, "shared-a", "for everyone")[0] == "miss"
    assert chat(bob, "shared-a", "for everyone")[0] == "hit"
    assert count(chat_only) == before + 1
    # Reasoning llmitm seals into encrypted_content for a stateless Responses client over a
    # chat upstream belongs to the credential it was sealed for, shared route or not.
    alice, bob = (
        sdk(proxy, key, **{"x-fake-scenario": "reasoning"}) for key in ("sk-alice", "sk-bob")
    )
    sealed = {"store": False, "include": ["reasoning.encrypted_content"]}
    calls = [
        (who, who.responses.with_raw_response.create(model="shared-r", input="sealed", **sealed))
        for who in (alice, bob, alice)
    ]
    assert [raw.headers.get("x-llmitm-cache") for _, raw in calls] == ["miss", "miss", "hit"]
    reasoning = [item for item in calls[0][1].parse().output if item.type == "reasoning"]
    assert reasoning and reasoning[0].encrypted_content
    assert count(chat_only) == before + 3


def test_a_bad_cache_request_is_an_openai_400(stack: tuple[Proxy, Upstream, Upstream]) -> None:
    proxy, both, _chat = stack
    client = sdk(proxy)
    before = count(both)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, "cached-d", "bad", extra_headers={"x-llmitm-cache": "sometimes"})
    assert caught.value.code == "invalid_cache_request"
    assert "x-llmitm-cache" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, "cached-d", "bad", extra_body={"llmitm": {"cache": {"ttl": "forever"}}})
    assert "llmitm.cache" in caught.value.message
    assert count(both) == before


def test_hits_are_marked_in_metrics_and_usage(
    stack: tuple[Proxy, Upstream, Upstream], tmp_path: Path
) -> None:
    proxy, _both, _chat = stack
    client = sdk(proxy)
    for _ in range(2):
        chat(client, "cached-m", "accounted")
    metrics = httpx.get(proxy.base_url().removesuffix("/v1") + "/_llmitm/metrics", timeout=5).text
    assert 'llmitm_endpoint="cache"' in metrics
    hits = [line for line in metrics.splitlines() if line.startswith("llmitm_cache_hits")]
    assert hits and float(hits[0].split()[-1]) >= 1
    db = proxy.log.parent / "llmitm.db"
    deadline = time.monotonic() + 10
    while True:
        result = subprocess.run(
            [str(LLMITM), "usage", "--db", str(db), "--json", "--by", "endpoint"],
            capture_output=True,
            timeout=30,
        )
        rows = {row["key"]: row for row in orjson.loads(result.stdout)["rows"]}
        if "cache" in rows or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    cached = rows["cache"]
    assert cached["requests"] >= 1
    assert cached["cached_tokens"] == cached["input_tokens"] > 0
