"""Usage accounting after a mixed run with failover: per endpoint and per model, the totals
``llmitm usage`` reports equal what the fake upstreams computed for the requests they
answered — the endpoint being the one that answered, not the route's first, and throttled
attempts counting nothing."""

from __future__ import annotations

import subprocess
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
[routing]
backoff = 0.01
backoff_max = 0.02

[endpoints.a]
kind = "compatible"
base_url = "{a}/v1"
apis = ["chat", "responses"]

[endpoints.b]
kind = "compatible"
base_url = "{b}/v1"
apis = ["chat"]

[[routes]]
name = "mixed"
models = ["mix-*"]
endpoints = ["a", "b"]
strategy = "weighted"
affinity = false
"""

HEADERS = {"x-fake-scenario": "reasoning"}
THROTTLED = 3  # a's first answers are 429s: those attempts fail over to b


def fake_usage(body: dict[str, Any]) -> list[int]:
    scenario = fu.choose_scenario("reasoning", body)
    plan = fu.build_plan(scenario, body, lambda: "call")
    usage = fu.Usage(fu.input_chars(body) // 4 + 1, plan.output_tokens(), plan.reasoning_tokens())
    return [1, usage.input, usage.cached, usage.output, usage.reasoning]


def drive(client: openai.OpenAI) -> None:
    for i in range(6):
        model = f"mix-{i % 2}"
        messages: Any = [{"role": "user", "content": f"Say hello {i}."}]
        client.chat.completions.create(model=model, messages=messages, extra_headers=HEADERS)
        for _ in client.chat.completions.create(
            model=model, messages=messages, stream=True, extra_headers=HEADERS
        ):
            pass
        client.responses.create(model=model, input=f"Hello {i}", extra_headers=HEADERS)
        for _ in client.responses.create(
            model=model, input=f"Hello {i}", stream=True, extra_headers=HEADERS
        ):
            pass


def usage_rows(db: Path, by: str) -> dict[str, list[int]]:
    result = subprocess.run(
        [str(LLMITM), "usage", "--json", "--db", str(db), "--by", by],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return {
        row["key"]: [
            row["requests"], row["input_tokens"], row["cached_tokens"],
            row["output_tokens"], row["reasoning_tokens"],
        ]
        for row in orjson.loads(result.stdout)["rows"]
    }  # fmt: skip


def test_usage_after_failover_equals_what_each_upstream_reported(tmp_path: Path) -> None:
    db = tmp_path / "usage.db"
    with (
        fake_upstream(tmp_path, name="a", fault=f"status=429;retry_after=0;times={THROTTLED}") as a,
        fake_upstream(tmp_path, apis="chat", name="b") as b,
    ):
        config = CONFIG.format(a=a.url, b=b.url)
        with llmitm_proxy(tmp_path, config=config, extra=["--set", f"llmitm_store={db}"]) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-client", max_retries=0)
            drive(client)
        answered = {
            "a": httpx.get(f"{a.url}/_requests").json()[THROTTLED:],
            "b": httpx.get(f"{b.url}/_requests").json(),
        }

    assert answered["a"] and answered["b"]
    assert len(answered["a"]) + len(answered["b"]) == 24
    expected: dict[str, dict[str, list[int]]] = {"endpoint": {}, "model": {}}
    for endpoint, requests in answered.items():
        for request in requests:
            body = request["body"]
            for by, key in (("endpoint", endpoint), ("model", body["model"])):
                totals = expected[by].setdefault(key, [0] * 5)
                for i, value in enumerate(fake_usage(body)):
                    totals[i] += value
    assert usage_rows(db, "endpoint") == expected["endpoint"]
    assert usage_rows(db, "model") == expected["model"]
    route_total = [sum(column) for column in zip(*expected["model"].values(), strict=True)]
    assert route_total[0] == 24
    assert usage_rows(db, "route") == {"mixed": route_total}
