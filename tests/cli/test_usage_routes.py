"""``llmitm usage --by route`` tells unnamed routes apart by their pattern: two configurations
whose first route has no name no longer merge into one ``routes[0]`` row. The route label
comes from the config's parser and the router's plan, the rows from the real SQLite store,
the report from ``llmitm``'s ``main``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from llmitm.cli import main
from llmitm.exchange.usage import UsageRecord
from llmitm.routing.config import parse_config
from llmitm.routing.plan import plan_request
from llmitm.store import SqliteStore

ENDPOINTS = {"endpoints": {"e": {"kind": "openai", "base_url": "https://h"}}}
LAPTOP = {**ENDPOINTS, "routes": [{"models": ["gpt-*"], "endpoints": ["e"]}]}
FLEET = {
    **ENDPOINTS,
    "routes": [
        {"models": ["o3", "o4-*"], "hosts": ["*.azure.com"], "endpoints": ["e"]},
        {"name": "rest", "endpoints": ["e"]},
    ],
}


def routed(raw: dict[str, object], model: str, host: str) -> str:
    plan = plan_request(parse_config(raw, "f", {}), "chat", model, host)
    assert plan is not None
    return plan.route


def test_unnamed_routes_are_named_by_their_pattern_and_named_ones_by_name() -> None:
    assert routed(LAPTOP, "gpt-5", "api.openai.com") == "gpt-*"
    assert routed(FLEET, "o3", "x.azure.com") == "o3,o4-* @ *.azure.com"
    assert routed(FLEET, "gpt-5", "api.openai.com") == "rest"
    # The config's own name for the route (client keys refer to it) stays as it was.
    assert parse_config(LAPTOP, "f", {}).routes[0].name == "routes[0]"


def test_usage_by_route_keeps_two_configs_unnamed_routes_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "usage.db"
    calls = [
        (routed(LAPTOP, "gpt-5", "api.openai.com"), 100),
        (routed(LAPTOP, "gpt-4.1", "api.openai.com"), 10),
        (routed(FLEET, "o3", "x.azure.com"), 1000),
        (routed(FLEET, "gpt-5", "api.openai.com"), 1),
    ]

    async def fill() -> None:
        async with SqliteStore(db) as store:
            at = datetime(2025, 1, 1, 12, tzinfo=UTC)
            for route, tokens in calls:
                store.submit(UsageRecord(at, "e", "m", route, tokens, 0, 1, 0))

    asyncio.run(fill())
    assert main(["usage", "--db", str(db), "--by", "route", "--json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)["rows"]
    assert {row["key"]: row["input_tokens"] for row in rows} == {
        "gpt-*": 110,
        "o3,o4-* @ *.azure.com": 1000,
        "rest": 1,
    }
    assert main(["usage", "--db", str(db), "--by", "route"]) == 0
    table = capsys.readouterr().out
    assert "o3,o4-* @ *.azure.com" in table and "routes[0]" not in table
