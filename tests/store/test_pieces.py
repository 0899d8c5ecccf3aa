"""Pieces: a streamed leg in two columns behaves as the list of (offset, bytes) it stands for,
and the store packs it and joins it without making that list."""

from __future__ import annotations

from llmitm.replay.model import Message, Pieces
from llmitm.store import blob_codec
from llmitm.store.recording_rows import encode_pieces, pack_index, recording_rows, unpack_chunks
from llmitm.store.recordings import RecordingWrite
from tests.store.test_store_recordings import recorded


def as_pieces(chunks: list[tuple[int, bytes]]) -> Pieces:
    return Pieces(
        [t for t, _ in chunks], [len(d) for _, d in chunks], b"".join(d for _, d in chunks)
    )


AS_LIST = [(0, b"data: a\n\n"), (1500, b"data: b\n\n"), (90000, b"data: [DONE]\n\n")]


def test_pieces_read_like_the_list() -> None:
    pieces = as_pieces(AS_LIST)
    expected = list(AS_LIST)
    assert list(pieces) == expected and pieces == expected and expected == pieces
    assert len(pieces) == 3 and pieces[1] == AS_LIST[1] and pieces[-1] == AS_LIST[-1]
    assert pieces[1:] == AS_LIST[1:] and (1500, b"data: b\n\n") in pieces
    assert pieces != AS_LIST[:2] and pieces != [(0, b"x"), *AS_LIST[1:]]


def test_the_store_packs_and_joins_the_columns() -> None:
    pieces = as_pieces(AS_LIST)
    assert pieces.sizes == [9, 9, 14] and pieces.offsets == [0, 1500, 90000]
    assert pack_index(pieces) == pack_index(AS_LIST)
    body = Message(chunks=pieces).body()
    assert body == Message(chunks=AS_LIST).body() == b"".join(d for _, d in AS_LIST)
    assert Message(chunks=pieces).body() is pieces.body  # made once, by the tap
    assert unpack_chunks(pack_index(pieces), body) == AS_LIST


def test_timed_pieces_are_stored_as_they_came_and_read_back_as_offsets() -> None:
    t0 = 1_796_040_000.25  # a request that ended a quarter second past some second
    times = [t0 + t / 1e6 for t, _ in AS_LIST]
    body = b"".join(d for _, d in AS_LIST)
    pieces = Pieces.timed(times, t0, [len(d) for _, d in AS_LIST], body)
    expected = [(int((at - t0) * 1e6), d) for at, (_, d) in zip(times, AS_LIST, strict=True)]
    assert list(pieces) == expected and pieces.offsets == [t for t, _ in expected]
    index = pack_index(pieces)
    assert index.startswith(b"LLMIDX") and len(index) == 16 + 16 * len(AS_LIST)
    assert unpack_chunks(index, body) == expected
    assert all(abs(a - b) <= 1 for a, b in zip(pieces.offsets, [0, 1500, 90000], strict=True))


def test_an_index_of_the_first_layout_still_reads() -> None:
    old = b"".join(t.to_bytes(8, "little") + len(d).to_bytes(8, "little") for t, d in AS_LIST)
    assert unpack_chunks(old, b"".join(d for _, d in AS_LIST)) == AS_LIST


def test_encoded_pieces_hold_the_stores_bytes_and_read_as_before() -> None:
    """Encoded, a stream's body waits for the store in the codec's bytes: the store's rows take
    them as they are, and a reader still gets the pieces (the body decoded once, then kept)."""
    datas = [b'data: {"n": %d, "delta": "some words"}\n\n' % i for i in range(100)]
    chunks = [(i * 20_000, d) for i, d in enumerate(datas)]
    pieces = as_pieces(chunks)
    message = Message(chunks=pieces, status=200)
    decoded: list[int] = []

    def decode(codec: str, data: bytes) -> bytes:
        decoded.append(len(data))
        return blob_codec.decode(codec, data)

    pieces.encode(blob_codec.encode, decode)
    assert pieces.encoded is not None
    codec, stored = pieces.encoded
    assert (codec, stored) == blob_codec.encode(b"".join(datas)) and len(stored) < 1000
    encode_pieces(message)  # a leg shared by two legs of a record is encoded once
    assert pieces.encoded[1] is stored
    interaction = recorded(1)
    interaction.legs = {"upstream_resp": message, "client_resp": message}
    _, rows, blobs = recording_rows([RecordingWrite(interaction)], None)
    ((size, blob_codec_name, data),) = blobs.values()
    assert (size, blob_codec_name) == (len(b"".join(datas)), codec) and data is stored
    assert len(rows) == 2 and rows[0][6] == rows[1][6]  # both legs name the one blob
    assert decoded == []  # the store took the encoded bytes; the body was not held whole
    assert list(pieces) == chunks and message.body() == b"".join(datas)
    assert message.body() is message.body() and decoded == [len(stored)]  # decoded once


def test_a_small_body_is_kept_raw_as_the_store_keeps_it() -> None:
    pieces = as_pieces(AS_LIST)
    pieces.encode(blob_codec.encode, blob_codec.decode)
    assert pieces.encoded == (blob_codec.RAW, b"".join(d for _, d in AS_LIST))
    assert list(pieces) == AS_LIST
