"""Responses server state over a chat-only upstream, through a real llmitm process, with the
openai SDK as client (issue 5).

The chat-only fake upstream answers ``Echo: <last user text>`` (scenario ``echo``), so every
turn's answer differs and the messages it received show exactly which conversation llmitm
rebuilt. The Responses-only fake stands for a native endpoint whose state is its own.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

from llmitm.store import SqliteStore

from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

SECRET = "sk-upstream-secret-never-on-disk"

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]
api_key_env = "LLMITM_TEST_CHAT_KEY"

[endpoints.responses-only]
kind = "openai"
base_url = "{responses}/v1"
apis = ["responses"]

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]

[[routes]]
models = ["over-responses*"]
endpoints = ["responses-only"]
"""

ECHO = {"x-fake-scenario": "echo"}
KEY_ENV = {"LLMITM_TEST_CHAT_KEY": SECRET}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream, Upstream]]:
    tmp = tmp_path_factory.mktemp("state")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses") as responses,
        llmitm_proxy(
            tmp,
            config=CONFIG.format(chat=chat.url, responses=responses.url),
            env={"LLMITM_TEST_CHAT_KEY": SECRET},
        ) as proxy,
    ):
        yield proxy, chat, responses


@pytest.fixture
def client(stack: tuple[Proxy, Upstream, Upstream]) -> openai.OpenAI:
    proxy, chat, responses = stack
    for upstream in (chat, responses):
        httpx.post(f"{upstream.url}/_reset")
    return openai.OpenAI(
        base_url=proxy.base_url(), api_key="sk-client", max_retries=0, default_headers=ECHO
    )


def upstream_requests(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


def messages_sent(upstream: Upstream) -> list[list[dict]]:
    return [r["body"]["messages"] for r in upstream_requests(upstream)]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def db_path(proxy: Proxy) -> Path:
    return Path(proxy.log).with_name("llmitm.db")


def db_rows(path: Path) -> list[bytes]:
    """Each stored response's object and input items, as the store reads them back (schema
    8 keeps them in shared chunks, not in the row)."""

    async def read() -> list[bytes]:
        async with SqliteStore(path, read_only=True) as store:
            records = [await store.response(rid) for rid in sorted(stored_ids(path))]
        return [orjson.dumps([r.response, r.input_items]) for r in records if r is not None]

    return asyncio.run(read())


def usage_rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM usage").fetchone()[0])


def stored_ids(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT id FROM responses")}


# -- create → retrieve → input_items → delete → 404 (checklist 32) ---------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_check_32_create_retrieve_input_items_delete_then_404(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream], stream: bool
) -> None:
    proxy, _chat, _responses = stack
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ]
    if stream:
        events = list(client.responses.create(model="over-chat", input=items, stream=True))
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        created = events[-1].response
        assert created.id == events[0].response.id  # one id: response.created = terminal
    else:
        created = client.responses.create(model="over-chat", input=items)
    assert created.id.startswith("resp_") and created.status == "completed"
    assert created.output_text == "Echo: hi"
    assert created.store is True

    got = client.responses.retrieve(created.id)
    assert got.model_dump() == created.model_dump()  # the same JSON the create returned
    raw = httpx.get(f"{proxy.base_url()}/responses/{created.id}").json()
    root = proxy.base_url().removesuffix("/v1")
    for azure in (  # Azure's classic and v1 paths reach the same stored response
        f"{root}/openai/responses/{created.id}?api-version=2025-04-01-preview",
        f"{root}/openai/v1/responses/{created.id}",
    ):
        assert httpx.get(azure, headers={"api-key": "k"}).json() == raw

    listed = client.responses.input_items.list(created.id, order="asc")
    assert [(i.type, i.role) for i in listed.data] == [
        ("message", "developer"),
        ("message", "user"),
    ]
    assert all(i.id and i.id.startswith("msg_") for i in listed.data)
    assert listed.data[1].content[0].text == "hi"
    assert listed.first_id == listed.data[0].id and listed.has_more is False

    deleted = client.with_options(max_retries=0).delete(f"/responses/{created.id}", cast_to=object)
    assert deleted == {"id": created.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(created.id)
    assert caught.value.body == {
        "message": f"Response with id '{created.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(created.id)
    assert "Traceback" not in proxy.log_text()
    # Credentials are headers, and headers are never stored.
    assert SECRET.encode() not in db_path(proxy).read_bytes()


def test_check_32_store_false_leaves_nothing(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream]
) -> None:
    proxy, _chat, _responses = stack
    with pytest.raises(openai.NotFoundError):  # a read flushes the writes queued before it
        client.responses.retrieve("resp_flush")
    before = stored_ids(db_path(proxy))
    created = client.responses.create(model="over-chat", input="secret plan", store=False)
    with client.responses.stream(model="over-chat", input="again", store=False) as events:
        streamed = events.get_final_response()
    assert created.store is False and streamed.store is False
    for response_id in (created.id, streamed.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response_id)
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(
                model="over-chat", input="next", previous_response_id=response_id
            )
        assert caught.value.code == "previous_response_not_found"
    stored = client.responses.create(model="over-chat", input="a stored one")
    client.responses.retrieve(stored.id)  # reads wait for the writes before them
    assert stored_ids(db_path(proxy)) - before == {stored.id}
    assert not any(b"secret plan" in r for r in db_rows(db_path(proxy)))


# -- previous_response_id chains (checklist 31) ------------------------------------------------


def test_check_31_five_turn_chain_rebuilds_exactly_its_ancestors_and_branches(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream]
) -> None:
    _proxy, chat, _responses = stack
    ids: list[str] = []
    previous = None
    for turn in range(1, 6):
        kwargs: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        instructions = f"System rule {turn}." if turn in (1, 4) else None
        if turn % 2:  # odd turns stream, even ones do not: one chain either way
            with client.responses.stream(
                model="over-chat", input=f"turn {turn}", instructions=instructions, **kwargs
            ) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(
                model="over-chat", input=f"turn {turn}", instructions=instructions, **kwargs
            )
        assert response.output_text == f"Echo: turn {turn}"
        assert response.previous_response_id == previous
        ids.append(previous := response.id)

    def history(upto: int) -> list[dict]:
        out: list[dict] = []
        for k in range(1, upto + 1):
            out += [user(f"turn {k}"), assistant(f"Echo: turn {k}")]
        return out

    sent = messages_sent(chat)
    assert len(sent) == 5
    assert sent[0] == [{"role": "system", "content": "System rule 1."}, user("turn 1")]
    assert sent[1] == [*history(1), user("turn 2")]  # turn 1's instructions are not carried
    assert sent[2] == [*history(2), user("turn 3")]
    assert sent[3] == [{"role": "system", "content": "System rule 4."}, *history(3), user("turn 4")]
    assert sent[4] == [*history(4), user("turn 5")]

    # Branch from turn 2: only its ancestors, nothing of turns 3–5.
    branch = client.responses.create(model="over-chat", input="branch", previous_response_id=ids[1])
    assert messages_sent(chat)[-1] == [*history(2), user("branch")]
    assert branch.output_text == "Echo: branch"
    assert client.responses.retrieve(ids[4]).previous_response_id == ids[3]

    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="over-chat", input="x", previous_response_id="resp_does_not_exist"
        )
    assert caught.value.body == {
        "message": "Previous response with id 'resp_does_not_exist' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    assert len(messages_sent(chat)) == 6  # the unknown id never reached the upstream


def test_item_references_resolve_to_stored_items(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream]
) -> None:
    _proxy, chat, _responses = stack
    first = client.responses.create(model="over-chat", input="remember me")
    [asked] = client.responses.input_items.list(first.id).data
    [answered] = first.output
    second = client.responses.create(
        model="over-chat",
        input=[
            {"type": "item_reference", "id": asked.id},
            {"type": "item_reference", "id": answered.id},
            user("and now?"),
        ],
    )
    assert second.output_text == "Echo: and now?"
    assert messages_sent(chat)[-1] == [
        user("remember me"),
        assistant("Echo: remember me"),
        user("and now?"),
    ]
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [i.id for i in listed[:2]] == [asked.id, answered.id]  # stored as resolved
    # With previous_response_id too: the chain first, then the resolved reference.
    client.responses.create(
        model="over-chat",
        input=[{"type": "item_reference", "id": asked.id}],
        previous_response_id=first.id,
    )
    assert messages_sent(chat)[-1] == [
        user("remember me"),
        assistant("Echo: remember me"),
        user("remember me"),
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="over-chat", input=[{"type": "item_reference", "id": "msg_unknown"}]
        )
    assert caught.value.param == "input"


def test_check_33_input_items_pages_through_the_sdk(client: openai.OpenAI) -> None:
    created = client.responses.create(
        model="over-chat", input=[user(f"part {k}") for k in range(5)]
    )
    page = client.responses.input_items.list(created.id, limit=2, order="asc")
    texts = [item.content[0].text for item in page.data]
    assert texts == ["part 0", "part 1"] and page.has_more is True
    every = [
        item.content[0].text
        for item in client.responses.input_items.list(created.id, limit=2, order="asc")
    ]  # the SDK's auto-pagination follows after= until has_more is false
    assert every == [f"part {k}" for k in range(5)]
    newest = client.responses.input_items.list(created.id, limit=1)
    assert newest.data[0].content[0].text == "part 4"  # order defaults to desc
    after = client.responses.input_items.list(created.id, after=newest.data[0].id, limit=100)
    assert [i.content[0].text for i in after.data] == [f"part {k}" for k in (3, 2, 1, 0)]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.input_items.list(created.id, limit=101)
    assert caught.value.param == "limit"


def test_a_resent_history_keeps_its_item_ids_from_turn_to_turn(client: openai.OpenAI) -> None:
    # An agent resends its whole history, without ids, every turn: OpenAI would list fresh
    # ids each time; llmitm gives a resent item the id it had, and equal items their own.
    history = [user("fix the build"), user("again")]
    first = client.responses.create(model="over-chat", input=history)
    history += [assistant(first.output_text), user("again")]
    second = client.responses.create(model="over-chat", input=history)
    before = [i.id for i in client.responses.input_items.list(first.id, order="asc").data]
    after = [i.id for i in client.responses.input_items.list(second.id, order="asc").data]
    assert len(before) == 2 and len(after) == 4
    assert after[:2] == before and len(set(after)) == 4
    assert all(i.startswith("msg_") and len(i) == 52 for i in after)
    other = openai.OpenAI(
        base_url=str(client.base_url), api_key="sk-other", max_retries=0, default_headers=ECHO
    )
    theirs = other.responses.create(model="over-chat", input=history[:2])
    listed = [i.id for i in other.responses.input_items.list(theirs.id, order="asc").data]
    assert not set(listed) & set(before)  # another credential's items are its own


# -- restart, parallel chains ---------------------------------------------------------------------


def test_state_survives_a_restart_between_turns(tmp_path: Path) -> None:
    """Stop llmitm between two turns (and in the middle of a background response): the next
    process continues the chain from the store, and the cut background response reads
    ``failed`` (llmitm ended it on the way out) instead of in_progress forever."""
    with fake_upstream(tmp_path, "chat") as chat:
        config = CONFIG.format(chat=chat.url, responses="http://127.0.0.1:9")
        store = ["--set", f"llmitm_store={tmp_path / 'state.db'}"]

        def client_of(proxy: Proxy) -> openai.OpenAI:
            return openai.OpenAI(
                base_url=proxy.base_url(), api_key="k", max_retries=0, default_headers=ECHO
            )

        with llmitm_proxy(tmp_path / "one", config=config, env=KEY_ENV, extra=store) as proxy:
            client = client_of(proxy)
            first = client.responses.create(model="over-chat", input="before")
            running = client.responses.create(
                model="over-chat", input="long", background=True, **slow(400, 25)
            )
            wait_for(client, running.id, {"in_progress"})
        with llmitm_proxy(tmp_path / "two", config=config, env=KEY_ENV, extra=store) as proxy:
            client = client_of(proxy)
            assert client.responses.retrieve(first.id).output_text == "Echo: before"
            second = client.responses.create(
                model="over-chat", input="after", previous_response_id=first.id
            )
            cut = client.responses.retrieve(running.id)
            assert cut.status == "failed" and cut.error is not None
            assert "stopped" in cut.error.message
            replayed = list(client.responses.retrieve(running.id, stream=True, starting_after=1))
            assert replayed and replayed[0].sequence_number == 2  # its events were stored
        assert second.output_text == "Echo: after"
        assert messages_sent(chat)[-1] == [user("before"), assistant("Echo: before"), user("after")]


async def test_twenty_chains_in_parallel_do_not_mix(
    stack: tuple[Proxy, Upstream, Upstream],
) -> None:
    proxy, chat, _responses = stack
    httpx.post(f"{chat.url}/_reset")
    client = openai.AsyncOpenAI(
        base_url=proxy.base_url(), api_key="k", max_retries=0, default_headers=ECHO
    )

    async def chain(n: int) -> str:
        previous = None
        for turn in range(3):
            kwargs: dict[str, Any] = {"previous_response_id": previous} if previous else {}
            response = await client.responses.create(
                model="over-chat", input=f"chain {n} turn {turn}", stream=False, **kwargs
            )
            assert response.output_text == f"Echo: chain {n} turn {turn}"
            previous = response.id
        assert previous is not None
        return previous

    try:
        last_ids = await asyncio.gather(*(chain(n) for n in range(20)))
    finally:
        await client.close()
    sent = messages_sent(chat)
    assert len(sent) == 60
    for messages in sent:
        chains = {m["content"].split()[1] for m in messages if m["role"] == "user"}
        assert len(chains) == 1, messages  # one conversation per upstream request
        turns = [m["content"] for m in messages]
        n = chains.pop()
        depth = len([m for m in messages if m["role"] == "user"])
        expected: list[str] = []
        for turn in range(depth):
            expected += [f"chain {n} turn {turn}", f"Echo: chain {n} turn {turn}"]
        assert turns == expected[:-1]
    assert len(set(last_ids)) == 20


# -- background, cancel, stream resume (checklist 34) --------------------------------------------


def slow(events: int, delay_ms: int) -> dict[str, Any]:
    return {"extra_headers": {"x-fake-scenario": f"text;events={events};event_delay_ms={delay_ms}"}}


def wait_for(client: openai.OpenAI, response_id: str, statuses: set[str], timeout: float = 20):
    deadline = time.monotonic() + timeout
    while True:
        response = client.responses.retrieve(response_id)
        if response.status in statuses or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


@pytest.mark.timing
def test_check_34_background_returns_at_once_and_completes(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream]
) -> None:
    with pytest.raises(openai.NotFoundError):  # a read flushes the writes queued before it
        client.responses.retrieve("resp_flush")
    usage_before = usage_rows(db_path(stack[0]))
    started = time.monotonic()
    created = client.responses.create(
        model="over-chat",
        input="in the background",
        background=True,
        extra_headers={"x-fake-scenario": "text;events=10;first_byte_delay_ms=3000"},
    )
    assert time.monotonic() - started < 2.5  # the upstream needs 3 s: nobody waited for it
    assert created.status in ("queued", "in_progress") and created.background is True
    done = wait_for(client, created.id, {"completed", "failed"})
    assert done.status == "completed", done
    assert done.id == created.id and done.background is True
    assert done.output_text == "Hello from the fake upstream. Hello from the fake upstream."
    assert time.monotonic() - started >= 3
    assert done.usage is not None and done.usage.output_tokens > 0
    # No flow carried the upstream call; its usage is accounted all the same.
    assert usage_rows(db_path(stack[0])) == usage_before + 1
    listed = client.responses.input_items.list(created.id)
    assert [i.content[0].text for i in listed.data] == ["in the background"]

    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="over-chat", input="x", background=True, store=False)
    assert caught.value.param == "background"
    with pytest.raises(openai.BadRequestError):  # only background responses can be cancelled
        client.responses.cancel(client.responses.create(model="over-chat", input="y").id)


def test_check_34_cancel_stops_a_long_background_response(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream]
) -> None:
    _proxy, chat, _responses = stack
    created = client.responses.create(
        model="over-chat", input="long", background=True, **slow(400, 25)
    )
    wait_for(client, created.id, {"in_progress"})
    time.sleep(0.3)  # some events in
    cancelled = client.responses.cancel(created.id)
    assert cancelled.id == created.id and cancelled.status == "cancelled"
    deadline = time.monotonic() + 5
    while httpx.get(f"{chat.url}/_stats").json()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(f"{chat.url}/_stats").json()["in_flight"] == 0  # the upstream call ended
    time.sleep(0.3)
    assert client.responses.retrieve(created.id).status == "cancelled"  # and stays so
    assert client.responses.cancel(created.id).status == "cancelled"  # idempotent


def test_check_34_background_stream_resumes_from_starting_after(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream]
) -> None:
    stream = client.responses.create(
        model="over-chat", input="stream it", background=True, stream=True, **slow(30, 20)
    )
    seen = []
    for event in stream:
        seen.append(event)
        if event.sequence_number == 8:
            break
    stream.close()  # the client goes away; the response goes on
    assert seen[0].type == "response.created" and seen[0].response.status == "queued"
    response_id = seen[0].response.id
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=8))
    assert [e.sequence_number for e in resumed] == list(range(9, 9 + len(resumed)))
    assert resumed[-1].type == "response.completed"
    deltas = [e.delta for e in [*seen, *resumed] if e.type == "response.output_text.delta"]
    assert "".join(deltas) == resumed[-1].response.output_text
    assert len(deltas) == 30
    # Finished: replayed from the store, the same events again.
    again = list(client.responses.retrieve(response_id, stream=True, starting_after=8))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in resumed]
    everything = list(client.responses.retrieve(response_id, stream=True, starting_after=-7))
    assert [e.sequence_number for e in everything] == list(range(9 + len(resumed)))
    with pytest.raises(openai.BadRequestError) as caught:  # not a background response
        client.responses.retrieve(
            client.responses.create(model="over-chat", input="z").id, stream=True
        )
    assert caught.value.param == "stream"
    log = stack[0].log_text()
    assert "Traceback" not in log and "socket.send() raised" not in log, log[-3000:]


# -- reasoning continuity for store:false clients -------------------------------------------------

THOUGHT = "The user wants a short greeting.\n\nI will answer briefly."  # the fake's reasoning


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_store_false_reasoning_comes_back_from_encrypted_content(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream], stream: bool
) -> None:
    _proxy, chat, _responses = stack
    ask: dict[str, Any] = {
        "model": "over-chat",
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "extra_headers": {"x-fake-scenario": "reasoning"},
    }
    if stream:
        events = list(client.responses.create(input="hi", stream=True, **ask))
        first = events[-1].response
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [i.model_dump() for i in done] == [i.model_dump() for i in first.output]
    else:
        first = client.responses.create(input="hi", **ask)
    reasoning, message = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert "greeting" not in reasoning.encrypted_content  # opaque
    plain = client.responses.create(
        input="hi", model="over-chat", store=False, extra_headers=ask["extra_headers"]
    )
    assert plain.output[0].type == "reasoning" and plain.output[0].encrypted_content is None

    def second_turn(token: str) -> dict:
        returned = dict(
            reasoning.model_dump(exclude_none=True), summary=[], encrypted_content=token
        )
        client.responses.create(
            model="over-chat",
            store=False,
            input=[user("hi"), returned, message.model_dump(exclude_none=True), user("and?")],
        )
        return messages_sent(chat)[-1][1]  # the assistant turn after "hi"

    restored = second_turn(reasoning.encrypted_content)
    assert restored["role"] == "assistant" and restored["reasoning_content"] == THOUGHT
    forged = reasoning.encrypted_content[:-4] + "AAAA"
    assert "reasoning_content" not in second_turn(forged)  # not llmitm's token: nothing restored


# -- native Responses endpoints keep their own state --------------------------------------------


def test_native_endpoint_owns_its_ids(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream, Upstream]
) -> None:
    _proxy, chat, responses = stack
    created = client.responses.create(model="over-responses", input="native")
    with client.responses.stream(model="over-responses", input="native stream") as events:
        streamed = events.get_final_response()
    for response_id in (created.id, streamed.id):
        # The fake upstream serves no state calls: its 404 names the path it received, which
        # proves the call reached the owning endpoint, not llmitm's store.
        rid = response_id
        for call, path in (
            (lambda r=rid: client.responses.retrieve(r), f"GET /v1/responses/{rid}"),
            (lambda r=rid: client.responses.delete(r), f"DELETE /v1/responses/{rid}"),
            (
                lambda r=rid: client.responses.input_items.list(r, limit=3),
                f"GET /v1/responses/{rid}/input_items",
            ),
            (lambda r=rid: client.responses.cancel(r), f"POST /v1/responses/{rid}/cancel"),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                call()
            assert caught.value.message.endswith(f"Invalid URL ({path})"), caught.value.message
    # A continuation passes through with previous_response_id: the state is the endpoint's.
    client.responses.create(model="over-responses", input="more", previous_response_id=created.id)
    sent = upstream_requests(responses)[-1]["body"]
    assert sent["previous_response_id"] == created.id and sent["input"] == "more"
    assert upstream_requests(chat) == []


def test_without_a_store_state_lives_in_memory_with_the_configured_default_and_ttl(
    tmp_path: Path,
) -> None:
    with fake_upstream(tmp_path, "chat") as chat:
        config = CONFIG.format(chat=chat.url, responses="http://127.0.0.1:9")
        options = ["--set", "llmitm_store=", "--set", "llmitm_responses_ttl=2"]
        with llmitm_proxy(tmp_path, config=config, extra=options, env=KEY_ENV) as proxy:
            client = openai.OpenAI(
                base_url=proxy.base_url(), api_key="k", max_retries=0, default_headers=ECHO
            )
            first = client.responses.create(model="over-chat", input="one")
            second = client.responses.create(
                model="over-chat", input="two", previous_response_id=first.id
            )
            assert client.responses.retrieve(second.id).output_text == "Echo: two"
            assert messages_sent(chat)[-1] == [user("one"), assistant("Echo: one"), user("two")]
            time.sleep(2.1)  # llmitm_responses_ttl=2: gone after two seconds
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(second.id)
        assert not (tmp_path / "llmitm.db").exists()
        no_default = ["--set", "llmitm_responses_store=false"]
        with llmitm_proxy(tmp_path / "b", config=config, extra=no_default, env=KEY_ENV) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url(), api_key="k", max_retries=0)
            unsaid = client.responses.create(model="over-chat", input="not stored")
            assert unsaid.store is False
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(unsaid.id)
            asked = client.responses.create(model="over-chat", input="stored", store=True)
            assert client.responses.retrieve(asked.id).store is True
