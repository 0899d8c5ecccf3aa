"""Stored Responses state belongs to the credential that created it (issue 14, point 9),
through a real llmitm process with the openai SDK as client: another API key, or none, gets
OpenAI's 404 for every state call and OpenAI's 400 for a continuation, the owner goes on as
before, and ``[llmitm] responses_scope = "shared"`` lets every client read everything again.

The chat-only fake upstream stands for a backend llmitm keeps the state for; the
Responses-only fake for a native endpoint that keeps its own (it serves no state calls, so
its 404 names the path it received — which shows whether llmitm sent a call there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
{llmitm}
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[endpoints.responses-only]
kind = "openai"
base_url = "{responses}/v1"
apis = ["responses"]
api_key_env = "LLMITM_TEST_NATIVE_KEY"

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]

[[routes]]
models = ["over-responses*"]
endpoints = ["responses-only"]
"""
ENV = {"LLMITM_TEST_NATIVE_KEY": "sk-native-endpoint"}
ECHO = {"x-fake-scenario": "echo"}
SLOW = {"x-fake-scenario": "text;events=40;event_delay_ms=25"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream, Upstream]]:
    tmp = tmp_path_factory.mktemp("scope")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses") as responses,
        llmitm_proxy(
            tmp, config=CONFIG.format(llmitm="", chat=chat.url, responses=responses.url), env=ENV
        ) as proxy,
    ):
        yield proxy, chat, responses


def sdk(proxy: Proxy, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=proxy.base_url(), api_key=key, max_retries=0, default_headers=ECHO
    )


def keyless(proxy: Proxy, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """A request without any credential (the SDK always sends one)."""
    return httpx.request(method, proxy.base_url() + path, timeout=10, **kwargs)


def assert_openai_404(response: Any, response_id: str) -> None:
    assert response.status_code == 404, response.text
    assert response.json() == {
        "error": {
            "message": f"Response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


def state_calls(client: openai.OpenAI, rid: str) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("retrieve", lambda: client.responses.retrieve(rid)),
        ("input_items", lambda: client.responses.input_items.list(rid)),
        ("stream resume", lambda: list(client.responses.retrieve(rid, stream=True))),
        ("cancel", lambda: client.responses.cancel(rid)),
        ("delete", lambda: client.responses.delete(rid)),
    ]


KEYLESS_CALLS = [
    ("GET", "/responses/{rid}"),
    ("GET", "/responses/{rid}/input_items"),
    ("GET", "/responses/{rid}?stream=true&starting_after=0"),
    ("POST", "/responses/{rid}/cancel"),
    ("DELETE", "/responses/{rid}"),
]


def wait_for(client: openai.OpenAI, rid: str, statuses: set[str], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        response = client.responses.retrieve(rid)
        if response.status in statuses or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_another_key_or_none_gets_404_for_every_state_call_and_the_owner_does_not(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, _chat, _responses = stack
    alice, bob = sdk(proxy, "sk-alice"), sdk(proxy, "sk-bob")
    created = alice.responses.create(model="over-chat", input="alice's secret prompt")
    running = alice.responses.create(
        model="over-chat", input="in the background", background=True, extra_headers=SLOW
    )
    for rid in (created.id, running.id):
        for _name, attempt in state_calls(bob, rid):
            with pytest.raises(openai.NotFoundError) as caught:
                attempt()
            assert_openai_404(caught.value.response, rid)
        for method, path in KEYLESS_CALLS:
            assert_openai_404(keyless(proxy, method, path.format(rid=rid)), rid)
    # Nothing the others tried changed anything: the run goes on, cancel and delete were no-ops.
    assert alice.responses.retrieve(created.id).output_text == "Echo: alice's secret prompt"
    items = alice.responses.input_items.list(created.id)
    assert [i.content[0].text for i in items.data] == ["alice's secret prompt"]
    assert wait_for(alice, running.id, {"in_progress", "completed"}).status != "cancelled"
    resumed = list(alice.responses.retrieve(running.id, stream=True, starting_after=0))
    assert resumed[0].sequence_number == 1 and resumed[-1].type == "response.completed"
    alice.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(created.id)


def test_continuing_another_keys_response_is_refused_as_unknown(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, chat, responses = stack
    alice, bob = sdk(proxy, "sk-alice"), sdk(proxy, "sk-bob")
    over_chat = alice.responses.create(model="over-chat", input="first turn")
    native = alice.responses.create(model="over-responses", input="native first turn")
    chat_before = len(httpx.get(f"{chat.url}/_requests").json())
    native_before = len(httpx.get(f"{responses.url}/_requests").json())
    for model, rid in (("over-chat", over_chat.id), ("over-responses", native.id)):
        with pytest.raises(openai.BadRequestError) as caught:
            bob.responses.create(model=model, input="and then?", previous_response_id=rid)
        assert caught.value.code == "previous_response_not_found"
        assert caught.value.param == "previous_response_id"
        sent = keyless(
            proxy,
            "POST",
            "/responses",
            json={"model": model, "input": "and then?", "previous_response_id": rid},
        )
        assert sent.status_code == 400 and sent.json()["error"]["param"] == "previous_response_id"
    # Neither upstream saw the attempts: the chain was not inlined, the id not sent on.
    assert len(httpx.get(f"{chat.url}/_requests").json()) == chat_before
    assert len(httpx.get(f"{responses.url}/_requests").json()) == native_before
    # The owner continues both.
    turn = alice.responses.create(
        model="over-chat", input="second turn", previous_response_id=over_chat.id
    )
    assert turn.output_text == "Echo: second turn"
    alice.responses.create(model="over-responses", input="more", previous_response_id=native.id)
    assert httpx.get(f"{responses.url}/_requests").json()[-1]["body"]["previous_response_id"] == (
        native.id
    )


def test_a_native_id_is_sent_to_its_endpoint_only_for_the_key_that_made_it(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, _chat, responses = stack
    alice, bob = sdk(proxy, "sk-alice"), sdk(proxy, "sk-bob")
    native = alice.responses.create(model="over-responses", input="native")
    seen = len(httpx.get(f"{responses.url}/_requests").json())
    with pytest.raises(openai.NotFoundError) as caught:
        bob.responses.retrieve(native.id)
    assert_openai_404(caught.value.response, native.id)
    assert_openai_404(keyless(proxy, "GET", f"/responses/{native.id}"), native.id)
    assert len(httpx.get(f"{responses.url}/_requests").json()) == seen  # never forwarded
    with pytest.raises(openai.NotFoundError) as owner_call:
        alice.responses.retrieve(native.id)
    # The fake's own 404 (it keeps no state) names the path: the owner's call went there.
    assert owner_call.value.message.endswith(f"Invalid URL (GET /v1/responses/{native.id})")


def test_shared_scope_lets_every_client_read_continue_and_delete(tmp_path: Path) -> None:
    with fake_upstream(tmp_path, "chat") as chat:
        config = CONFIG.format(
            llmitm='[llmitm]\nresponses_scope = "shared"',
            chat=chat.url,
            responses="http://127.0.0.1:9",
        )
        with llmitm_proxy(tmp_path, config=config, env=ENV) as proxy:
            alice, bob = sdk(proxy, "sk-alice"), sdk(proxy, "sk-bob")
            created = alice.responses.create(model="over-chat", input="one")
            assert bob.responses.retrieve(created.id).output_text == "Echo: one"
            assert keyless(proxy, "GET", f"/responses/{created.id}").json()["id"] == created.id
            turn = bob.responses.create(
                model="over-chat", input="two", previous_response_id=created.id
            )
            assert turn.output_text == "Echo: two"
            assert bob.responses.delete(created.id) is None
            with pytest.raises(openai.NotFoundError):
                alice.responses.retrieve(created.id)
