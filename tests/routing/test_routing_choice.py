"""The routing decisions the router used to make itself, now in the core: the one endpoint
choice (``Routing.choose``, asked by the direct path and by the failover job alike), what a
direct attempt's ending was, and what a request's affinity keys on."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import orjson
import pytest
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.router import LlmRouter
from llmitm.addons.settings import LlmitmSettings
from llmitm.relay.failover import FailoverJob
from llmitm.routing.affinity import (
    conversation_key,
    fingerprint,
    owner_required,
    remembers_turn,
)
from llmitm.routing.config import parse_config
from llmitm.routing.engine import Routing
from llmitm.routing.outcomes import Outcome, direct_outcome, transport_outcome

BODY = {
    "model": "m",
    "messages": [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"}],
}


def routing(*routes: dict[str, Any]) -> Routing:
    raw = {
        "routing": {"cooldown": 30, "failure_threshold": 1},
        "endpoints": {
            name: {"kind": "compatible", "base_url": f"http://127.0.0.1:9/{name}/v1"}
            for name in ("a", "b")
        },
        "routes": list(routes),
    }
    return Routing(parse_config(raw, "test.toml", {}))


def test_a_single_attempt_goes_to_the_routes_endpoint_even_while_it_cools() -> None:
    """The direct path has nowhere else to go and no later attempt to wait for."""
    core = routing({"endpoints": ["a"]})
    route = core.config.routes[0]
    core.record("a", Outcome("server_error", 500), 0.0, "m")
    assert core.order(route, "m", 1.0).endpoints == ()  # the strategy leaves it out
    chosen = core.choose(route, "m", 1.0, single_attempt=True)
    assert chosen.endpoints == ("a",) and chosen.required


def test_every_other_choice_is_the_strategys_order_with_affinity() -> None:
    core = routing({"endpoints": ["a", "b"]})
    route = core.config.routes[0]
    assert core.choose(route, "m", 0.0) == core.order(route, "m", 0.0)
    core.record("a", Outcome("server_error", 500), 0.0, "m")
    assert core.choose(route, "m", 1.0).endpoints == ("b",)
    fresh = routing({"endpoints": ["a", "b"]})
    fresh.served("b", 0.0, response_id="resp_1")
    chosen = fresh.choose(route, "m", 1.0, previous_response_id="resp_1", owner_required=True)
    assert chosen.endpoints == ("b",) and chosen.required  # only the owner holds the state


CONFIG = """
[endpoints.a]
kind = "compatible"
base_url = "http://127.0.0.1:9/a/v1"

[endpoints.b]
kind = "compatible"
base_url = "http://127.0.0.1:9/b/v1"

[[routes]]
models = ["direct"]
endpoints = ["a"]

[[routes]]
models = ["*"]
endpoints = ["a", "b"]
"""


class Reply:
    """What the failover job answers through, kept for the test to read."""

    def __init__(self) -> None:
        self.answered: tuple[int, dict[str, Any]] | None = None

    async def json(self, status: int, body: dict[str, Any], headers: Any = ()) -> None:
        self.answered = (status, body)


async def test_the_direct_path_and_the_failover_job_ask_the_same_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, bool]] = []
    choose = Routing.choose

    def spy(self: Routing, route: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append((route.name, kwargs.get("single_attempt", False)))
        return choose(self, route, *args, **kwargs)

    monkeypatch.setattr(Routing, "choose", spy)
    path = tmp_path / "llmitm.toml"
    path.write_text(CONFIG)
    addons = make_addons()
    with taddons.context(*addons) as tctx:
        settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        tctx.configure(settings, llmitm_config=str(path))
        router = next(a for a in addons if isinstance(a, LlmRouter))
        flow = tflow.tflow()
        flow.request.method = "POST"
        flow.request.url = "https://api.openai.com/v1/chat/completions"
        flow.request.content = orjson.dumps(dict(BODY, model="direct"))
        result = router.request(flow)
        if inspect.isawaitable(result):
            await result
        assert flow.request.url == "http://127.0.0.1:9/a/v1/chat/completions"
        assert asked == [("routes[0]", True)]

        core = router.routing
        job = FailoverJob(core, core.config.routes[1], "m", lambda _endpoint: None)
        reply = Reply()
        await asyncio.wait_for(job.serve(reply), 5)  # type: ignore[arg-type]
        assert reply.answered is not None  # no endpoint could take it: llmitm's own error
        assert ("routes[1]", False) in asked


def test_a_direct_attempts_ending_is_classified_from_its_status_or_its_cut() -> None:
    assert direct_outcome(200, {}, cut=None, wall_now=0.0) == Outcome("success", 200)
    limited = direct_outcome(429, {"retry-after": "3"}, cut=None, wall_now=0.0)
    assert (limited.kind, limited.retry_after) == ("rate_limited", 3.0)
    cut = direct_outcome(200, {}, cut="reset", wall_now=0.0)
    assert cut == Outcome("cut", after_first_byte=True, message="reset")
    assert not direct_outcome(400, {}, cut=None, wall_now=0.0).failed


@pytest.mark.parametrize(
    ("message", "got_head", "streamed", "kind"),
    [
        ("connection refused", False, False, "connect_error"),
        ("server disconnected", True, False, "server_error"),
        ("server disconnected", True, True, None),  # a begun stream is reported as a cut
        ("Client disconnected", False, False, None),  # nobody's fault upstream
    ],
)
def test_a_transport_error_counts_against_the_endpoint_only_when_it_is_its_fault(
    message: str, got_head: bool, streamed: bool, kind: str | None
) -> None:
    outcome = transport_outcome(message, got_head=got_head, streamed=streamed)
    assert (outcome.kind if outcome else None) == kind
    if outcome is not None:
        assert outcome.message == message and outcome.failed


def test_the_conversation_key_is_per_route_and_model() -> None:
    key = conversation_key("r", "m", BODY)
    assert key == f"r\x00m\x00{fingerprint(BODY)}"
    assert conversation_key("r", "other", BODY) != key
    assert conversation_key("r", "m", {"model": "m"}) is None


def test_only_a_native_responses_owner_is_required() -> None:
    apis = {"native": "responses", "chat": "chat"}
    assert owner_required("native", "responses", apis)
    assert not owner_required("chat", "responses", apis)
    assert not owner_required("native", "chat", apis)
    assert not owner_required("gone", "responses", apis)
    assert not owner_required(None, "responses", apis)


def test_an_answer_teaches_affinity_by_conversation_or_native_id() -> None:
    assert remembers_turn(True, "key", "chat")
    assert remembers_turn(True, None, "responses")
    assert not remembers_turn(True, None, "chat")
    assert not remembers_turn(False, "key", "responses")
