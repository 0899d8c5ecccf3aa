"""The endpoint keys that ask for a reasoning rendering on same-API streams:
``reasoning_passthrough`` (chat clients) and ``reasoning_summary`` (Responses clients).

Either one sends the endpoint's streams of that API through the normaliser, also on an
endpoint that is trusted (``openai``/``azure``, or ``conformant``), since the rendering needs
it; unset, the plan is what it was.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmitm.routing.config import ConfigError, parse_config
from llmitm.routing.plan import plan_for_endpoint


def endpoint(**keys: Any) -> Any:
    raw = {"endpoints": {"e": {"base_url": "https://h/v1", "apis": ["chat", "responses"], **keys}}}
    return parse_config(raw, "llmitm.toml", {}).endpoints["e"]


@pytest.mark.parametrize("mode", ["think-tags", "reasoning_content", "reasoning", "drop"])
def test_reasoning_passthrough_is_read_and_normalises_trusted_chat_streams(mode: str) -> None:
    trusted = endpoint(kind="openai", reasoning_passthrough=mode)
    assert trusted.reasoning_passthrough == mode
    assert plan_for_endpoint(trusted, "chat", "m").stream_direction == "normalise-chat"
    # Only chat: the Responses streams of the same endpoint stay as they were.
    assert plan_for_endpoint(trusted, "responses", "m").stream_direction is None


def test_a_rendering_wins_over_conformant() -> None:
    config = endpoint(kind="compatible", conformant=["chat"], reasoning_passthrough="drop")
    assert plan_for_endpoint(config, "chat", "m").stream_direction == "normalise-chat"


def test_reasoning_summary_normalises_trusted_responses_streams() -> None:
    trusted = endpoint(kind="openai", reasoning_summary=True)
    assert trusted.reasoning_summary is True
    assert plan_for_endpoint(trusted, "responses", "m").stream_direction == "normalise-responses"
    assert plan_for_endpoint(trusted, "chat", "m").stream_direction is None


def test_unset_keys_change_nothing() -> None:
    plain = endpoint(kind="openai")
    assert (plain.reasoning_passthrough, plain.reasoning_summary) == (None, False)
    assert plan_for_endpoint(plain, "chat", "m").stream_direction is None
    assert plan_for_endpoint(plain, "responses", "m").stream_direction is None


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"reasoning_passthrough": "tags"}, "endpoints.e.reasoning_passthrough"),
        ({"reasoning_passthrough": True}, "endpoints.e.reasoning_passthrough"),
        ({"reasoning_summary": "yes"}, "endpoints.e.reasoning_summary"),
    ],
)
def test_a_bad_value_names_the_key(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        endpoint(kind="compatible", **keys)
