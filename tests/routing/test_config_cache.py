"""A route's ``cache`` key: a table of ttl, max_entries and scope (or ``true`` / ``false``),
durations in the forms the docs name, and every mistake a ConfigError naming the file and the
key."""

from __future__ import annotations

from typing import Any

import pytest

from llmitm.routing.config import CacheSettings, ConfigError, parse_config, parse_duration


def config(cache: Any) -> dict[str, Any]:
    return {
        "endpoints": {"e": {"kind": "compatible", "base_url": "http://127.0.0.1:1/v1"}},
        "routes": [{"endpoints": ["e"], "cache": cache}],
    }


def route_cache(cache: Any) -> CacheSettings | None:
    return parse_config(config(cache), "conf/llmitm.toml", {}).routes[0].cache


def test_a_table_sets_each_key_and_defaults_the_rest() -> None:
    assert route_cache({"ttl": "30m", "max_entries": 5, "scope": "shared"}) == CacheSettings(
        ttl=1800.0, max_entries=5, scope="shared"
    )
    assert route_cache({}) == CacheSettings()
    assert route_cache(True) == CacheSettings(ttl=3600.0, max_entries=1000, scope="credential")
    assert route_cache(False) is None
    raw = config(None)
    del raw["routes"][0]["cache"]
    assert parse_config(raw, "f", {}).routes[0].cache is None


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("1h", 3600.0), ("30m", 1800.0), ("45s", 45.0), ("500ms", 0.5), ("2d", 172800.0),
     ("1.5h", 5400.0), (" 10 s ", 10.0), (90, 90.0), (0.25, 0.25), ("7", 7.0)],
)  # fmt: skip
def test_durations(given: Any, seconds: float) -> None:
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("given", ["", "1w", "h", "-1s", "0", 0, -3, True, None, "1h30m"])
def test_what_is_no_duration(given: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(given)


@pytest.mark.parametrize(
    ("cache", "key", "expected"),
    [
        ({"ttl": "soon"}, "routes[0].cache.ttl", "a duration"),
        ({"ttl": 0}, "routes[0].cache.ttl", "a duration"),
        ({"max_entries": 0}, "routes[0].cache.max_entries", "an integer >= 1"),
        ({"max_entries": "10"}, "routes[0].cache.max_entries", "an integer >= 1"),
        ({"scope": "everyone"}, "routes[0].cache.scope", "one of credential, shared"),
        ({"size": 3}, "routes[0].cache.size", "unknown key"),
        ("1h", "routes[0].cache", "a table"),
    ],
)
def test_mistakes_name_the_file_and_the_key(cache: Any, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config(cache), "conf/llmitm.toml", {})
    message = str(info.value)
    assert message.startswith(f"conf/llmitm.toml: {key}: "), message
    assert expected in message
