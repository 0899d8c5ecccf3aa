"""A recording as rows, and rows back as a recording: what every backend stores alike.

The backends (``store.sqlite_recordings``, ``store.postgres_recordings``) own their SQL; this
module owns what knows no database: the packed chunk index of a streamed leg
(:func:`pack_index`, :func:`unpack_chunks`), the ``rec_interactions`` and ``rec_messages``
rows a batch of writes becomes (:func:`recording_rows`, whole bodies and canonical texts cut
into chunks when the store keeps them), and an interaction and its legs rebuilt from the rows
a backend read (:func:`interaction_of`, :func:`attach_legs`).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from llmitm.replay.model import LEGS, Chunk, Interaction, Message, Pieces
from llmitm.store import blob_codec
from llmitm.store.content_chunks import Puts
from llmitm.store.recordings import RecordingWrite

_TIMED = b"LLMIDX\x02\xff"
"""Opens an index of layout 2; as layout 1's first offset it would be ~1400 years before."""


def pack_index(chunks: Sequence[Chunk]) -> bytes:
    """Layout 1, ``(t_us, length)`` of each piece as little-endian int64 pairs, interleaved in
    C; or, for :meth:`Pieces.timed` pieces, layout 2: the magic, the request's end and each
    arrival time as little-endian float64, then the lengths as int64 — copied as they are."""
    if not chunks:
        return b""
    if isinstance(chunks, Pieces) and chunks.times is not None:
        times, sizes = array("d", chunks.times), array("q", chunks.sizes)
        if sys.byteorder == "big":
            times.byteswap()
            sizes.byteswap()
        return b"".join((_TIMED, struct.pack("<d", chunks.t0), times.tobytes(), sizes.tobytes()))
    if isinstance(chunks, Pieces):
        offsets, sizes = chunks.offsets, chunks.sizes
    else:
        offsets, datas = zip(*chunks, strict=True)
        sizes = list(map(len, datas))
    flat = array("q", bytes(16 * len(chunks)))
    flat[0::2] = array("q", offsets)
    flat[1::2] = array("q", sizes)
    if sys.byteorder == "big":
        flat.byteswap()
    return flat.tobytes()


def unpack_chunks(index: bytes, body: bytes) -> list[Chunk]:
    if index.startswith(_TIMED):
        count = (len(index) - 16) // 16
        (t0,) = struct.unpack_from("<d", index, 8)
        times = struct.unpack_from(f"<{count}d", index, 16)
        sizes = struct.unpack_from(f"<{count}q", index, 16 + 8 * count)
        return list(Pieces.timed(times, t0, sizes, body))
    flat = struct.unpack(f"<{len(index) // 8}q", index)
    chunks: list[Chunk] = []
    at = 0
    for i in range(0, len(flat), 2):
        size = flat[i + 1]
        chunks.append((flat[i], body[at : at + size]))
        at += size
    return chunks


def recording_weight(writes: Sequence[RecordingWrite], puts: Puts | None) -> int:
    """What cutting ``writes`` weighs for ``store.content_chunks.cut``: the bytes their whole
    bodies and canonical texts add to their lanes; without ``puts`` (hashed whole, not cut),
    their length."""
    if puts is None:
        return sum(
            len(w.interaction.canonical_utf8)
            + sum(len(m.content or b"") for m in w.interaction.legs.values() if m.chunks is None)
            for w in writes
        )
    weight = 0
    for write in writes:
        i = write.interaction
        weight += puts.unshared(canonical_lane(i), i.canonical_utf8)
        for leg, message in i.legs.items():
            if message.chunks is None:
                weight += puts.unshared(leg_lane(i, leg), message.content or b"")
    return weight


def canonical_lane(interaction: Interaction) -> str:
    return f"canonical:{interaction.scope}"


def leg_lane(interaction: Interaction, leg: str) -> str:
    """The lane of a leg's whole body: the previous turn's body of this leg is the base a
    resent history slices."""
    return f"{leg}:{interaction.scope}"


Blob = tuple[int, str, bytes]
"""A ``rec_blobs`` row but its name: the body's size, its codec and the bytes stored."""


def recording_rows(
    writes: Sequence[RecordingWrite], puts: Puts | None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, Blob]]:
    """The rows of ``writes``; with ``puts``, whole bodies and canonical texts as chunks.
    Blobs are encoded here, a stream's taken as its pieces hold it once encoded
    (:func:`encode_pieces`)."""
    interactions: list[tuple[Any, ...]] = []
    messages: list[tuple[Any, ...]] = []
    blobs: dict[str, Blob] = {}
    # Legs that share one chunk list (a passthrough stream's upstream and client legs) are
    # joined and stored once.
    digests: dict[int, str] = {}
    for write in writes:
        i = write.interaction
        canonical: tuple[Any, ...] = (
            ("", puts.put(canonical_lane(i), i.canonical_utf8))
            if puts is not None
            else (i.canonical,)
        )
        interactions.append(
            (
                i.id,
                i.session,
                i.started_us,
                i.scope,
                i.key,
                i.key_version,
                i.method,
                i.route,
                i.model,
                int(i.stream),
                canonical[0],
                i.status,
                i.endpoint,
                i.plan,
                i.ttfb_us,
                i.duration_us,
                i.truncated,
                i.error,
                i.mode,
                orjson.dumps(i.minted).decode() if i.minted else None,
                i.credential,
                *canonical[1:],
            )
        )
        for leg, message in i.legs.items():
            chunk: tuple[Any, ...] = ()
            if message.chunks is None and puts is not None:
                digest = ""
                chunk = (puts.put(leg_lane(i, leg), message.content or b""),)
            elif message.chunks is None:
                body = message.content or b""
                digest = hashlib.sha256(body).hexdigest()
                if digest not in blobs:
                    blobs[digest] = _blob(body)
            else:
                # A stream never repeats another (ids, timing), so it is named, not hashed:
                # hashing half a megabyte per recorded stream would be CPU for nothing.
                digest = digests.get(id(message.chunks), "")
                if not digest:
                    digest = digests[id(message.chunks)] = f"stream:{i.id}:{leg}"
                    blobs[digest] = _stream_blob(message)
                chunk = (None,) if puts is not None else ()
            index_codec, index = blob_codec.RAW, None
            if message.chunks is not None:
                index_codec, index = blob_codec.encode(pack_index(message.chunks))
            messages.append(
                (
                    i.id,
                    leg,
                    message.method,
                    message.url,
                    message.status,
                    orjson.dumps(message.headers).decode(),
                    digest,
                    index,
                    index_codec,
                    *chunk,
                )
            )
    return interactions, messages, blobs


def encode_pieces(message: Message) -> None:
    """Let a streamed leg's pieces hold their body as the store will keep it (see
    :meth:`Pieces.encode`); :func:`recording_rows` then stores those bytes as they are."""
    if isinstance(message.chunks, Pieces):
        message.chunks.encode(blob_codec.encode, blob_codec.decode)


def _stream_blob(message: Message) -> Blob:
    chunks = message.chunks
    if isinstance(chunks, Pieces) and chunks.encoded is not None:
        return (sum(chunks.sizes), *chunks.encoded)
    return _blob(message.body())


def _blob(body: bytes) -> Blob:
    return (len(body), *blob_codec.encode(body))


def interaction_of(row: Sequence[Any], canonical_utf8: bytes) -> Interaction:
    return Interaction(
        id=row[0],
        session=row[1],
        started_us=row[2],
        scope=row[3],
        key=row[4],
        key_version=row[5],
        method=row[6],
        route=row[7],
        model=row[8],
        stream=bool(row[9]),
        canonical_utf8=canonical_utf8,
        status=row[11],
        endpoint=row[12],
        plan=row[13],
        ttfb_us=row[14],
        duration_us=row[15],
        truncated=row[16],
        error=row[17],
        mode=row[18],
        minted=orjson.loads(row[19]) if row[19] else {},
        credential=row[20],
        source="db",
    )


def interactions_of(rows: Sequence[Sequence[Any]], texts: Iterator[bytes]) -> list[Interaction]:
    """``rec_interactions`` rows as interactions without legs; ``texts``: the canonical texts
    kept as chunks (:func:`chunk_names` of column 21), read in row order."""
    return [
        interaction_of(row, next(texts) if row[21] is not None else row[10].encode())
        for row in rows
    ]


def chunk_names(rows: Sequence[Sequence[Any]], column: int) -> list[bytes]:
    """The chunk names in ``column`` of ``rows``, in row order (rows without one skipped)."""
    return [bytes(row[column]) for row in rows if row[column] is not None]


def attach_legs(
    rows: Sequence[Sequence[Any]], bodies: Iterator[bytes], by_id: dict[str, Interaction]
) -> None:
    """Add each ``rec_messages`` row (``interaction_id, leg, method, url, status,
    headers_json, chunk_index, index_codec, codec, data, body_chunk``, the blob's columns
    joined) to its interaction in ``by_id``; ``bodies`` are the chunked bodies
    (:func:`chunk_names` of column 10), read in row order."""
    for row in rows:
        iid, leg, method, url, status, headers, index, index_codec, codec, data, chunk = row
        if chunk is not None:
            data = next(bodies)
        elif data is None:
            raise LookupError(f"recording {iid}: the body of {leg} is missing")
        else:
            data = blob_codec.decode(codec, data)
        message = Message(
            headers=[(k, v) for k, v in orjson.loads(headers)],
            method=method,
            url=url,
            status=status,
        )
        if index is not None:
            message.chunks = unpack_chunks(blob_codec.decode(index_codec, index), data)
        else:
            message.content = data
        by_id[iid].legs[leg] = message


def order_legs(interactions: Sequence[Interaction]) -> None:
    """Each interaction's legs in the order of ``LEGS``, as they were recorded."""
    for interaction in interactions:
        interaction.legs = {leg: interaction.legs[leg] for leg in LEGS if leg in interaction.legs}
