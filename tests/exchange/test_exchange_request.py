"""What each endpoint is sent, built once in ``exchange``: the header rewrite (the same on
mitmproxy's direct path and on the relay's list of headers), the candidates of a failover
route, the relay's header limit, and the one usage record."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy.http import Headers

from llmitm.exchange.request import (
    PreparedRequest,
    candidate_headers,
    prepare_candidates,
    relayable_headers,
    rewrite_headers,
)
from llmitm.exchange.usage import UsageRecord, usage_record
from llmitm.responses_api.takeover import finished_usage
from llmitm.routing.config import Endpoint
from llmitm.routing.plan import Plan, plan_for_endpoint
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError


def endpoint(name: str = "e", *, key: str | None = "sk-endpoint") -> Endpoint:
    return Endpoint(
        name=name,
        kind="compatible",
        base_url=f"http://127.0.0.1:9/{name}/v1",
        apis=frozenset({"chat"}),
        api_key_env="KEY" if key else None,
        api_key=key,
        headers={"x-team": "llm"},
    )


NAMES = st.sampled_from(
    ["authorization", "Authorization", "api-key", "x-api-key", "x-team", "content-type", "x-a"]
)
CLIENT_HEADERS = st.lists(
    st.tuples(NAMES, st.text("abcdef0123", min_size=1, max_size=8)), max_size=8
)


def as_headers(pairs: list[tuple[str, str]]) -> Headers:
    return Headers([(name.encode(), value.encode()) for name, value in pairs])


@given(client=CLIENT_HEADERS, keyed=st.booleans())
def test_the_direct_rewrite_and_the_relayed_headers_agree(
    client: list[tuple[str, str]], keyed: bool
) -> None:
    """Whatever the client sent, mitmproxy's request and the relay's carry the same
    headers: the endpoint's credentials and headers, none of the client's it replaces."""
    plan = plan_for_endpoint(endpoint(key="sk-endpoint" if keyed else None), "chat", "m")
    headers = as_headers(client)
    rewrite_headers(headers, plan)
    relayed = candidate_headers(client, plan)
    assert sorted((k.lower(), v) for k, v in headers.items(multi=True)) == sorted(
        (k.lower(), v) for k, v in relayed
    )
    assert headers["accept-encoding"] == "identity"
    assert headers["x-team"] == "llm"
    if keyed:
        assert headers["authorization"] == "Bearer sk-endpoint"
        assert "api-key" not in headers and "x-api-key" not in headers


def test_a_new_body_drops_the_clients_content_encoding() -> None:
    plan = plan_for_endpoint(endpoint(), "chat", "m")
    kept = as_headers([("content-encoding", "gzip")])
    rewrite_headers(kept, plan)
    assert kept["content-encoding"] == "gzip"
    dropped = as_headers([("content-encoding", "gzip")])
    rewrite_headers(dropped, plan, new_body=True)
    assert "content-encoding" not in dropped


def test_the_relay_carries_no_hop_by_hop_or_encoding_header_and_refuses_a_huge_head() -> None:
    sent = [("connection", "keep-alive"), ("accept-encoding", "gzip"), ("x-a", "1")]
    kept = relayable_headers(sent, hop_by_hop=frozenset({"connection"}), head_limit=100, slack=0)
    assert kept == [("x-a", "1")]
    with pytest.raises(TranslationError) as raised:
        relayable_headers([("x-a", "v" * 90)], hop_by_hop=frozenset(), head_limit=2048, slack=2000)
    assert raised.value.status == 431 and "2 KiB" in str(raised.value)


def prepared(content: bytes) -> PreparedRequest:
    return PreparedRequest(content, TranslationContext(options=TranslateOptions()), False)


def test_every_candidate_that_can_take_the_request_gets_its_own_request() -> None:
    def prepare(name: str) -> tuple[Plan, PreparedRequest]:
        if name == "bad":
            raise TranslationError("cannot", code="nope")
        return plan_for_endpoint(endpoint(name), "chat", "m"), prepared(name.encode())

    candidates = prepare_candidates(["a", "bad", "b"], prepare, [("authorization", "Bearer c")])
    assert list(candidates) == ["a", "b"]
    assert candidates["b"].prepared.content == b"b"
    assert ("authorization", "Bearer sk-endpoint") in candidates["a"].headers
    assert ("authorization", "Bearer c") not in candidates["a"].headers


def test_when_no_candidate_can_take_it_the_first_refusal_is_the_answer() -> None:
    def prepare(name: str) -> tuple[Plan, PreparedRequest]:
        raise TranslationError(f"{name} cannot", code="nope")

    with pytest.raises(TranslationError, match="first cannot"):
        prepare_candidates(["first", "second"], prepare, [])


def test_the_usage_record_is_one_shape_for_flows_and_background_runs() -> None:
    at = datetime(2026, 1, 2, tzinfo=UTC)
    assert usage_record((10, 2, 5, 1), endpoint="e", model="m", route="r", at=at) == UsageRecord(
        at=at,
        endpoint="e",
        model="m",
        route="r",
        input_tokens=10,
        cached_tokens=2,
        output_tokens=5,
        reasoning_tokens=1,
    )
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 15,
    }
    finished = finished_usage(
        {"status": "completed", "usage": usage}, endpoint="e", model="m", route="r"
    )
    assert finished is not None and finished == usage_record(
        (10, 2, 5, 1), endpoint="e", model="m", route="r", at=finished.at
    )
    running = {"status": "in_progress", "usage": usage}
    assert finished_usage(running, endpoint="e", model="m", route="r") is None
