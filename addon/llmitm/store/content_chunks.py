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
from llmitm.store.content import LEAF, Bases, Value

TABLE = "store_chunks"

ChunkRow = tuple[bytes, str, int, int, str, bytes]
"""One upsert row of the chunk table: name, kind, references to add, size, codec, data."""

OFF_LOOP_BYTES = 256 << 10
"""Values adding this many bytes and more (:meth:`Puts.unshared`) are cut on a worker thread
(:func:`cut`)."""

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
        self._weighed: dict[str, tuple[Value, tuple[content.Recent, int, int]]] = {}
        """:meth:`unshared`'s last comparison in each lane: the value, the value it was
        compared with, and the prefix and suffix they share."""
        self.replaced: list[bytes | None] = []
        """After the commit: the chunks the replaced rows held (one per row and column,
        ``None`` where a row had none), to release (the backend's ``ContentStore.release``)
        once they are gone.
        Released after the new references are counted, a chunk both hold never drops to 0."""

    def replacing(self, sql: str, params: tuple[Any, ...]) -> None:
        """Also run ``sql`` (one column of chunk names) in the commit's query."""
        self._replacing = (sql, params)

    def unshared(self, lane: str, data: Value) -> int:
        """About how many bytes putting ``data`` would scan and hash: what the newest recent
        value of ``lane`` does not share with it as prefix and suffix (all of it when there
        is none). A memory comparison, whose result :meth:`put` takes up: weighing a write
        before cutting it costs it nothing more."""
        newest = self.bases.candidates(lane)[:1]
        if not newest or newest[0].depth >= content.MAX_DEPTH:
            return len(data)
        prefix, suffix = content.shared_ends(data, newest[0])
        self._weighed[lane] = (data, (newest[0], prefix, suffix))
        return len(data) - prefix - suffix if prefix + suffix >= content.MIN_SHARED else len(data)

    def put(self, lane: str, data: Value) -> bytes:
        """The chunk name ``data`` will have, with one reference, once committed."""
        base, prefix, suffix = self._base_of(lane, data)
        encoded = content.encode(data, base, prefix, suffix)
        self._encoded.append(encoded)
        depth = base.depth + 1 if encoded.base is not None and base is not None else 0
        self.bases.remember(lane, encoded.name, data, depth)
        return encoded.name

    def _base_of(self, lane: str, data: Value) -> tuple[content.Recent | None, int, int]:
        weighed, measured = self._weighed.pop(lane, (None, None))
        # The same value, often the same bytes made again (a canonical text encoded twice).
        if measured is not None and not (weighed is data or weighed == data):
            measured = None
        return content.best_base(data, self.bases.candidates(lane), measured)

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
    on a worker thread when the values add ``weight`` bytes or more (:meth:`Puts.unshared`
    of each). Cutting scans and hashes what a value adds (~3 ms a MB of new text), which on
    the event loop every flow would wait for; the writer task awaits it here instead, the
    only task that touches the recent values, so nothing else runs beside it. Values that
    add less are cut at once, however long: the turn of a long conversation adds a few KB,
    and the hop to a thread and back, and cutting on a core whose caches hold none of it,
    cost such a turn more than the cut itself (~1 ms a turn at 400 KB of history)."""
    if weight < OFF_LOOP_BYTES:
        return make(*args)
    return await asyncio.to_thread(make, *args)
