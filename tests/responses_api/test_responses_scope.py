"""Stored Responses state belongs to the credential that created it (issue 14, point 9): the
store's scoped reads (memory and SQLite, and a database from before the owner column), the
create call's refusal of another credential's ``previous_response_id``, the configuration
option, and the local Responses API addon answering state calls as mitmproxy hands them over.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.compaction import LlmCompaction
from llmitm.addons.responses_api import LlmResponsesApi
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import RESPONSES_CREATE_KEY
from llmitm.replay.fingerprint import fingerprint
from llmitm.responses_api.create import prepare_create
from llmitm.responses_api.records import (
    ResponseOwned,
    ResponseOwner,
    ResponseReader,
    ResponseSaved,
    StoredResponse,
)
from llmitm.responses_api.scope import ANONYMOUS, creator, reader_credential
from llmitm.responses_api.seal import ReasoningSeal
from llmitm.routing.config import ConfigError, parse_config
from llmitm.store import SqliteStore
from llmitm.store.memory_responses import MemoryResponses
from llmitm.store.migrations import MIGRATIONS
from llmitm.wire.ids import CountingIds

KEY = b"k" * 32
ALICE = fingerprint(KEY, "sk-alice")
BOB = fingerprint(KEY, "sk-bob")


def record(rid: str, credential: str | None, previous: str | None = None) -> StoredResponse:
    text = [{"type": "input_text", "text": f"said in {rid}"}]
    item = {"id": f"msg_{rid}", "type": "message", "role": "user", "content": text}
    return StoredResponse(
        id=rid,
        response={"id": rid, "object": "response", "status": "completed", "output": []},
        input_items=[item],
        previous_response_id=previous,
        created_at=1.0,
        credential=credential,
    )


# -- who a request is ----------------------------------------------------------------------


def test_the_creator_is_the_credentials_fingerprint_wherever_it_was_sent() -> None:
    bearer = creator([("Authorization", "Bearer sk-alice")], KEY)
    assert bearer == ALICE
    assert creator([("api-key", "sk-alice")], KEY) == ALICE  # Azure's header: the same key
    assert creator([("authorization", "Bearer sk-bob")], KEY) == BOB != ALICE
    assert creator([("accept", "*/*")], KEY) == ANONYMOUS
    assert "sk-alice" not in bearer


def test_shared_scope_reads_everyones_and_credential_scope_only_its_own() -> None:
    assert reader_credential("credential", ALICE) == ALICE
    assert reader_credential("shared", ALICE) is None


def test_the_option_is_read_from_the_llmitm_table() -> None:
    assert parse_config({}, "f", {}).settings.responses_scope == "credential"
    shared = parse_config({"llmitm": {"responses_scope": "shared"}}, "f", {})
    assert shared.settings.responses_scope == "shared"
    with pytest.raises(ConfigError, match=r"llmitm\.responses_scope: expected one of credential"):
        parse_config({"llmitm": {"responses_scope": "open"}}, "f", {})


# -- the store's scoped reads ----------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
async def reader(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ResponseReader]:
    writes = [
        ResponseSaved(record("resp_a1", ALICE)),
        ResponseSaved(record("resp_a2", ALICE, "resp_a1")),
        ResponseSaved(record("resp_b1", BOB, "resp_a2")),  # a shared proxy let Bob chain
        ResponseSaved(record("resp_old", None)),
        ResponseOwned(ResponseOwner("resp_native", "openai", 1.0, None, ALICE)),
    ]
    if request.param == "memory":
        memory = MemoryResponses()
        for write in writes:
            memory.apply(write)
        yield memory
        return
    async with SqliteStore(tmp_path / "s.db") as store:
        for write in writes:
            store.submit(write)
        yield store


async def test_a_response_is_read_only_by_its_credential_or_a_shared_reader(
    reader: ResponseReader,
) -> None:
    assert (await reader.response("resp_a1", ALICE)) is not None
    assert (await reader.response("resp_a1", BOB)) is None
    assert (await reader.response("resp_a1", ANONYMOUS)) is None
    shared = await reader.response("resp_a1")
    assert shared is not None and shared.credential == ALICE


async def test_a_row_without_an_owner_is_read_only_when_shared(reader: ResponseReader) -> None:
    assert (await reader.response("resp_old", ALICE)) is None
    assert (await reader.response("resp_old", ANONYMOUS)) is None
    assert (await reader.response("resp_old")) is not None


async def test_a_chain_stops_at_an_ancestor_of_another_credential(
    reader: ResponseReader,
) -> None:
    assert [r.id for r in await reader.chain("resp_a2", credential=ALICE)] == ["resp_a1", "resp_a2"]
    assert [r.id for r in await reader.chain("resp_b1", credential=BOB)] == ["resp_b1"]
    assert await reader.chain("resp_a2", credential=BOB) == []
    assert [r.id for r in await reader.chain("resp_b1")] == ["resp_a1", "resp_a2", "resp_b1"]


async def test_item_references_resolve_only_to_the_credentials_items(
    reader: ResponseReader,
) -> None:
    assert set(await reader.items(["msg_resp_a1", "msg_resp_b1"], ALICE)) == {"msg_resp_a1"}
    assert set(await reader.items(["msg_resp_a1", "msg_resp_b1"], BOB)) == {"msg_resp_b1"}
    assert set(await reader.items(["msg_resp_a1", "msg_resp_b1"])) == {
        "msg_resp_a1",
        "msg_resp_b1",
    }


async def test_a_native_ids_owner_keeps_its_creator(reader: ResponseReader) -> None:
    owner = await reader.owner("resp_native")
    assert owner is not None and (owner.endpoint, owner.credential) == ("openai", ALICE)


async def test_a_database_from_before_the_owner_column_migrates_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    async with SqliteStore(path, migrations=MIGRATIONS[:5]) as old:
        assert old.schema_version == 5
    with sqlite3.connect(path) as db:  # what an llmitm of schema 5 wrote
        db.execute(
            "INSERT INTO responses (id, response, input_items, previous_response_id, created_at)"
            " VALUES ('resp_v5', ?, '[]', NULL, 1.0)",
            (orjson.dumps({"id": "resp_v5", "object": "response"}),),
        )
        db.execute(
            "INSERT INTO response_owners (id, endpoint, created_at) VALUES ('resp_n5', 'e', 1.0)"
        )
    async with SqliteStore(path) as store:
        assert store.schema_version == len(MIGRATIONS) >= 6
        kept = await store.response("resp_v5")
        assert kept is not None and kept.credential is None
        assert await store.response("resp_v5", ALICE) is None
        owner = await store.owner("resp_n5")
        assert owner is not None and owner.credential is None
        store.submit(ResponseSaved(record("resp_v6", ALICE)))
        assert (await store.response("resp_v6", ALICE)) is not None


# -- a create call continuing someone else's response ------------------------------------------


async def _prepare(
    body: dict[str, Any], reader: ResponseReader, credential: str | None
) -> tuple[Any, dict[str, Any]]:
    async def seal() -> ReasoningSeal:
        return ReasoningSeal(KEY)

    create, _changed = await prepare_create(
        body,
        reader,
        seal,
        store_default=True,
        ids=CountingIds(),
        credential=credential,
    )
    return create, body


@pytest.mark.parametrize("previous", ["resp_a2", "resp_native", "resp_old"])
async def test_another_credentials_previous_response_is_refused_not_inlined(
    reader: ResponseReader, previous: str
) -> None:
    create, body = await _prepare({"input": "hi", "previous_response_id": previous}, reader, BOB)
    assert create.previous_foreign is True
    assert create.previous_owner is None
    assert body == {"input": "hi", "previous_response_id": previous}


async def test_the_owner_and_a_shared_reader_continue_it(reader: ResponseReader) -> None:
    for credential in (ALICE, None):
        create, body = await _prepare(
            {"input": "hi", "previous_response_id": "resp_a2"}, reader, credential
        )
        assert not create.previous_foreign
        assert "previous_response_id" not in body and len(body["input"]) == 3
        native, _ = await _prepare(
            {"input": "hi", "previous_response_id": "resp_native"}, reader, credential
        )
        assert (native.previous_foreign, native.previous_owner) == (False, "openai")


async def test_an_unknown_previous_response_is_not_called_foreign(reader: ResponseReader) -> None:
    create, body = await _prepare({"input": "hi", "previous_response_id": "resp_x"}, reader, BOB)
    assert not create.previous_foreign and create.previous_owner is None
    assert body["previous_response_id"] == "resp_x"  # request mapping answers its 400


# -- the addon on flows ---------------------------------------------------------------------

CONFIG = """
{llmitm}
[endpoints.chat]
kind = "compatible"
base_url = "http://127.0.0.1:1/v1"
apis = ["chat"]

[endpoints.native]
kind = "openai"
base_url = "https://native.example/v1"
apis = ["responses"]
api_key_env = "LLMITM_SCOPE_TEST_KEY"

[[routes]]
models = ["*"]
endpoints = ["chat"]
"""


@pytest.fixture
def addon_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def start(llmitm: str = "") -> Any:
        monkeypatch.setenv("LLMITM_SCOPE_TEST_KEY", "sk-endpoint")
        path = tmp_path / "llmitm.toml"
        path.write_text(CONFIG.format(llmitm=llmitm))
        addons = make_addons()
        api = next(a for a in addons if isinstance(a, LlmResponsesApi))
        settings = next(a for a in addons if isinstance(a, LlmitmSettings))
        context = taddons.context(*addons)
        tctx = context.__enter__()
        tctx.options.update(llmitm_store="")
        tctx.configure(settings, llmitm_config=str(path))
        started.append(context)
        loaded.append(addons)
        return api

    loaded: list[list[Any]] = []
    start.loaded = loaded  # type: ignore[attr-defined]

    started: list[Any] = []
    yield start
    for context in started:
        context.__exit__(None, None, None)


def call(method: str, path: str, key: str | None, body: Any = None) -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = method
    flow.request.url = f"https://api.openai.com{path}"
    if key is not None:
        flow.request.headers["authorization"] = f"Bearer {key}"
    flow.request.content = orjson.dumps(body) if body is not None else b""
    return flow


async def seed(api: LlmResponsesApi) -> None:
    alice = await api.state.creator(call("GET", "/", "sk-alice"))
    memory = api.state.memory
    memory.apply(ResponseSaved(record("resp_a1", alice)))
    memory.apply(ResponseOwned(ResponseOwner("resp_n1", "native", 1.0, None, alice)))


STATE_CALLS = [
    ("GET", "/v1/responses/resp_a1"),
    ("GET", "/v1/responses/resp_a1?stream=true&starting_after=0"),
    ("GET", "/v1/responses/resp_a1/input_items"),
    ("POST", "/v1/responses/resp_a1/cancel"),
    ("DELETE", "/v1/responses/resp_a1"),
]


def assert_not_found(flow: http.HTTPFlow, rid: str) -> None:
    assert flow.response is not None and flow.response.status_code == 404
    assert orjson.loads(flow.response.content or b"") == {
        "error": {
            "message": f"Response with id '{rid}' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


@pytest.mark.parametrize(("method", "path"), STATE_CALLS)
@pytest.mark.parametrize("key", ["sk-bob", None], ids=["other-key", "no-key"])
async def test_state_calls_of_another_credential_get_openais_404(
    addon_context: Any, method: str, path: str, key: str | None
) -> None:
    api = addon_context()
    await seed(api)
    flow = call(method, path, key)
    await api.request(flow)
    assert_not_found(flow, "resp_a1")
    assert await api.state.memory.response("resp_a1") is not None  # a DELETE deleted nothing


@pytest.mark.parametrize("llmitm", ["", '[llmitm]\nresponses_scope = "shared"'])
async def test_the_owner_reads_and_deletes_and_shared_lets_anyone(
    addon_context: Any, llmitm: str
) -> None:
    api = addon_context(llmitm)
    await seed(api)
    key = "sk-bob" if llmitm else "sk-alice"
    got = call("GET", "/v1/responses/resp_a1", key)
    await api.request(got)
    assert got.response is not None and got.response.status_code == 200
    assert orjson.loads(got.response.content or b"")["id"] == "resp_a1"
    gone = call("DELETE", "/v1/responses/resp_a1", key)
    await api.request(gone)
    assert gone.response is not None and gone.response.status_code == 200


@pytest.mark.parametrize("key", ["sk-bob", None], ids=["other-key", "no-key"])
async def test_a_native_id_goes_to_its_endpoint_only_for_its_creator(
    addon_context: Any, key: str | None
) -> None:
    api = addon_context()
    await seed(api)
    foreign = call("GET", "/v1/responses/resp_n1", key)
    await api.request(foreign)
    assert_not_found(foreign, "resp_n1")
    own = call("GET", "/v1/responses/resp_n1", "sk-alice")
    await api.request(own)
    assert own.response is None  # sent on, with the endpoint's key instead of the client's
    assert own.request.url == "https://native.example/v1/responses/resp_n1"
    assert own.request.headers["authorization"] == "Bearer sk-endpoint"


@pytest.mark.parametrize("previous", ["resp_a1", "resp_n1"])
async def test_continuing_another_credentials_response_is_openais_400(
    addon_context: Any, previous: str
) -> None:
    api = addon_context()
    await seed(api)
    body = {"model": "m", "input": "hi", "previous_response_id": previous}
    flow = call("POST", "/v1/responses", "sk-bob", body)
    await api.request(flow)
    assert flow.response is not None and flow.response.status_code == 400
    error = orjson.loads(flow.response.content or b"")["error"]
    assert (error["code"], error["param"]) == (
        "previous_response_not_found",
        "previous_response_id",
    )
    mine = call("POST", "/v1/responses", "sk-alice", body)
    await api.request(mine)
    assert mine.response is None


async def test_a_compact_call_on_another_credentials_response_is_openais_400(
    addon_context: Any,
) -> None:
    api = addon_context()
    await seed(api)
    compaction = next(a for a in addon_context.loaded[-1] if isinstance(a, LlmCompaction))
    body = {"model": "m", "input": [], "previous_response_id": "resp_a1"}
    foreign = call("POST", "/v1/responses/compact", "sk-bob", body)
    pending = compaction.request(foreign)
    assert pending is not None
    await pending
    assert foreign.response is not None and foreign.response.status_code == 400
    assert orjson.loads(foreign.response.content or b"")["error"]["param"] == "previous_response_id"
    own = call("POST", "/v1/responses/compact", "sk-alice", body)
    pending = compaction.request(own)
    assert pending is not None
    await pending
    assert own.response is None  # the summary request goes on, with alice's turn in it
    assert b"said in resp_a1" in (own.request.content or b"")


async def test_a_resent_history_reuses_its_stored_items_only_for_the_same_credential(
    addon_context: Any,
) -> None:
    # What a turn stored for its items is taken up by the next turn that resends them, as
    # the growing parse hands them back; another credential's next turn makes its own.
    api = addon_context()
    history: list[dict[str, Any]] = [{"role": "user", "content": "start " * 2000}]

    async def turn(key: str) -> list[dict[str, Any]]:
        flow = call("POST", "/v1/responses", key, {"model": "m", "input": history})
        await api.request(flow)
        assert flow.response is None  # on its way upstream, with its create call noted
        return flow.metadata[RESPONSES_CREATE_KEY].input_items

    async def made_anew(key: str) -> list[dict[str, Any]]:
        creator = await api.state.creator(call("GET", "/", key))
        create, _ = await prepare_create(
            orjson.loads(orjson.dumps({"model": "m", "input": history})),
            api.state.memory,
            api.state.seal,
            store_default=True,
            ids=CountingIds(),
            credential=api.state.credential(creator),
            history_ids=True,
        )
        return create.input_items

    first = await turn("sk-alice")
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    second = await turn("sk-alice")
    assert second[0] is first[0]
    assert orjson.dumps(second) == orjson.dumps(await made_anew("sk-alice"))
    history.append({"role": "user", "content": "again"})
    other = await turn("sk-bob")
    assert not any(a is b for a, b in zip(other, second, strict=False))
    assert orjson.dumps(other) == orjson.dumps(await made_anew("sk-bob"))
