"""The local Responses API's sans-IO core: state paths, stored input items and their list
page (checklist 33), chains (31), the reasoning seal, and a background run (34) fed by a
scripted upstream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmitm.responses_api import answers
from llmitm.responses_api.background import BackgroundRun
from llmitm.responses_api.chain import history_items
from llmitm.responses_api.create import prepare_create
from llmitm.responses_api.items import PageError, input_items, list_page
from llmitm.responses_api.paths import classify_state_path, owner_url
from llmitm.responses_api.records import (
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponseOwner,
    ResponseSaved,
    StoredResponse,
)
from llmitm.responses_api.seal import ReasoningSeal, reasoning_text, restore_reasoning
from llmitm.routing.config import Endpoint
from llmitm.store import SqliteStore
from llmitm.store.memory_responses import MemoryResponses
from llmitm.translate.context import TranslationContext
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.wire.ids import CountingIds
from llmitm.wire.objects import response_object

# -- paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "action", "form"),
    [
        ("GET", "/v1/responses/resp_1", "retrieve", "openai"),
        ("GET", "/v1/responses/resp_1?stream=true&starting_after=3", "retrieve", "openai"),
        ("DELETE", "/v1/responses/resp_1", "delete", "openai"),
        ("GET", "/v1/responses/resp_1/input_items?limit=2", "input_items", "openai"),
        ("POST", "/v1/responses/resp_1/cancel", "cancel", "openai"),
        (
            "GET",
            "/openai/responses/resp_1?api-version=2025-04-01-preview",
            "retrieve",
            "azure-classic",
        ),
        ("DELETE", "/openai/v1/responses/resp_1", "delete", "azure-v1"),
        ("POST", "/gw/openai/v1/responses/resp_1/cancel", "cancel", "azure-v1"),
    ],
)
def test_state_paths_are_classified(method: str, path: str, action: str, form: str) -> None:
    call = classify_state_path(method, path)
    assert call is not None
    assert (call.action, call.response_id, call.form) == (action, "resp_1", form)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/responses"),
        ("POST", "/v1/responses/resp_1"),  # no such call
        ("GET", "/v1/responses/resp_1/cancel"),
        ("POST", "/v1/responses/input_tokens"),
        ("GET", "/v1/chat/completions/cmpl_1"),
    ],
)
def test_other_paths_are_not_state_calls(method: str, path: str) -> None:
    assert classify_state_path(method, path) is None


def test_owner_url_follows_the_endpoint_form() -> None:
    call = classify_state_path("GET", "/v1/responses/resp_9/input_items?limit=5&api-version=x")
    assert call is not None
    openai_ep = Endpoint("o", "openai", "https://api.example/v1", frozenset({"responses"}))
    assert (
        owner_url(openai_ep, call) == "https://api.example/v1/responses/resp_9/input_items?limit=5"
    )
    classic = Endpoint(
        "a",
        "azure",
        "https://r.openai.azure.com",
        frozenset({"responses"}),
        api_version="2024-10-21",
    )
    assert owner_url(classic, call) == (
        "https://r.openai.azure.com/openai/responses/resp_9/input_items"
        "?api-version=2025-04-01-preview&limit=5"
    )
    v1 = Endpoint("v", "azure", "https://r.openai.azure.com", frozenset({"responses"}))
    assert (
        owner_url(v1, call)
        == "https://r.openai.azure.com/openai/v1/responses/resp_9/input_items?limit=5"
    )


# -- input items and the list page (checklist 33) ---------------------------------------------


def test_input_items_get_types_ids_and_parts() -> None:
    ids = CountingIds()
    assert input_items("hi", ids) == [
        {
            "id": "msg_0001",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
            "status": "completed",
        }
    ]
    items = input_items(
        [
            {"role": "assistant", "content": "before"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {
                "id": "fc_own",
                "type": "function_call",
                "call_id": "c1",
                "name": "f",
                "arguments": "{}",
            },
        ],
        ids,
    )
    assert [i["id"] for i in items] == ["msg_0002", "fco_0003", "fc_own"]
    assert items[0]["content"] == [{"type": "output_text", "text": "before"}]


def test_check_33_input_items_limit_order_after_has_more() -> None:
    items = [{"id": f"i{k}"} for k in range(5)]  # stored oldest first

    def ids(page: dict[str, Any]) -> list[str]:
        return [item["id"] for item in page["data"]]

    first = list_page(items)
    assert ids(first) == ["i4", "i3", "i2", "i1", "i0"]  # desc by default
    assert (first["first_id"], first["last_id"], first["has_more"]) == ("i4", "i0", False)
    page = list_page(items, limit="2", order="asc")
    assert ids(page) == ["i0", "i1"] and page["has_more"] is True
    page = list_page(items, limit="2", order="asc", after=page["last_id"])
    assert ids(page) == ["i2", "i3"] and page["has_more"] is True
    page = list_page(items, limit="2", order="asc", after=page["last_id"])
    assert ids(page) == ["i4"] and page["has_more"] is False
    assert ids(list_page(items, limit="2", after="i3")) == ["i2", "i1"]
    assert list_page(items, after="nope") == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    for bad in ({"limit": "0"}, {"limit": "101"}, {"limit": "x"}, {"order": "up"}):
        with pytest.raises(PageError):
            list_page(items, **bad)


# -- chains (checklist 31) --------------------------------------------------------------------


def _record(
    rid: str, previous: str | None, said: str, answer: str, **response: Any
) -> StoredResponse:
    ids = CountingIds()
    output = [
        {
            "id": f"msg_{rid}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": answer, "annotations": []}],
        }
    ]
    body = response_object(response_id=rid, created_at=1, model="m", echo=response)
    body.update(output=output, status="completed", previous_response_id=previous)
    return StoredResponse(rid, body, input_items(said, ids), previous, 1.0)


def test_check_31_history_is_the_chain_in_order_without_instructions() -> None:
    chain = [
        _record("r1", None, "one", "1", instructions="old rule"),
        _record("r2", "r1", "two", "2"),
    ]
    items = history_items(chain)
    body = {"model": "m", "input": [*items, {"role": "user", "content": "three"}]}
    messages = responses_request_to_chat(body, TranslationContext().options).body["messages"]
    assert messages == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "three"},
    ]
    assert all("id" not in item for item in items)


async def test_check_31_sqlite_chain_branches_and_stops_at_a_deleted_ancestor(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        for record in (
            _record("r1", None, "1", "a"),
            _record("r2", "r1", "2", "b"),
            _record("r3", "r2", "3", "c"),
            _record("b3", "r2", "x", "y"),  # a branch from r2
        ):
            store.submit(ResponseSaved(record))
        assert [r.id for r in await store.chain("r3")] == ["r1", "r2", "r3"]
        assert [r.id for r in await store.chain("b3")] == ["r1", "r2", "b3"]
        assert await store.chain("nope") == []
        store.submit(ResponseDeleted("r1"))
        assert [r.id for r in await store.chain("r3")] == ["r2", "r3"]
        assert await store.response("r1") is None
        found = await store.items(["msg_r3", "msg_0001", "nope"])
        assert found["msg_r3"]["content"][0]["text"] == "c"
        assert set(found) == {"msg_r3", "msg_0001"}  # msg_0001: an input id r2 and r3 share
        store.submit(ResponseEvents("r3", ((0, b"a"), (1, b"b"), (2, b"c"))))
        assert await store.events("r3", after=0) == [b"b", b"c"]
        store.submit(ResponseOwned(ResponseOwner("resp_native", "azure", 1.0)))
        owner = await store.owner("resp_native")
        assert owner is not None and owner.endpoint == "azure"
        key = await store.seal_key()
        assert key is not None and len(key) == 32
    async with SqliteStore(tmp_path / "s.db") as again:
        assert await again.seal_key() == key  # one key for the life of the file


async def test_expired_responses_are_not_read(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        record = _record("r1", None, "1", "a")
        store.submit(ResponseSaved(StoredResponse(**{**_fields(record), "expires_at": 1.0})))
        assert await store.response("r1") is None


def _fields(record: StoredResponse) -> dict[str, Any]:
    return {name: getattr(record, name) for name in StoredResponse.__slots__}


# -- answers ------------------------------------------------------------------------------------


def test_answers_have_openai_shapes() -> None:
    assert answers.not_found("r").body == {
        "error": {
            "message": "Response with id 'r' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    assert answers.not_found("r").status == 404
    assert answers.deleted("r").body == {"id": "r", "object": "response", "deleted": True}
    record = _record("r1", None, "1", "a")
    refusal = answers.cancel_refusal(record)
    assert refusal is not None and refusal.status == 400
    assert answers.stream_refusal(record, None) is not None


# -- the seal ------------------------------------------------------------------------------------


def test_reasoning_seal_round_trip_and_refusals() -> None:
    seal = ReasoningSeal(b"k" * 32)
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I think."}]}
    token = seal.seal(item)
    assert "I think" not in token
    assert seal.open(token) == "I think."
    assert ReasoningSeal(b"o" * 32).open(token) is None  # another key: not ours
    middle = len(token) // 2  # inside the ciphertext: every bit of this character counts
    assert (
        seal.open(token[:middle] + ("Q" if token[middle] != "Q" else "A") + token[middle + 1 :])
        is None
    )
    assert seal.open("gAAAAABnot-a-token") is None
    assert seal.open(None) is None
    returned = [
        {"type": "reasoning", "summary": [], "encrypted_content": token},
        {"type": "reasoning", "summary": [], "encrypted_content": "foreign"},
        {"role": "assistant", "content": "answer"},
    ]
    assert restore_reasoning(returned, seal) == 1
    assert reasoning_text(returned[0]) == "I think."
    messages = responses_request_to_chat(
        {"model": "m", "input": [{"role": "user", "content": "q"}, *returned]},
        TranslationContext().options,
    ).body["messages"]
    assert messages[-1] == {
        "role": "assistant",
        "content": "answer",
        "reasoning_content": "I think.",
    }


# -- a background run (checklist 34) --------------------------------------------------------------


class ScriptedUpstream:
    """A chat stream written piece by piece, waiting on ``gate`` before the rest."""

    def __init__(self, pieces: list[bytes], status: int = 200, gate: asyncio.Event | None = None):
        self.status = status
        self.pieces = pieces
        self.gate = gate
        self.closed = False

    async def relay_body(
        self, write: Callable[[list[bytes]], None], drain: Callable[[], Awaitable[None]]
    ) -> None:
        try:
            for index, piece in enumerate(self.pieces):
                if index == 1 and self.gate is not None:
                    await self.gate.wait()
                write([piece])
                await drain()
        finally:
            self.closed = True


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def make_run(saved: list[dict[str, Any]], events: list[tuple[int, bytes]]) -> BackgroundRun:
    context = TranslationContext(model="m", response_id="resp_bg", echo={"background": True})
    queued = response_object(response_id="resp_bg", created_at=5, model="m", echo=context.echo)
    return BackgroundRun(
        queued, context, record_events=events.extend, record_state=lambda r: saved.append(r)
    )


async def test_check_34_background_run_completes_and_resumes_after_a_sequence() -> None:
    saved: list[dict[str, Any]] = []
    events: list[tuple[int, bytes]] = []
    run = make_run(saved, events)
    assert run.response["status"] == "queued"
    pieces = [
        chat_chunk({"role": "assistant", "content": "Hel"}),
        chat_chunk({"content": "lo"}),
        chat_chunk({}, "stop"),
        b"data: [DONE]\n\n",
    ]
    upstream = ScriptedUpstream(pieces)

    async def opener() -> ScriptedUpstream:
        return upstream

    await run.start(opener)
    assert [s["status"] for s in saved] == ["in_progress", "completed"]
    final = saved[-1]
    assert final["id"] == "resp_bg" and final["created_at"] == 5 and final["background"] is True
    frames = [orjson.loads(f.split(b"data: ", 1)[1]) for f in run.frames]
    assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
    assert [f["type"] for f in frames[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    assert frames[0]["response"]["status"] == "queued"
    assert frames[-1]["type"] == "response.completed"
    assert [seq for seq, _ in events] == list(range(len(frames)))
    resumed = [orjson.loads(f.split(b"data: ", 1)[1]) async for f in run.follow(after=4)]
    assert [f["sequence_number"] for f in resumed] == list(range(5, len(frames)))


async def test_check_34_cancel_stops_the_upstream_and_ends_cancelled() -> None:
    saved: list[dict[str, Any]] = []
    run = make_run(saved, [])
    gate = asyncio.Event()  # never set: the upstream hangs after its first piece
    upstream = ScriptedUpstream([chat_chunk({"content": "a"}), chat_chunk({}, "stop")], gate=gate)

    async def opener() -> ScriptedUpstream:
        return upstream

    task = run.start(opener)
    follower = asyncio.ensure_future(_collect(run))
    while len(run.frames) < 5:
        await asyncio.sleep(0.01)
    run.cancel()
    await asyncio.wait_for(task, 2)
    assert upstream.closed
    assert saved[-1]["status"] == "cancelled" and run.finished
    frames = await asyncio.wait_for(follower, 2)  # live readers end too
    assert frames == run.frames


async def test_upstream_error_fails_the_background_response() -> None:
    saved: list[dict[str, Any]] = []
    run = make_run(saved, [])
    body = b'{"error": {"message": "slow down", "type": "rate_limit_error", "code": null}}'

    async def opener() -> ScriptedUpstream:
        return ScriptedUpstream([body], status=429)

    await run.start(opener)
    assert saved[-1]["status"] == "failed"
    assert saved[-1]["error"]["code"] == "rate_limit_exceeded"


async def _collect(run: BackgroundRun) -> list[bytes]:
    return [frame async for frame in run.follow()]


def test_native_streams_name_their_response_id() -> None:
    """The owner of a native id is learned from the stream that minted it, whether relayed
    byte for byte (StreamGuard) or normalised (llama.cpp's Responses stream)."""
    from llmitm.translate.guard import StreamGuard
    from llmitm.translate.normalise import ResponsesNormaliser

    created = {"type": "response.created", "response": {"id": "resp_up", "output": []}}
    guard = StreamGuard("responses")
    guard.feed(b"event: response.created\ndata: " + orjson.dumps(created) + b"\n\n")
    assert guard.response_id == "resp_up"
    normaliser = ResponsesNormaliser()
    normaliser.feed(created)
    assert normaliser.response_id == "resp_up"


async def test_memory_responses_read_like_sqlite() -> None:
    memory = MemoryResponses()
    for record in (
        _record("r1", None, "1", "a"),
        _record("r2", "r1", "2", "b"),
        _record("b2", "r1", "x", "y"),
    ):
        memory.apply(ResponseSaved(record))
    assert [r.id for r in await memory.chain("b2")] == ["r1", "b2"]
    assert (await memory.items(["msg_r2"]))["msg_r2"]["content"][0]["text"] == "b"
    memory.apply(ResponseDeleted("r1"))
    assert [r.id for r in await memory.chain("r2")] == ["r2"]
    assert await memory.items(["msg_r1"]) == {}


# -- a create call before routing ------------------------------------------------------------------


async def test_prepare_create_inlines_the_chain_and_remembers_the_new_input() -> None:
    memory = MemoryResponses()
    memory.apply(ResponseSaved(_record("r1", None, "one", "1")))
    memory.apply(ResponseOwned(ResponseOwner("resp_native", "azure", 1.0)))
    seal = ReasoningSeal()

    async def sealer() -> ReasoningSeal:
        return seal

    body: dict[str, Any] = {"model": "m", "input": "two", "previous_response_id": "r1"}
    create, changed = await prepare_create(
        body, memory, sealer, store_default=True, ids=CountingIds()
    )
    assert changed and "previous_response_id" not in body
    assert [i.get("role") for i in body["input"]] == ["user", "assistant", "user"]
    assert create.previous_response_id == "r1" and create.store is True
    assert [i["content"][0]["text"] for i in create.input_items] == ["two"]  # only the new

    native = {"model": "m", "input": "x", "previous_response_id": "resp_native", "store": False}
    create, changed = await prepare_create(
        native, memory, sealer, store_default=True, ids=CountingIds()
    )
    assert not changed and native["previous_response_id"] == "resp_native"
    assert create.previous_owner == "azure" and create.store is False
    assert create.input_items == []  # not stored: nothing kept

    token = seal.seal({"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]})
    sealed = {
        "model": "m",
        "include": ["reasoning.encrypted_content"],
        "input": [{"type": "reasoning", "summary": [], "encrypted_content": token}],
    }
    create, changed = await prepare_create(
        sealed, memory, sealer, store_default=False, ids=CountingIds()
    )
    assert changed and create.include_encrypted and create.store is False
    assert sealed["input"][0]["content"] == [{"type": "reasoning_text", "text": "t"}]
