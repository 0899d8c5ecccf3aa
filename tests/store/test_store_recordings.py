"""Recordings in the store (SQLite and PostgreSQL): four legs round-trip byte for byte,
blobs are shared, scopes are wiped, and the recordings migration commutes with other
features' steps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmitm.replay.model import Interaction, Message, Pieces
from llmitm.store import MIGRATIONS, Migration, SqliteStore, blob_codec
from llmitm.store.recording_rows import encode_pieces
from llmitm.store.recordings import DeleteScope, RecordingWrite, RekeyRecording, ReplayMissRecord
from tests.store.backends import Backend


def recorded(n: int, scope: str = "global") -> Interaction:
    chunks = [(100 * i, f'data: {{"n":{i}}}\n\n'.encode()) for i in range(50)]
    return Interaction(
        id=f"{n:013x}abcdef",
        scope=scope,
        key="k" * 16,
        key_version=1,
        method="POST",
        route="chat.completions",
        model="m",
        stream=True,
        canonical_utf8=b"{}",
        started_us=n,
        status=200,
        ttfb_us=900,
        duration_us=5000,
        truncated="client: Client disconnected." if n == 2 else None,
        legs={
            "client_req": Message(
                headers=[("a", "1"), ("a", "2")], content=b"{}", method="POST", url="http://x/"
            ),
            "upstream_resp": Message(
                headers=[("content-type", "text/event-stream")], chunks=chunks, status=200
            ),
            "client_resp": Message(headers=[], chunks=chunks, status=200),
        },
    )


async def test_recordings_round_trip_and_share_blobs(backend: Backend) -> None:
    async with backend.store() as store:
        for n in (1, 2):
            store.submit(RecordingWrite(recorded(n)))
        store.submit(RecordingWrite(recorded(3, scope="other")))
        await store.flush()
        loaded = await store.load_recordings()
        assert [i.started_us for i in loaded] == [1, 2, 3]
        first = loaded[0]
        assert first.legs["client_resp"].chunks == recorded(1).legs["client_resp"].chunks
        assert first.legs["client_req"].headers == [("a", "1"), ("a", "2")]
        assert first.legs["client_req"].content == b"{}"
        assert loaded[1].truncated == "client: Client disconnected."
        assert (await store.recording(first.id[:15])).id == first.id  # a unique prefix
        assert [i.id for i in await store.recordings(scope="other")] == [loaded[2].id]
        store.submit(DeleteScope("global"))
        store.submit(ReplayMissRecord(1, "global", "k", "no-key", "{}", None, None))
        await store.flush()
        assert [i.scope for i in await store.load_recordings()] == ["other"]
        assert (await store.last_replay_miss()).reason == "no-key"
    # the one remaining interaction: one stream body for two legs; its request body and its
    # canonical text, both "{}", one shared chunk with two references
    assert backend.count("rec_blobs") == 1
    assert backend.query("SELECT refs FROM store_chunks") == [("2",)]


async def test_a_stream_encoded_by_its_builder_is_stored_as_those_bytes(backend: Backend) -> None:
    """The record builder compresses a stream's body as the store keeps it; the store writes
    those bytes as they are, and the stream reads back piece for piece."""
    t0 = 1_796_040_000.0
    datas = [f'data: {{"n":{i},"text":"word {i}"}}\n\n'.encode() for i in range(200)]
    pieces = Pieces.timed(
        [t0 + i / 100 for i in range(200)], t0, [len(d) for d in datas], b"".join(datas)
    )
    expected = list(pieces)
    interaction = recorded(7)
    interaction.legs = {"upstream_resp": Message(headers=[], chunks=pieces, status=200)}
    encode_pieces(interaction.legs["upstream_resp"])
    assert pieces.encoded is not None
    codec, stored = pieces.encoded
    assert codec == blob_codec.ZSTD and len(stored) < len(pieces.body) // 4
    async with backend.store() as store:
        store.submit(RecordingWrite(interaction))
        await store.flush()
        (loaded,) = await store.load_recordings()
    assert loaded.legs["upstream_resp"].chunks == expected
    assert backend.query("SELECT codec, size, length(data) FROM rec_blobs") == [
        (codec, str(sum(map(len, datas))), str(len(stored)))
    ]


async def test_the_migration_commutes_with_another_features_step(tmp_path: Path) -> None:
    # Ours first, then another feature's step, then llmitm's others: the order a merge may pick.
    (ours,) = [step for step in MIGRATIONS if step.name == "recordings"]
    rest = [step for step in MIGRATIONS[1:] if step.name != "recordings"]
    other = Migration(0, "someone-else", ("CREATE TABLE IF NOT EXISTS other (x)",))
    steps = [MIGRATIONS[0], ours, other, *rest]
    steps = [replace(step, version=number) for number, step in enumerate(steps, start=1)]
    async with SqliteStore(tmp_path / "a.db", migrations=steps) as store:
        store.submit(RecordingWrite(recorded(1)))
        await store.flush()
        assert len(await store.load_recordings()) == 1


async def test_read_only_over_a_file_without_recordings(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with SqliteStore(path, migrations=MIGRATIONS[:1]):
        pass
    async with SqliteStore(path, read_only=True) as store:
        assert await store.recordings() == []


async def test_rekey_gives_a_recording_a_new_key_and_canonical_text(backend: Backend) -> None:
    async with backend.store() as store:
        store.submit(RecordingWrite(recorded(1)))
        await store.flush()
        (before,) = await store.recordings()
        store.submit(RekeyRecording(before.id, "n" * 16, 2, '{"model":"m"}'))
        await store.flush()
        (after,) = await store.load_recordings()
        assert (after.key, after.key_version, after.canonical) == ("n" * 16, 2, '{"model":"m"}')
        assert after.legs["client_resp"].chunks == recorded(1).legs["client_resp"].chunks
        assert await store.content_problems() == []  # the old text's chunk was released
        assert store.stats().failed == 0
