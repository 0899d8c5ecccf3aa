"""A database of every older schema — built from the migration steps before it and filled as
an llmitm of that schema filled it — opens read-only with today's code, upgrades, reads back
what it held, and takes today's writes beside it with whole chunk counts."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from llmitm.exchange.usage import UsageRecord
from llmitm.replay.model import Interaction, Message
from llmitm.responses_api.conversation_records import (
    ConversationItemsAdded,
    ConversationSaved,
    StoredConversation,
)
from llmitm.responses_api.records import ResponseSaved, StoredResponse
from llmitm.store import MIGRATIONS, SqliteStore
from llmitm.store.recordings import PruneRecordings, RecordingWrite

BODY = orjson.dumps({"model": "m", "input": [{"role": "user", "content": "long " * 400}]})
ITEMS = [{"id": "msg_old", "type": "message", "role": "user", "content": "long " * 400}]


def old_interaction(n: int) -> Interaction:
    return Interaction(
        id=f"{n:013x}abcdef",
        scope="global",
        key="k" * 16,
        key_version=1,
        method="POST",
        route="responses",
        model="m",
        stream=False,
        canonical_utf8=BODY,
        started_us=n,
        status=200,
        legs={
            "client_req": Message([("a", "1")], BODY, method="POST", url="http://x/v1/responses"),
            "client_resp": Message([], b'{"ok": true}', status=200),
        },
    )


def fill_by_hand(path: Path, version: int) -> None:
    """What an llmitm of ``version`` wrote where today's writers cannot: recordings before
    schema 4, Responses state before 6."""
    with sqlite3.connect(path) as db:
        if 2 <= version < 6:
            db.execute(
                "INSERT INTO responses (id, response, input_items, previous_response_id, "
                "created_at) VALUES ('resp_old', ?, ?, NULL, 1.0)",
                (orjson.dumps({"id": "resp_old", "output": []}), orjson.dumps(ITEMS)),
            )
            db.execute(
                "INSERT INTO response_items (item_id, response_id, item) "
                "VALUES ('msg_old', 'resp_old', ?)",
                (orjson.dumps(ITEMS[0]),),
            )
        if version == 3:
            i = old_interaction(1)
            db.execute(
                "INSERT INTO rec_interactions (id, session, started_us, scope, match_key, "
                "match_key_version, method, route, model, stream, canonical, status, endpoint, "
                "plan, mode) VALUES (?, '', 1, 'global', ?, 1, 'POST', 'responses', 'm', 0, ?, "
                "200, '', '', 'record')",
                (i.id, i.key, i.canonical),
            )
            for leg, message in i.legs.items():
                digest = f"d-{leg}"
                db.execute(
                    "INSERT INTO rec_blobs (sha256, size, data) VALUES (?, ?, ?)",
                    (digest, len(message.content or b""), message.content),
                )
                db.execute(
                    "INSERT INTO rec_messages (interaction_id, leg, method, url, status, "
                    "headers_json, body_sha256) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (i.id, leg, message.method, message.url, message.status,
                     orjson.dumps(message.headers).decode(), digest),
                )  # fmt: skip


@pytest.mark.parametrize("version", range(1, len(MIGRATIONS)))
async def test_an_older_schema_upgrades_and_keeps_what_it_held(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / f"v{version}.db"
    async with SqliteStore(path, migrations=MIGRATIONS[:version]) as old:
        assert old.schema_version == version
        old.submit(UsageRecord(datetime(2025, 1, 1, tzinfo=UTC), "e", "m", "r", 10))
        if version >= 4:
            old.submit(RecordingWrite(old_interaction(1)))
        if version >= 6:
            record = StoredResponse("resp_old", {"id": "resp_old", "output": []}, ITEMS, None, 1.0)
            old.submit(ResponseSaved(record))
        if version >= 7:
            old.submit(ConversationSaved(StoredConversation("conv_old", 1.0)))
            old.submit(ConversationItemsAdded("conv_old", tuple(ITEMS)))
        await old.flush()
    fill_by_hand(path, version)
    recorded = version >= 3

    async with SqliteStore(path, read_only=True) as reader:  # today's code, not migrated
        assert reader.schema_version == version
        loaded = await reader.load_recordings()
        assert [i.legs["client_req"].content for i in loaded] == ([BODY] if recorded else [])

    async with SqliteStore(path) as store:
        assert store.schema_version == len(MIGRATIONS)
        assert [row.requests for row in await store.usage_rows()] == [1]
        (before,) = await store.load_recordings() if recorded else [old_interaction(1)]
        assert before.canonical == BODY.decode()
        assert {leg: m.content for leg, m in before.legs.items()} == {
            "client_req": BODY,
            "client_resp": b'{"ok": true}',
        }
        if version >= 2:
            kept = await store.response("resp_old")
            assert kept is not None and kept.input_items == ITEMS
            assert await store.items(["msg_old"]) == {"msg_old": ITEMS[0]}
        if version >= 7:
            assert await store.conversation_items("conv_old") == ITEMS
        # Today's writes beside the old rows: the same body, now a chunk, then the old
        # recording pruned; the new one reads back whole.
        store.submit(RecordingWrite(old_interaction(2)))
        store.submit(PruneRecordings(before_us=2))
        await store.flush()
        (today,) = await store.load_recordings()
        assert today.legs["client_req"].content == BODY
        assert await store.content_problems() == []
