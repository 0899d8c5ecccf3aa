"""Conversation affinity: response-id ownership and conversation fingerprints with TTL and
LRU bounds on a fake clock, the same fingerprint from either API's body, and affinity
yielding to health and caps."""

from __future__ import annotations

from typing import Any

import pytest

from llmitm.routing.affinity import Affinity, TtlLru, fingerprint, prefer
from llmitm.routing.health import Health
from llmitm.routing.limits import Limiter
from llmitm.routing.outcomes import Outcome
from llmitm.routing.strategies import choose

# --- TTL / LRU ----------------------------------------------------------------------------


def test_entries_expire_after_the_ttl() -> None:
    table: TtlLru[str, str] = TtlLru(max_entries=10, ttl=60.0)
    table.put("k", "east", now=0.0)
    assert table.get("k", now=59.9) == "east"
    assert table.get("k", now=60.0) is None
    assert len(table) == 0


def test_putting_again_refreshes_the_ttl_but_reading_does_not() -> None:
    table: TtlLru[str, str] = TtlLru(max_entries=10, ttl=60.0)
    table.put("k", "east", now=0.0)
    table.get("k", now=50.0)
    assert table.get("k", now=61.0) is None
    table.put("k", "east", now=0.0)
    table.put("k", "west", now=50.0)
    assert table.get("k", now=100.0) == "west"


def test_least_recently_used_goes_first() -> None:
    table: TtlLru[str, int] = TtlLru(max_entries=2, ttl=60.0)
    table.put("a", 1, now=0.0)
    table.put("b", 2, now=0.0)
    table.get("a", now=1.0)  # a is now the most recently used
    table.put("c", 3, now=2.0)
    assert table.get("b", now=2.0) is None
    assert table.get("a", now=2.0) == 1 and table.get("c", now=2.0) == 3
    table.discard("a")
    assert len(table) == 1


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        TtlLru(max_entries=0, ttl=1.0)
    with pytest.raises(ValueError):
        TtlLru(max_entries=1, ttl=0.0)


def test_response_owner_beats_the_fingerprint() -> None:
    affinity = Affinity(conversation_ttl=300.0, response_ttl=3600.0)
    affinity.served("east", 0.0, response_id="resp_1", fingerprint="fp")
    affinity.served("west", 1.0, fingerprint="fp")
    assert affinity.owner_of("resp_1", 2.0) == "east"
    assert affinity.endpoint_for(2.0, previous_response_id="resp_1", fingerprint="fp") == "east"
    assert affinity.endpoint_for(2.0, previous_response_id="resp_x", fingerprint="fp") == "west"
    assert affinity.endpoint_for(2.0) is None
    assert affinity.endpoint_for(400.0, fingerprint="fp") is None  # conversation TTL
    assert affinity.owner_of("resp_1", 400.0) == "east"  # response ids live longer


# --- fingerprints -------------------------------------------------------------------------

CHAT_TURN_1: dict[str, Any] = {
    "model": "gpt-5",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Plan a trip to Lisbon."},
    ],
}
CHAT_TURN_2: dict[str, Any] = {
    "model": "gpt-5",
    "messages": [
        *CHAT_TURN_1["messages"],
        {"role": "assistant", "content": "Day 1: Alfama."},
        {"role": "user", "content": "And day 2?"},
    ],
}
RESPONSES_TURN: dict[str, Any] = {
    "model": "gpt-5",
    "instructions": "You are terse.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Plan a trip to Lisbon."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Day 1: Alfama."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "And day 2?"}]},
    ],
}


def test_fingerprint_is_stable_across_turns_and_apis() -> None:
    first = fingerprint(CHAT_TURN_1)
    assert first is not None and len(first) == 32
    assert fingerprint(CHAT_TURN_2) == first
    assert fingerprint(RESPONSES_TURN) == first
    chat_parts = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
            {"role": "user", "content": [{"type": "text", "text": "Plan a trip to Lisbon."}]},
        ]
    }
    assert fingerprint(chat_parts) == first


def test_fingerprint_differs_by_system_text_and_first_message() -> None:
    other_system = {**CHAT_TURN_1, "messages": [{"role": "system", "content": "Be verbose."}]}
    other_system["messages"].append(CHAT_TURN_1["messages"][1])
    assert fingerprint(other_system) != fingerprint(CHAT_TURN_1)
    assert fingerprint({"input": "Plan a trip to Porto."}) != fingerprint({"input": "Plan a trip"})
    assert fingerprint({"input": "hi"}) == fingerprint(
        {"messages": [{"role": "user", "content": "hi"}]}
    )


def test_fingerprint_of_images_matches_across_apis_and_tells_images_apart() -> None:
    def chat(url: str) -> dict[str, Any]:
        return {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ]
        }

    def responses(url: str) -> dict[str, Any]:
        return {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": url},
                    ],
                }
            ]
        }

    assert fingerprint(chat("https://x/cat.png")) == fingerprint(responses("https://x/cat.png"))
    assert fingerprint(chat("https://x/cat.png")) != fingerprint(chat("https://x/dog.png"))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": [{"role": "system", "content": "x"}]},
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
        {"input": 42},
    ],
)
def test_fingerprint_without_a_user_message(body: dict[str, Any]) -> None:
    assert fingerprint(body) is None


def test_fingerprint_skips_junk_items() -> None:
    assert fingerprint({"messages": ["junk", {"role": "user", "content": "hi"}]}) == fingerprint(
        {"input": "hi"}
    )


# --- yielding to health and caps ----------------------------------------------------------


ROUTE = ("east", "west", "openai")


def test_prefer_moves_a_usable_affine_endpoint_first() -> None:
    assert prefer(ROUTE, "openai", lambda _e: True) == ["openai", "east", "west"]
    assert prefer(ROUTE, None, lambda _e: True) == list(ROUTE)
    assert prefer(ROUTE, "elsewhere", lambda _e: True) == list(ROUTE)  # not on this route


def test_affinity_yields_to_health() -> None:
    health = Health()
    health.record("openai", Outcome("connect_error"), now=0.0)
    order = choose("failover", ROUTE, health=health, now=1.0).order
    assert prefer(order, "openai", lambda _e: True) == ["east", "west"]


def test_affinity_yields_to_caps() -> None:
    limiter = Limiter({"openai": 1})
    lease = limiter.try_acquire("openai")
    assert prefer(ROUTE, "openai", limiter.has_room) == list(ROUTE)
    lease.release()  # type: ignore[union-attr]
    assert prefer(ROUTE, "openai", limiter.has_room)[0] == "openai"


def test_required_owner_is_the_only_candidate() -> None:
    assert prefer(("east",), "west", lambda _e: False, required=True) == ["west"]


def test_a_conversation_stays_then_moves_when_its_endpoint_dies() -> None:
    health, affinity, limiter = Health(), Affinity(), Limiter()
    fp = fingerprint(CHAT_TURN_1)

    def route(now: float) -> str:
        order = choose("failover", ROUTE, health=health, now=now).order
        affine = affinity.endpoint_for(now, fingerprint=fp)
        endpoint = prefer(order, affine, limiter.has_room)[0]
        affinity.served(endpoint, now, fingerprint=fp)
        return endpoint

    affinity.served("west", 0.0, fingerprint=fp)
    assert [route(float(t)) for t in range(1, 4)] == ["west"] * 3
    health.record("west", Outcome("connect_error"), now=4.0)
    assert route(4.5) == "east"
    assert route(20.0) == "east"  # the conversation now lives on east, even after recovery
