"""The shared chunk table as every backend writes it: its name, the columns that own chunks,
and the putting of values into chunks (:class:`Puts`: cut by ``store.content``, no database)
down to the upsert rows a backend commits. ``store.sqlite_content`` and
``store.postgres_content`` each commit those rows, count references and read chunks back in
their own database; what the chunks are and why is in ``store.sqlite_content``'s docstring.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from llmitm.store import blob_codec, content
from llmitm.store.content import LEAF, Bases

TABLE = "store_chunks"

ChunkRow = tuple[bytes, str, int, int, str, bytes]
"""One upsert row of the chunk table: name, kind, references to add, size, codec, data."""

OFF_LOOP_BYTES = 256 << 10
"""Values weighing this much and more are cut on a worker thread (:func:`cut`)."""

OWNER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rec_messages", "body_chunk"),
    ("rec_interactions", "canonical_chunk"),
    ("responses", "input_chunk"),
    ("responses", "response_chunk"),
)
"""Every column that holds a chunk name: the roots of reference counting."""


class Puts:
    """The values one applier call stores, cut at once (:meth:`put`, no database) and written
    by a backend's subclass in two statements (its ``commit``): one query for which chunks
    exist (and, given :meth:`replacing`, which chunks the rows about to be replaced hold), one
    upsert of the new chunks and the counts of the others. A round trip to the database costs
    more than cutting a turn's value, so nothing is written one by one."""

    def __init__(self, bases: Bases) -> None:
        self.bases = bases
        self._encoded: list[content.Encoded] = []
        self._replacing: tuple[str, tuple[Any, ...]] | None = None
        self.replaced: list[bytes | None] = []
        """After the commit: the chunks the replaced rows held (one per row and column,
        ``None`` where a row had none), to release (the backend's ``ContentStore.release``)
        once they are gone.
        Released after the new references are counted, a chunk both hold never drops to 0."""

    def replacing(self, sql: str, params: tuple[Any, ...]) -> None:
        """Also run ``sql`` (one column of chunk names) in the commit's query."""
        self._replacing = (sql, params)

    def put(self, lane: str, data: bytes) -> bytes:
        """The chunk name ``data`` will have, with one reference, once committed."""
        base, prefix, suffix = content.best_base(data, self.bases.candidates(lane))
        encoded = content.encode(data, base, prefix, suffix)
        self._encoded.append(encoded)
        depth = base.depth + 1 if encoded.base is not None and base is not None else 0
        self.bases.remember(lane, encoded.name, data, depth)
        return encoded.name

    def wanted(self) -> set[bytes]:
        """The chunks whose presence decides what :meth:`rows` writes."""
        return {e.name for e in self._encoded} | {c for e in self._encoded for c in e.children}

    def rows(self, stored: set[bytes]) -> list[ChunkRow] | None:
        """The upsert rows ``(name, kind, refs, size, codec, data)`` given which of
        :meth:`wanted` are ``stored``: new chunks whole, stored ones as a count to add (the
        conflict path); ``None`` (the recent values forgotten) when a value needs a chunk
        that is neither stored nor put here. Backend-neutral: every backend's commit."""
        new: dict[bytes, tuple[content.Chunk, int]] = {}
        more: Counter[bytes] = Counter()
        for encoded in self._encoded:
            if encoded.name in stored or encoded.name in new:
                more[encoded.name] += 1
                continue
            by_name = {chunk.name: chunk for chunk in encoded.chunks}
            if encoded.name not in by_name:  # the same value as its base: the base itself
                self.bases.clear()
                return None
            new[encoded.name] = (by_name[encoded.name], 1)
            for child, count in Counter(encoded.children).items():
                if child in stored or child in new:
                    more[child] += count
                elif child in by_name:
                    new[child] = (by_name[child], count)
                else:
                    self.bases.clear()
                    return None
        rows: list[ChunkRow] = [
            (chunk.name, chunk.kind, refs + more.pop(chunk.name, 0), len(chunk.data),
             *blob_codec.encode(chunk.data))
            for chunk, refs in new.values()
        ]  # fmt: skip
        rows += [(name, LEAF, count, 0, "", b"") for name, count in more.items()]
        return rows


async def cut[T](weight: int, make: Callable[..., T], *args: Any) -> T:
    """``make(*args)`` — an applier's rows, its values cut into chunks by :meth:`Puts.put` —
    on a worker thread when the values weigh ``weight`` bytes or more. Cutting scans and
    hashes what a value adds (~3 ms a MB of new text), which on the event loop every flow
    would wait for; the writer task awaits it here instead, the only task that touches the
    recent values, so nothing else runs beside it. Lighter values are cut at once: the hop
    to a thread and back would cost more than they do."""
    if weight < OFF_LOOP_BYTES:
        return make(*args)
    return await asyncio.to_thread(make, *args)
