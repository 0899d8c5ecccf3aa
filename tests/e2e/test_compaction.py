"""Responses compaction emulated over endpoints that have none, through a real llmitm process,
with the openai SDK as client: ``client.responses.compact(...)`` and a create call carrying a
``compaction_trigger`` item (Codex's remote_compaction_v2; the real Codex is
test_codex_compact.py), then a following ``responses.create`` that sends the returned items.

The chat-only fake answers ``Echo: <last user text>`` (scenario ``echo``): the summary it
writes repeats the transcript it was sent, so the next turn's messages show that the sealed
summary came back as context. llama.cpp (Gemma-3-270M) stands for a real backend, over its
chat API and its own Responses API (a ``compatible`` endpoint, which has no compact either).
A route to a native OpenAI endpoint gets the compact call as it was sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

from llmitm.responses_api.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX

from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[routing]
connect_timeout = 1

[endpoints.down]
kind = "compatible"
base_url = "http://127.0.0.1:9/v1"
apis = ["chat"]

[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[endpoints.native]
kind = "openai"
base_url = "{native}/v1"
apis = ["responses"]

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]

[[routes]]
models = ["native*"]
endpoints = ["native"]

[[routes]]
models = ["failover*"]
endpoints = ["down", "chat-only"]
"""

ECHO = {"x-fake-scenario": "echo"}
FACT = "My favourite colour is teal."
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": FACT},
    {"role": "assistant", "content": "Noted: teal."},
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "lookup",
        "arguments": '{"q":"teal"}',
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "teal is #008080"},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream]]:
    tmp = tmp_path_factory.mktemp("compaction")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses", name="native") as native,
        llmitm_proxy(tmp, config=CONFIG.format(chat=chat.url, native=native.url)) as proxy,
    ):
        yield proxy, chat


@pytest.fixture
def client(stack: tuple[Proxy, Upstream]) -> openai.OpenAI:
    proxy, chat = stack
    httpx.post(f"{chat.url}/_reset")
    return openai.OpenAI(api_key="sk-client", base_url=proxy.base_url(), max_retries=0)


def upstream_bodies(upstream: Upstream) -> list[dict[str, Any]]:
    return [r["body"] for r in orjson.loads(httpx.get(f"{upstream.url}/_requests").content)]


def summary_messages(body: dict[str, Any]) -> list[str]:
    return [
        m["content"]
        for m in body["messages"]
        if m["role"] == "user" and str(m["content"]).startswith(SUMMARY_PREFIX)
    ]


def test_sdk_compact_over_a_chat_endpoint_then_the_conversation_continues(
    stack: tuple[Proxy, Upstream], client: openai.OpenAI
) -> None:
    proxy, chat = stack
    compacted = client.responses.compact(
        model="over-chat-model", input=HISTORY, instructions="Be brief.", extra_headers=ECHO
    )
    assert compacted.object == "response.compaction"
    *kept, item = compacted.output
    assert [(m.type, m.role) for m in kept] == [("message", "user")]  # the user's messages
    assert item.type == "compaction"
    assert item.encrypted_content.startswith("gAAAAA") and "teal" not in item.encrypted_content
    assert compacted.usage.total_tokens > 0

    [summarising] = upstream_bodies(chat)
    assert summarising["messages"][0] == {"role": "system", "content": SUMMARY_INSTRUCTIONS}
    transcript = summarising["messages"][1]["content"]
    assert FACT in transcript and "teal is #008080" in transcript
    assert "tools" not in summarising

    # The next turn sends the compacted window back; the summary arrives as context.
    followup = client.responses.create(
        model="over-chat-model",
        input=[
            *(i.model_dump(exclude_none=True, warnings=False) for i in compacted.output),
            _user("Go on."),
        ],
        extra_headers=ECHO,
    )
    assert followup.status == "completed"
    assert followup.output_text == "Echo: Go on."
    turn = upstream_bodies(chat)[-1]
    [summary] = summary_messages(turn)
    assert FACT in summary  # the echo's summary quoted the transcript
    assert [m["role"] for m in turn["messages"]] == ["user", "user", "user"]
    assert "Traceback" not in proxy.log_text()


def test_a_compaction_trigger_streams_one_compaction_item_and_is_opened_next_turn(
    stack: tuple[Proxy, Upstream], client: openai.OpenAI
) -> None:
    _proxy, chat = stack
    trigger = [*HISTORY, {"type": "compaction_trigger"}]
    with client.responses.stream(
        model="over-chat-model",
        input=trigger,  # type: ignore[arg-type]
        instructions="You are a helpful agent.",
        store=False,
        extra_headers=ECHO,
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()
    assert events == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    [item] = final.output
    assert item.type == "compaction"
    assert final.instructions == "You are a helpful agent."  # the client's, not the summariser's
    [summarising] = upstream_bodies(chat)
    assert not summarising.get("stream")  # one whole answer, made a stream by llmitm

    window = [HISTORY[0], item.model_dump(exclude_none=True), _user("What colour?")]
    answer = client.responses.create(model="over-chat-model", input=window, extra_headers=ECHO)
    assert answer.output_text == "Echo: What colour?"
    [summary] = summary_messages(upstream_bodies(chat)[-1])
    assert FACT in summary


def test_a_compaction_fails_over_like_any_call(
    stack: tuple[Proxy, Upstream], client: openai.OpenAI
) -> None:
    """The summarisation is an ordinary routed call: a dead first endpoint costs an attempt."""
    raw = client.responses.with_raw_response.compact(model="failover-model", input=HISTORY)
    assert raw.headers["x-llmitm-endpoint"] == "chat-only"
    assert raw.headers["x-llmitm-attempts"] == "2"
    assert raw.parse().output[-1].type == "compaction"


def test_a_stored_triggered_response_is_the_compaction_one(
    stack: tuple[Proxy, Upstream], client: openai.OpenAI
) -> None:
    created = client.responses.create(
        model="over-chat-model",
        input=[*HISTORY, {"type": "compaction_trigger"}],  # type: ignore[list-item]
        store=True,
    )
    assert [i.type for i in created.output] == ["compaction"]
    stored = client.responses.retrieve(created.id)
    assert stored.output == created.output and stored.status == "completed"


def test_compaction_errors_are_openai_shaped(
    stack: tuple[Proxy, Upstream], client: openai.OpenAI
) -> None:
    proxy, chat = stack
    url = f"{proxy.base_url()}/responses/compact"
    response = httpx.post(url, json={"model": "over-chat-model", "input": []})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"
    response = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
    # The endpoint's own failure reaches the client as the endpoint said it.
    with pytest.raises(openai.InternalServerError):
        client.responses.compact(
            model="over-chat-model",
            input=HISTORY,
            extra_headers={"x-fake-scenario": "text;status=500"},
        )
    assert upstream_bodies(chat)  # it did go upstream
    assert "Traceback" not in proxy.log_text()


def test_a_compaction_item_llmitm_cannot_open_is_dropped_with_a_warning(
    stack: tuple[Proxy, Upstream], client: openai.OpenAI
) -> None:
    proxy, chat = stack
    foreign = {"type": "compaction", "encrypted_content": "gAAAAAnot-llmitms-token"}
    answer = client.responses.create(
        model="over-chat-model",
        input=[HISTORY[0], foreign, _user("Go on.")],  # type: ignore[list-item]
        extra_headers=ECHO,
    )
    assert answer.output_text == "Echo: Go on."
    [body] = upstream_bodies(chat)
    assert [m["content"] for m in body["messages"]] == [FACT, "Go on."]
    assert "dropped 1 compaction item(s) llmitm cannot open" in proxy.log_text()


def test_a_native_endpoint_gets_the_compact_call_as_it_was_sent(
    stack: tuple[Proxy, Upstream], client: openai.OpenAI
) -> None:
    _proxy, chat = stack
    # The fake Responses endpoint has no compact route: its 404 names the path it was sent.
    with pytest.raises(openai.NotFoundError, match="POST /v1/responses/compact"):
        client.responses.compact(model="native-model", input=HISTORY)
    assert upstream_bodies(chat) == []  # nothing was summarised


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# --- a real backend -------------------------------------------------------------------------

LLAMA_CONFIG = """
[endpoints.llama-chat]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["chat"]

[endpoints.llama-responses]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["responses"]
non_conformant = ["responses"]

[[routes]]
models = ["via-chat*"]
endpoints = ["llama-chat"]

[[routes]]
models = ["via-responses*"]
endpoints = ["llama-responses"]
"""


@pytest.fixture(scope="module")
def llama_proxy(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("compaction-llama")
    with llmitm_proxy(tmp, config=LLAMA_CONFIG.format(llama=llama_server)) as proxy:
        yield proxy


@pytest.mark.parametrize(("model", "form"), [("via-chat", "compact"), ("via-responses", "trigger")])
def test_compaction_over_llama_cpp_then_a_turn_with_its_items(
    llama_proxy: Proxy, model: str, form: str
) -> None:
    """Each form over one of llama.cpp's APIs (both forms run the same summarisation call, so
    the other pairs add time, not coverage)."""
    client = openai.OpenAI(api_key="sk-client", base_url=llama_proxy.base_url(), max_retries=0)
    if form == "compact":
        compacted = client.responses.compact(model=model, input=HISTORY[:2])
        *kept, item = compacted.output
        assert [m.role for m in kept] == ["user"] and item.type == "compaction"
        window = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
    else:
        with client.responses.stream(
            model=model,
            input=[*HISTORY[:2], {"type": "compaction_trigger"}],  # type: ignore[list-item]
            max_output_tokens=24,
        ) as stream:
            final = stream.get_final_response()
        [item] = final.output
        assert item.type == "compaction"
        window = [HISTORY[0], item.model_dump(exclude_none=True)]

    # llama.cpp takes the window back (its own Responses API refuses unknown item types).
    answer = client.responses.create(
        model=model, input=[*window, _user("Say hi")], max_output_tokens=8
    )
    assert answer.status in ("completed", "incomplete")
    assert answer.output_text
    assert "Traceback" not in llama_proxy.log_text()


# --- record and replay ----------------------------------------------------------------------


def compaction_session(client: openai.OpenAI) -> list[dict[str, Any]]:
    """Both compaction forms, each followed by the turn that sends its item back."""
    compacted = client.responses.compact(model="over-chat-model", input=HISTORY)
    window = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
    after_compact = client.responses.create(model="over-chat-model", input=[*window, _user("A")])
    with client.responses.stream(
        model="over-chat-model",
        input=[*HISTORY, {"type": "compaction_trigger"}],  # type: ignore[list-item]
    ) as stream:
        triggered = stream.get_final_response()
    window = [HISTORY[0], triggered.output[0].model_dump(exclude_none=True)]
    after_trigger = client.responses.create(model="over-chat-model", input=[*window, _user("B")])
    answers = (compacted, after_compact, triggered, after_trigger)
    return [answer.model_dump(warnings=False) for answer in answers]


@pytest.fixture(scope="module")
def recorded_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list]]:
    tmp = tmp_path_factory.mktemp("compaction-record")
    folder = tmp / "recordings"
    options = [
        *("--set", f"llmitm_recordings={folder}"),
        *("--set", "llmitm_allow_record_in_ci=true"),  # recording on purpose
    ]
    with (
        fake_upstream(tmp, "chat") as chat,
        llmitm_proxy(
            tmp / "rec", config=CONFIG.format(chat=chat.url, native=chat.url), extra=options
        ) as proxy,
    ):
        client = openai.OpenAI(
            api_key="sk-client", base_url=proxy.base_url(), max_retries=0, default_headers=ECHO
        )
        live = compaction_session(client)
    yield folder, live


@pytest.mark.parametrize("replay_from", ["client", "upstream"])
def test_a_compacted_session_replays_offline_with_the_same_sealed_items(
    recorded_session: tuple[Any, list], tmp_path: Any, replay_from: str
) -> None:
    """Replayed in a fresh process (another seal key, no upstream): the same ids and tokens
    come back, and from the upstream leg the turns after them rebuild exactly the recorded
    upstream requests (no drift), so the recorded tokens were opened."""
    from .test_record_replay import tripwire

    folder, live = recorded_session
    report = tmp_path / "report.json"
    options = {
        "llmitm_record": "replay",
        "llmitm_recordings": str(folder),
        "llmitm_replay_from": replay_from,
        "llmitm_replay_report": str(report),
    }
    extra = [arg for k, v in options.items() for arg in ("--set", f"{k}={v}")]
    with tripwire() as wire:
        config = CONFIG.format(chat=wire.url, native=wire.url)
        with llmitm_proxy(tmp_path, config=config, extra=extra) as proxy:
            client = openai.OpenAI(
                api_key="sk-client", base_url=proxy.base_url(), max_retries=0, default_headers=ECHO
            )
            replayed = compaction_session(client)
    assert replayed == live
    summary = orjson.loads(report.read_bytes())
    assert (summary["hits"], summary["misses"], summary["drift"]) == (4, [], [])
