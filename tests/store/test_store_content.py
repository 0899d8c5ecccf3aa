"""Content-addressed storage: a conversation that resends its history costs what it adds, and
the sharing is invisible — bodies, canonical texts and Responses state read back byte for
byte, export and import give the folder the store of before gave, prune and TTLs free the
chunks nothing uses any more, and no reference ever dangles."""

from __future__ import annotations

import itertools
import random
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmitm.replay.model import Interaction, Message
from llmitm.responses_api.records import (
    ResponseDeleted,
    ResponseReader,
    ResponseSaved,
    ResponsesPurged,
    StoredResponse,
)
from llmitm.store import MIGRATIONS, SqliteStore, Store, content, content_chunks
from llmitm.store.folder import read_folder, write_folder
from llmitm.store.memory_responses import MemoryResponses
from llmitm.store.raw_values import database_values
from llmitm.store.recordings import DeleteRecordings, PruneRecordings, RecordingWrite
from llmitm.wire.shared_bytes import common_prefix, common_suffix
from tests.store.backends import Backend

WORDS = ["agent", "tool", "call", "result", "file", "patch", "test", "build", "error", "trace"]
INSTRUCTIONS = "You are a coding agent. " * 60
TOOLS = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in "abc"]
CHUNKED = len(MIGRATIONS)
BEFORE = 7  # the last schema without the chunk table
EXPIRES = 4e9  # turn t's response expires at EXPIRES + t (2096: only purges given a time end it)


def text(rng: random.Random, size: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(size // 6))


class Conversation:
    """An agent's turns: each resends the history, adds a user message and the answer."""

    def __init__(self, seed: int = 1, new_bytes: int = 3000) -> None:
        self.rng = random.Random(seed)
        self.new_bytes = new_bytes
        self.history: list[dict[str, Any]] = []
        self.turn = 0

    def next(self) -> tuple[Interaction, StoredResponse]:
        self.turn += 1
        t = self.turn
        self.history.append({"role": "user", "content": text(self.rng, self.new_bytes)})
        body = orjson.dumps(
            {"model": "m", "instructions": INSTRUCTIONS, "input": self.history, "tools": TOOLS}
        )
        chat = orjson.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": INSTRUCTIONS},
                    *({"role": h["role"], "content": h["content"]} for h in self.history),
                ],
            }
        )
        answer = f"Echo: {self.history[-1]['content'][:200]}"
        output = [
            {
                "id": f"msg_out{t}",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": answer}],
            }
        ]
        self.history.append({"role": "assistant", "content": answer})
        interaction = Interaction(
            id=f"{t:013x}abcdef",
            scope="global",
            key=f"{t:016x}",
            key_version=1,
            method="POST",
            route="responses",
            model="m",
            stream=False,
            canonical_utf8=orjson.dumps({"input": self.history[:-1], "model": "m"}),
            started_us=t,
            status=200,
            legs={
                "client_req": Message([("content-type", "application/json")], body,
                                      method="POST", url="http://x/v1/responses"),
                "upstream_req": Message([], chat, method="POST",
                                        url="http://up/v1/chat/completions"),
                "upstream_resp": Message([], orjson.dumps({"answer": answer}), status=200),
                "client_resp": Message([], orjson.dumps({"output": output}), status=200),
            },
        )  # fmt: skip
        items = [
            {"id": f"msg_{self.rng.getrandbits(64):016x}", "type": "message", **h}
            for h in self.history[:-1]
        ]
        items[0] = {"type": "message", "id": items[0]["id"], **self.history[0]}  # id not first
        response = {"id": f"resp_{t}", "object": "response", "instructions": INSTRUCTIONS,
                    "output": output, "tools": TOOLS}  # fmt: skip
        record = StoredResponse(f"resp_{t}", response, items, None, float(t), EXPIRES + t)
        return interaction, record


async def check(store: Store) -> list[str]:
    return await store.content_problems()


def test_a_value_is_put_back_byte_for_byte_whatever_it_is() -> None:
    rng = random.Random(7)
    bases = content.Bases()
    stored: dict[bytes, tuple[str, bytes]] = {}
    values = [
        b"",
        b"tiny",
        bytes(rng.getrandbits(8) for _ in range(5000)),  # not JSON at all
        b'{"a": "' + b'x\\"y' * 400 + b'", "b": [1, 2]}',  # escapes inside a long string
        b'["' + b"a" * 600 + b'", "' + b"a" * 600 + b'"]',  # the same long string twice
    ]
    growing = b'{"input": ['
    for turn in range(30):
        growing = growing.rstrip(b"]}") + (b", " if turn else b"")
        growing += orjson.dumps({"role": "user", "content": text(rng, 900)}) + b"]}"
        values.append(growing)
        values.append(growing[5:])  # no shared prefix with the last one, a long suffix
    for value in values:
        base, prefix, suffix = content.best_base(value, bases.candidates("lane"))
        encoded = content.encode(value, base, prefix, suffix)
        for chunk in encoded.chunks:
            stored[chunk.name] = (chunk.kind, chunk.data)
        bases.remember("lane", encoded.name, value, base.depth + 1 if base else 0)
        assert content.assemble(encoded.name, stored.__getitem__, {}) == value
    # Each turn of the growing value added ~1 KB; a recipe holds only that.
    recipes = [data for kind, data in stored.values() if kind == content.RECIPE]
    assert recipes and max(len(r) for r in recipes) < 2_500


def test_a_value_given_as_parts_is_put_back_byte_for_byte() -> None:
    # A stored history as the store gets it: each resent item the same bytes object turn
    # after turn. Also an item changed in place, the same value as bytes after parts (and
    # back), and parts cut anywhere (inside strings, empty ones): what parts share is never
    # more than what their bytes share, and each turn's recipe holds only what it adds.
    rng = random.Random(11)
    bases = content.Bases()
    stored: dict[bytes, tuple[str, bytes]] = {}
    items: list[bytes] = []
    values: list[tuple[content.Value, bool]] = []  # (value, plain growth of the one before)
    for turn in range(40):
        items.append(orjson.dumps({"role": "user", "content": text(rng, rng.choice([30, 900]))}))
        edited = turn % 7 == 3
        if edited:
            items[rng.randrange(len(items))] = orjson.dumps({"edited": text(rng, 700)})
        parts = [b"[", *(p for item in items for p in (item, b","))]
        parts[-1] = b"]"
        values.append((content.Joined(parts), not edited and turn > 0))
        whole = b"".join(parts)
        if turn % 5 == 0:
            values.append((whole, False))
        if turn % 6 == 0:
            cuts = [0, *sorted(rng.sample(range(len(whole)), 12)), len(whole), len(whole)]
            cut = [whole[a:b] for a, b in itertools.pairwise(cuts)]
            values.append((content.Joined(cut), False))
    added: list[int] = []
    for value, grown in values:
        whole = bytes(value)
        for _ in range(5):
            a, b = sorted(rng.randrange(len(whole) + 1) for _ in range(2))
            if isinstance(value, content.Joined):
                assert value.between(a, b) == whole[a:b]
        candidates = bases.candidates("lane")
        base, prefix, suffix = content.best_base(value, candidates)
        if base is not None:
            other = bytes(base.data)
            assert prefix + suffix <= min(len(whole), len(other))
            assert whole[:prefix] == other[:prefix]
            assert whole[len(whole) - suffix :] == other[len(other) - suffix :]
            as_bytes = content.shared_ends(whole, content.Recent(b"", other, 0))
            assert prefix + suffix <= sum(as_bytes)
            if grown and isinstance(base.data, content.Joined):
                assert (prefix, suffix) == as_bytes
        encoded = content.encode(value, base, prefix, suffix)
        new = [c for c in encoded.chunks if c.name not in stored]
        for chunk in encoded.chunks:
            stored[chunk.name] = (chunk.kind, chunk.data)
        bases.remember("lane", encoded.name, value, base.depth + 1 if base else 0)
        assert content.assemble(encoded.name, stored.__getitem__, {}) == whole
        if grown and base is not None and isinstance(base.data, content.Joined):
            added.append(sum(len(c.data) for c in new) - len(items[-1]))
    assert added and max(added) < 200  # a recipe's ops and framing, besides the new item


def test_a_base_is_found_by_what_it_shares_whatever_its_ends_look_like() -> None:
    # Candidates sharing nothing are passed over by their ends alone; what is shared across
    # those ends (a prefix, a suffix, or half of it on each side) still finds its base.
    rng = random.Random(3)
    body = text(rng, 6000).encode()
    other = text(rng, 6000).encode()

    def measured(data: bytes, candidate: bytes) -> int:
        p = common_prefix(data, candidate)
        return p + common_suffix(data, candidate, min(len(data), len(candidate)) - p)

    cases = {
        "prefix": body[:3000] + other[:3000],
        "suffix": other[:3000] + body[3000:],
        "300 each side": body[:300] + other[:3000] + body[-300:],
        "200 before, 400 after": body[:200] + other[:3000] + body[-400:],
        "255 each side": body[:255] + other[:3000] + body[-255:],
        "nothing": other,
    }
    for name, data in cases.items():
        values = [text(rng, 5000).encode(), body, text(rng, 5000).encode()]
        candidates = [content.Recent(b"n%d" % i, value, 0) for i, value in enumerate(values)]
        base, prefix, suffix = content.best_base(data, candidates)
        shared = measured(data, body)
        if shared >= content.MIN_SHARED:
            assert base is candidates[1] and prefix + suffix == shared, name
        else:
            assert base is None, name


async def test_a_conversation_stores_what_it_adds_and_reads_back_identical(
    backend: Backend,
) -> None:
    conversation = Conversation()
    sent: list[Interaction] = []
    records: list[StoredResponse] = []
    sizes: list[int] = []
    async with backend.store() as store:
        for _ in range(30):
            interaction, record = conversation.next()
            sent.append(interaction)
            records.append(record)
            store.submit(RecordingWrite(interaction))
            store.submit(ResponseSaved(record))
            await store.flush()
            sizes.append(backend.payload())
        loaded = await store.load_recordings()
        assert [legs(i) for i in loaded] == [legs(i) for i in sent]
        assert [i.canonical for i in loaded] == [i.canonical for i in sent]
        assert [i.canonical for i in await store.recordings()] == [i.canonical for i in sent]
        for record in records:
            assert await store.response(record.id) == record
        items = await store.items(["msg_out3", records[4].input_items[2]["id"]])
        assert items == {
            "msg_out3": records[2].response["output"][0],
            records[4].input_items[2]["id"]: records[4].input_items[2],
        }
        assert await check(store) == []
    # What each late turn adds: a ~3 KB user message and a short answer (both in the
    # Responses body, the chat body, the canonical text and the stored input), ~200 bytes of
    # ids and a row per item. Before, each turn stored its whole history four times.
    growth = [b - a for a, b in itertools.pairwise(sizes[19:])]
    assert max(growth) < 2 * conversation.new_bytes + 6_000


async def test_a_canonical_text_goes_to_the_chunks_and_back_as_bytes(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A resent history's canonical text is as long as the history; with a character past
    # ASCII in it (a model's dash), decoding it costs the writer ~0.5 ms at 400 KB a turn.
    conversation = Conversation()
    sent = [conversation.next()[0] for _ in range(3)]
    for interaction in sent:
        interaction.canonical_utf8 = interaction.canonical_utf8.replace(b'"m"', '"m—é"'.encode())

    def decoded(_: Interaction) -> str:
        raise AssertionError("the canonical text was decoded on its way to the store")

    async with backend.store() as store:
        with monkeypatch.context() as patched:
            patched.setattr(Interaction, "canonical", property(decoded))
            for interaction in sent:
                store.submit(RecordingWrite(interaction))
                await store.flush()
            assert store.stats().failed == 0
            loaded = await store.load_recordings()
        assert [i.canonical_utf8 for i in loaded] == [i.canonical_utf8 for i in sent]
        assert "m—é" in loaded[-1].canonical


def legs(interaction: Interaction) -> dict[str, tuple[Any, ...]]:
    return {
        leg: (m.method, m.url, m.status, m.headers, m.body()) for leg, m in interaction.legs.items()
    }


async def test_prune_in_parts_keeps_the_rest_intact_and_frees_what_nothing_uses(
    backend: Backend,
) -> None:
    conversation = Conversation(seed=2)
    turns = [conversation.next() for _ in range(12)]
    async with backend.store() as store:
        for interaction, record in turns:
            store.submit(RecordingWrite(interaction))
            store.submit(ResponseSaved(record))
        await store.flush()
        full = backend.count("store_chunks")
        # The oldest third, then one from the middle (later turns slice it), then one response.
        store.submit(PruneRecordings(before_us=5))
        store.submit(DeleteRecordings((turns[7][0].id,)))
        store.submit(ResponseDeleted(turns[3][1].id))
        await store.flush()
        kept = [i for i, _ in turns[4:] if i.id != turns[7][0].id]
        assert [legs(i) for i in await store.load_recordings()] == [legs(i) for i in kept]
        assert await store.response(turns[3][1].id) is None
        assert await store.response(turns[9][1].id) == turns[9][1]
        assert await check(store) == []
        assert backend.count("store_chunks") < full
        # Expired responses go with a purge, every recording with a prune: nothing is left.
        store.submit(ResponsesPurged(now=EXPIRES + 10_000))
        store.submit(PruneRecordings(before_us=1 << 62))
        await store.flush()
        assert await store.load_recordings() == []
        assert await check(store) == []
        assert backend.count("store_chunks") == 0


async def test_export_and_import_give_the_folder_the_old_store_gave(tmp_path: Path) -> None:
    conversation = Conversation(seed=3)
    turns = [conversation.next()[0] for _ in range(8)]
    folders = {}
    for name, steps in (("before", MIGRATIONS[:BEFORE]), ("chunked", MIGRATIONS)):
        async with SqliteStore(tmp_path / f"{name}.db", migrations=steps) as store:
            for interaction in turns:
                store.submit(RecordingWrite(interaction))
            await store.flush()
            folders[name] = tmp_path / name
            write_folder(folders[name], await store.load_recordings(), timing="exact")
    assert files(folders["chunked"]) == files(folders["before"])
    # That folder imported into each store and exported again: the same folder from both.
    again = {}
    for name, steps in (("before", MIGRATIONS[:BEFORE]), ("chunked", MIGRATIONS)):
        async with SqliteStore(tmp_path / f"imported-{name}.db", migrations=steps) as store:
            for interaction in read_folder(folders["chunked"]):
                store.submit(RecordingWrite(interaction))
            await store.flush()
            again[name] = tmp_path / f"again-{name}"
            write_folder(again[name], await store.load_recordings(), timing="exact")
            if name == "chunked":
                assert await check(store) == []
    assert files(again["chunked"]) == files(again["before"])


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.json"))}


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def responses(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        memory = MemoryResponses()
        yield memory, memory.apply
        return
    backend = request.getfixturevalue("pg_backend") if request.param == "postgresql" else None
    store = backend.store() if backend is not None else SqliteStore(tmp_path / "r.db")
    async with store:
        yield store, store.submit


async def test_resent_histories_read_back_as_they_were_saved(responses: Any) -> None:
    reader, submit = responses
    assert isinstance(reader, ResponseReader)
    conversation = Conversation(seed=4)
    records = [conversation.next()[1] for _ in range(10)]
    for record in records:
        submit(ResponseSaved(record))
    chained = StoredResponse("resp_next", {"id": "resp_next", "output": []}, [], "resp_10", 11.0)
    submit(ResponseSaved(chained))
    again = StoredResponse("resp_10", {**records[-1].response, "status": "completed"},
                           records[-1].input_items, None, 10.0)  # fmt: skip
    submit(ResponseSaved(again))  # saved again: the last save wins
    assert await reader.response("resp_3") == records[2]
    assert [r.id for r in await reader.chain("resp_next")] == ["resp_10", "resp_next"]
    assert await reader.response("resp_10") == again
    wanted = records[5].input_items[3]
    assert await reader.items([wanted["id"], "msg_out6"]) == {
        wanted["id"]: wanted,
        "msg_out6": records[5].response["output"][0],
    }
    submit(ResponseDeleted("resp_3"))
    submit(ResponsesPurged(now=EXPIRES + 5.5))  # resp_1 … resp_5 expire at EXPIRES + 1 … 5
    assert await reader.response("resp_3") is None
    assert await reader.response("resp_5") is None
    assert await reader.response("resp_6") == records[5]
    if isinstance(reader, Store):
        assert await check(reader) == []


async def test_a_recording_stored_again_under_its_id_gives_up_its_old_chunks(
    backend: Backend,
) -> None:
    conversation = Conversation(seed=5)
    first, _ = conversation.next()
    second, _ = conversation.next()
    second.id = first.id
    del second.legs["upstream_req"]  # fewer legs than the first time
    async with backend.store() as store:
        store.submit(RecordingWrite(first))
        await store.flush()
        store.submit(RecordingWrite(second))
        await store.flush()
        (stored,) = await store.load_recordings()
        assert legs(stored) == legs(second)
        assert await check(store) == []
        store.submit(RecordingWrite(second))  # the same again: nothing grows
        await store.flush()
        chunks = backend.count("store_chunks")
        store.submit(RecordingWrite(second))
        await store.flush()
        assert backend.count("store_chunks") == chunks
        assert await check(store) == []


async def test_a_secret_scan_sees_values_whole_not_their_chunks(tmp_path: Path) -> None:
    path = tmp_path / "scan.db"
    conversation = Conversation(seed=6)
    turns = [conversation.next()[0] for _ in range(4)]
    async with SqliteStore(path) as store:
        for interaction in turns:
            store.submit(RecordingWrite(interaction))
        await store.flush()
    values = [value for value, _ in database_values(path)]
    for interaction in turns:  # each body whole, though most of it is a slice of the last
        assert interaction.legs["client_req"].body().decode() in values
        assert interaction.canonical in values


async def test_a_base_another_process_pruned_is_not_sliced(backend: Backend) -> None:
    # Two stores on one database, as two llmitm processes (or a proxy and `rec prune`) share
    # it: the first remembers turn 1 as the base of turn 2, the second deletes turn 1 between.
    conversation = Conversation(seed=7)
    first, second = conversation.next(), conversation.next()
    async with backend.store() as proxy, backend.store() as pruner:
        proxy.submit(RecordingWrite(first[0]))
        proxy.submit(ResponseSaved(first[1]))
        await proxy.flush()
        pruner.submit(PruneRecordings(before_us=1 << 62))
        pruner.submit(ResponseDeleted(first[1].id))
        await pruner.flush()
        assert backend.count("store_chunks") == 0
        proxy.submit(RecordingWrite(second[0]))
        proxy.submit(ResponseSaved(second[1]))
        await proxy.flush()
        assert [legs(i) for i in await proxy.load_recordings()] == [legs(second[0])]
        assert await proxy.response(second[1].id) == second[1]
        assert await proxy.content_problems() == []


async def test_values_that_add_much_are_cut_off_the_event_loop_and_read_back_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Turns that add ~0.3 MB each take milliseconds to cut; every flow on the event loop
    # would wait for it. A long history that grows by a few KB a turn is cut at once: the hop
    # to a thread would cost it more than its cut.
    puts: list[tuple[int, str, int, int]] = []
    put = content_chunks.Puts.put
    turn = 0

    def noting_put(self: content_chunks.Puts, lane: str, data: bytes) -> bytes:
        puts.append((turn, lane, len(data), threading.get_ident()))
        return put(self, lane, data)

    monkeypatch.setattr(content_chunks.Puts, "put", noting_put)
    loop_thread = threading.get_ident()
    conversation = Conversation(seed=7, new_bytes=300_000)
    sent: list[tuple[Interaction, StoredResponse]] = []
    async with SqliteStore(tmp_path / "c.db") as store:
        for turn in range(5):
            if turn == 3:
                conversation.new_bytes = 3000
            interaction, record = conversation.next()
            sent.append((interaction, record))
            store.submit(RecordingWrite(interaction))
            store.submit(ResponseSaved(record))
            await store.flush()
        loaded = await store.load_recordings()
        assert [legs(i) for i in loaded] == [legs(i) for i, _ in sent]
        for _, record in sent:
            assert await store.response(record.id) == record
        assert await check(store) == []
    # The recorded bodies add ~0.3 MB on the first turns, a few KB on the last ones; the
    # stored input items have new ids on every turn here, so they are new all through.
    body_lanes = ("client_req:global", "upstream_req:global", "canonical:global")
    off_loop = {
        (t, lane)
        for t, lane, size, thread in puts
        if thread != loop_thread and size > content_chunks.OFF_LOOP_BYTES
    }
    assert off_loop == {(t, lane) for t in range(5) for lane in (*body_lanes, "input_items")} - {
        (t, lane) for t in (3, 4) for lane in body_lanes
    }
    late = [(size, thread) for t, lane, size, thread in puts if t >= 3 and lane in body_lanes]
    assert min(size for size, _ in late) > 3 * content_chunks.OFF_LOOP_BYTES
    assert {thread for _, thread in late} == {loop_thread}


def test_a_5_mb_history_keeps_its_last_value_in_each_of_its_four_lanes() -> None:
    # Each turn of a big history is sliced from the last one in each lane; with room for
    # fewer, each lane's value pushed another's out and every turn was cut whole.
    bases = content.Bases()
    lanes = ["client_req:global", "upstream_req:global", "canonical:global", "input_items"]
    for turn in range(3):
        for lane in lanes:
            value = bytes([turn]) * 5_000_000
            bases.remember(lane, content.name_of(lane.encode() + value), value, 0)
        assert [len(bases.candidates(lane)) >= 1 for lane in lanes] == [True] * 4
