"""The response cache's sans-IO core: what a request asks, the keys, which answers may be
kept, how a hit's usage is marked, and the bounded store of answers on an injected clock.

Answers come from the fake upstream (both APIs, streamed and not, complete, failed and cut)
and the marked ones are read back with the openai SDK's own types."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from llmitm.replay import cache
from llmitm.replay.cache import CacheRequestError, Directive, Entry, ResponseCache
from llmitm.routing.config import CacheSettings
from llmitm.testing.fake_upstream import serve_in_thread
from llmitm.wire.sse import SSEDecoder

# --- what a request asks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "directive"),
    [
        ("use", Directive("use")),
        ("SKIP", Directive("skip")),
        ("refresh", Directive("refresh")),
        ("use; ttl=10m", Directive("use", 600.0)),
        ("refresh, ttl=30s", Directive("refresh", 30.0)),
        ("ttl=2h", Directive("use", 7200.0)),
        ("", Directive("use")),
    ],
)
def test_header(header: str, directive: Directive) -> None:
    assert cache.parse_header(header) == directive


@pytest.mark.parametrize("header", ["maybe", "use; skip", "use; ttl=", "use; ttl=soon", "x=1"])
def test_bad_header_names_it(header: str) -> None:
    with pytest.raises(CacheRequestError, match="x-llmitm-cache"):
        cache.parse_header(header)


@pytest.mark.parametrize(
    ("field", "directive"),
    [
        ({"cache": "use"}, Directive("use")),
        ({"cache": True}, Directive("use")),
        ({"cache": False}, Directive("skip")),
        ({"cache": "refresh"}, Directive("refresh")),
        ({"cache": {"ttl": "5m"}}, Directive("use", 300.0)),
        ({"cache": {"mode": "refresh", "ttl": 60}}, Directive("refresh", 60.0)),
        ({}, None),
    ],
)
def test_body_field(field: Any, directive: Directive | None) -> None:
    assert cache.parse_field(field) == directive


@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("use", '"llmitm"'),
        ({"cach": "use"}, "unknown key(s) cach"),
        ({"cache": "sometimes"}, '"llmitm.cache"'),
        ({"cache": {"mode": "later"}}, '"llmitm.cache"'),
        ({"cache": {"ttl": "forever"}}, '"llmitm.cache".ttl'),
        ({"cache": 3}, '"llmitm.cache"'),
    ],
)
def test_bad_body_field_names_it(field: Any, named: str) -> None:
    with pytest.raises(CacheRequestError) as info:
        cache.parse_field(field)
    assert named in str(info.value)


def test_strip_field_removes_only_the_llmitm_field() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert cache.strip_field(orjson.dumps(body)) is None
    assert cache.strip_field(b'not json but names "llmitm"') is None
    mentioned = {**body, "messages": [{"role": "user", "content": 'say "llmitm"'}]}
    assert cache.strip_field(orjson.dumps(mentioned)) is None  # in a value, not a field
    stripped = cache.strip_field(orjson.dumps({**body, "llmitm": {"cache": "use"}}))
    assert stripped is not None
    content, value = stripped
    assert orjson.loads(content) == body and value == {"cache": "use"}


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_large_body_s_field_is_found_at_its_edges(where: str) -> None:
    history = [{"role": "user", "content": "x" * 1000} for _ in range(600)]  # ~0.6 MB
    body: dict[str, Any] = {"model": "m", "messages": history}
    body = {"llmitm": {"cache": "use"}, **body} if where == "first" else {**body, "llmitm": {}}
    content = orjson.dumps(body)
    assert len(content) > cache.WHOLE_SCAN
    stripped = cache.strip_field(content)
    assert stripped is not None and "llmitm" not in orjson.loads(stripped[0])


def test_decide() -> None:
    route = CacheSettings(ttl=60.0, max_entries=3)
    assert cache.decide(None, None) is None
    assert cache.decide(None, Directive("skip")) is None
    on = cache.decide(route, None)
    assert on is not None and (on.read, on.write, on.ttl, on.label) == (True, True, 60.0, "miss")
    opted_in = cache.decide(None, Directive("use", 5.0))
    assert opted_in is not None and opted_in.settings == CacheSettings() and opted_in.ttl == 5.0
    refresh = cache.decide(route, Directive("refresh"))
    assert refresh is not None and (refresh.read, refresh.write, refresh.label) == (
        False,
        True,
        "refresh",
    )
    skip = cache.decide(route, Directive("skip"))
    assert skip is not None and (skip.read, skip.write, skip.label) == (False, False, "skip")


def test_background_and_conversation_requests_are_refused() -> None:
    assert cache.refusal({"model": "m", "background": True}) is not None
    assert cache.refusal({"model": "m", "conversation": "conv_1"}) is not None
    assert cache.refusal({"model": "m", "conversation": {"id": "conv_1"}}) is not None
    assert cache.refusal(["not", "an", "object"]) is not None
    assert cache.refusal({"model": "m", "background": False, "conversation": None}) is None


# --- keys ---------------------------------------------------------------------------------


def key(body: dict[str, Any], *, path: str = "/v1/chat/completions", **where: Any) -> str:
    settings = where.pop("settings", CacheSettings())
    match = cache.request_key("POST", path, [], orjson.dumps(body), "api.example")
    return cache.cache_key(
        match, where.get("route", "r"), "api.example", where.get("who", "hmac:a"), settings
    )


BASE = {"model": "m", "messages": [{"role": "user", "content": "What happened on 2024-05-01?"}]}


def test_every_value_counts_but_what_cannot_change_the_answer() -> None:
    same = key(BASE)
    other_date = {**BASE, "messages": [{"role": "user", "content": "What happened on 2024-05-02?"}]}
    assert key(other_date) != same  # replay's placeholders would make these one request
    assert key({**BASE, "stream": True}) != same
    assert key({**BASE, "stream": True, "stream_options": {"include_usage": True}}) != key(
        {**BASE, "stream": True}
    )
    assert key({**BASE, "temperature": 0.5}) != same
    for volatile in ("user", "metadata", "safety_identifier", "prompt_cache_key"):
        assert key({**BASE, volatile: "anything"}) == same
    assert key(BASE, path="/v1/responses") != same


def test_the_key_is_the_credential_s_unless_shared() -> None:
    assert key(BASE, who="hmac:a") != key(BASE, who="hmac:b")
    assert key(BASE, who=None) != key(BASE, who="hmac:a")
    shared = CacheSettings(scope="shared")
    assert key(BASE, who="hmac:a", settings=shared) == key(BASE, who="hmac:b", settings=shared)
    assert key(BASE, route="r1") != key(BASE, route="r2")


def test_a_shared_route_keeps_sealed_answers_under_the_credential_s_key() -> None:
    match = cache.request_key("POST", "/v1/responses", [], orjson.dumps(BASE), "h")
    shared = CacheSettings(scope="shared")
    everyone, alice = cache.cache_keys(match, "r", "h", "hmac:a", shared)
    _, bob = cache.cache_keys(match, "r", "h", "hmac:b", shared)
    assert everyone == cache.cache_keys(match, "r", "h", "hmac:b", shared)[0]
    assert len({everyone, alice, bob}) == 3
    assert cache.cache_keys(match, "r", "h", "hmac:a", CacheSettings()) == (alice, alice)


# --- answers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[str]:
    with serve_in_thread() as upstream:
        yield upstream.base_url


def fetch(base: str, api: str, stream: bool, scenario: str = "text") -> tuple[int, bytes]:
    path = "/chat/completions" if api == "chat" else "/responses"
    body: dict[str, Any] = {"model": "m", "stream": stream}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
        if stream:
            body["stream_options"] = {"include_usage": True}
    else:
        body["input"] = "hi"
    try:
        response = httpx.post(
            base + path, json=body, headers={"x-fake-scenario": scenario}, timeout=10
        )
        return response.status_code, response.content
    except httpx.RemoteProtocolError:
        return 200, b""  # cut before the end: nothing complete arrived


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_complete_answers_are_kept_and_failed_ones_not(fake: str, api: str, stream: bool) -> None:
    assert cache.answer_complete(api, stream, *fetch(fake, api, stream))
    assert cache.answer_complete(api, stream, *fetch(fake, api, stream, "tools-parallel"))
    for failed in ("text;status=429", "text;status=500", "error-midstream"):
        assert not cache.answer_complete(api, stream, *fetch(fake, api, stream, failed))
    if api == "responses":  # an incomplete Response is not the answer a request wanted
        assert not cache.answer_complete(api, stream, *fetch(fake, api, stream, "length"))
    if stream:
        status, body = fetch(fake, api, stream, "text;events=12")
        cut = body[: len(body) // 2]
        assert not cache.answer_complete(api, stream, status, cut)


def events(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    found = [*decoder.feed(body), *decoder.close()]
    return [orjson.loads(data) for _name, data in found if data != b"[DONE]"]


def test_marked_chat_usage(fake: str) -> None:
    _, whole = fetch(fake, "chat", False)
    marked = ChatCompletion.model_validate_json(cache.marked_body(False, whole))
    original = ChatCompletion.model_validate_json(whole)
    assert marked.usage is not None and original.usage is not None
    assert marked.usage.prompt_tokens_details is not None
    assert marked.usage.prompt_tokens_details.cached_tokens == original.usage.prompt_tokens > 0
    assert marked.usage.completion_tokens == original.usage.completion_tokens
    assert marked.choices == original.choices
    _, stream = fetch(fake, "chat", True)
    chunks = [
        ChatCompletionChunk.model_validate(e) for e in events(cache.marked_body(True, stream))
    ]
    before = [ChatCompletionChunk.model_validate(e) for e in events(stream)]
    assert [c.choices for c in chunks] == [c.choices for c in before]
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens
    assert cache.marked_body(True, stream).endswith(b"data: [DONE]\n\n")


def test_marked_responses_usage(fake: str) -> None:
    _, whole = fetch(fake, "responses", False)
    marked = Response.model_validate_json(cache.marked_body(False, whole))
    assert marked.usage is not None
    assert marked.usage.input_tokens_details.cached_tokens == marked.usage.input_tokens > 0
    _, stream = fetch(fake, "responses", True)
    found = events(cache.marked_body(True, stream))
    assert [e["type"] for e in found] == [e["type"] for e in events(stream)]
    done = Response.model_validate(found[-1]["response"])
    assert done.usage is not None
    assert done.usage.input_tokens_details.cached_tokens == done.usage.input_tokens


def test_a_body_without_usage_is_left_as_it_is() -> None:
    body = b'data: {"id":"c","choices":[{"delta":{"content":"x"},"index":0}]}\n\ndata: [DONE]\n\n'
    assert cache.marked_body(True, body) is body


def test_sealed_reasoning_is_private() -> None:
    assert cache.holds_sealed_reasoning(b'{"output":[{"encrypted_content":"gAAA"}]}')
    assert not cache.holds_sealed_reasoning(b'{"output":[]}')


# --- the store ----------------------------------------------------------------------------


def entry(expires: float, *, credential: str | None = "hmac:a", private: bool = False) -> Entry:
    return Entry(200, [], b"{}", expires, credential=credential, private=private)


def test_ttl_on_an_injected_clock() -> None:
    store = ResponseCache()
    store.put("r", "k", entry(expires=10.0), max_entries=5)
    assert store.get("r", ["k"], "hmac:a", now=9.99) is not None
    assert store.get("r", ["k"], "hmac:a", now=10.0) is None
    assert len(store) == 0 and store.stats.expired == 1
    assert (store.stats.hits, store.stats.misses) == (1, 1)


def test_max_entries_per_route_evicts_the_least_recently_used() -> None:
    store = ResponseCache()
    for name in ("a", "b", "c"):
        store.put("r", name, entry(100.0), max_entries=3)
    store.put("other", "x", entry(100.0), max_entries=1)
    assert store.get("r", ["a"], "hmac:a", now=0) is not None  # "a" is now the most recent
    store.put("r", "d", entry(100.0), max_entries=3)
    assert store.get("r", ["b"], "hmac:a", now=0) is None
    assert all(store.get("r", [n], "hmac:a", now=0) is not None for n in ("a", "c", "d"))
    assert store.get("other", ["x"], "hmac:a", now=0) is not None  # another route's bound
    assert len(store) == 4 and store.stats.evicted == 1


def test_private_entries_are_their_credential_s_only() -> None:
    store = ResponseCache()
    store.put("r", "k", entry(100.0, credential="hmac:a", private=True), max_entries=5)
    assert store.get("r", ["k"], "hmac:b", now=0) is None
    assert store.get("r", ["k"], None, now=0) is None
    assert store.get("r", ["k"], "hmac:a", now=0) is not None
    store.put("r", "p", entry(100.0, credential="hmac:a"), max_entries=5)
    assert store.get("r", ["p"], "hmac:b", now=0) is not None  # a shared key, nothing sealed
    # Tried in order, one hit or miss counted per lookup.
    before = (store.stats.hits, store.stats.misses)
    assert store.get("r", ["nothing", "p"], "hmac:b", now=0) is not None
    assert store.get("r", ["nothing", "else"], "hmac:b", now=0) is None
    assert (store.stats.hits, store.stats.misses) == (before[0] + 1, before[1] + 1)
