"""Which input items a saved response indexes by id (``response_input_ids``), so that a
history resent every turn adds index rows for what the turn adds, not for all it resends.

An item is found by id through the responses whose rows name it. A client that resends its
history resends each item with its id and its bytes unchanged, and indexing every one of
them again under every turn made the index grow with the square of the turns (2,500 rows
after 50 turns of 100 items, and the one statement on SQLite's thread whose time grew with
the turn, 0.03 to 0.40 ms). So the writer keeps, per credential and item id, the response
whose row indexes the item and the item's bytes there (their length and hash: a resent
item's bytes are the same object each turn, whose hash Python keeps); a later response that
resends those bytes under that id adds no row.

What this index then names is the item's first response with those bytes, where every later
one holds the same item: readers find the same item as before. When that response is gone
(deleted, expired, or written by another process the memo never saw), a reader that finds
no row looks through the responses' id lists instead (``store.sqlite_responses``,
``store.postgres_responses``), and a delete or purge empties the memo, so the next turn
indexes all it holds again. Items whose bytes were not kept as they came
(:attr:`StoredResponse.input_json` ``None``) are all indexed, as before.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from llmitm.responses_api.records import StoredResponse

MAX_ITEMS = 16384
"""Items remembered (~150 bytes each), the oldest of the least recently saved credentials
forgotten first: one forgotten is indexed again when it comes back, which costs a row, not
a wrong answer."""

Holder = tuple[int, int, int]
"""Where an item is indexed: the length and hash of its bytes, the response key."""


class InputIndex:
    """One writer's memo of where each resent item is indexed (:func:`index_of`)."""

    def __init__(self, max_items: int = MAX_ITEMS) -> None:
        self.max_items = max_items
        self._held: OrderedDict[str | None, dict[str, Holder]] = OrderedDict()
        """Per credential (the least recently saved for first), item id to holder."""
        self._size = 0

    def rows(
        self, record: StoredResponse, response_key: int, key_of: Callable[[str], int]
    ) -> list[tuple[int, int]]:
        """The ``(item_key, response_key)`` rows ``record`` adds (``key_of``: an item id's
        64-bit key); the items it indexes are remembered as indexed there."""
        items = record.input_items
        made = record.input_json
        if made is None or len(made) != len(items):
            return [(key_of(i["id"]), response_key) for i in items if isinstance(i.get("id"), str)]
        held = self._held.get(record.credential)
        if held is None:
            held = self._held[record.credential] = {}
        else:
            self._held.move_to_end(record.credential)
        before = len(held)
        rows: list[tuple[int, int]] = []
        for item, (item_id, data) in zip(items, made, strict=True):
            if item_id is None:  # an id that is not the item's first key, or none
                item_id = item.get("id")
                if not isinstance(item_id, str):
                    continue
            holder = held.get(item_id)
            if (
                holder is not None
                and holder[2] != response_key
                and holder[0] == len(data)
                and holder[1] == hash(data)
            ):
                continue  # indexed at an earlier response, with these very bytes
            held[item_id] = (len(data), hash(data), response_key)
            rows.append((key_of(item_id), response_key))
        self._size += len(held) - before
        self._forget_beyond_bound()
        return rows

    def _forget_beyond_bound(self) -> None:
        """The oldest items of the least recently saved credentials first."""
        while self._size > self.max_items:
            credential, held = next(iter(self._held.items()))
            del held[next(iter(held))]
            self._size -= 1
            if not held:
                del self._held[credential]

    @contextlib.contextmanager
    def writing(self) -> Iterator[InputIndex]:
        """Around a write of rows it made: a write that fails may leave rows it counted on
        unwritten, so it forgets them all."""
        try:
            yield self
        except BaseException:
            self.clear()
            raise

    def clear(self) -> None:
        """Forget every holder: one may be gone (a delete, a purge, a failed write)."""
        self._held.clear()
        self._size = 0


_WRITERS: weakref.WeakKeyDictionary[Any, InputIndex] = weakref.WeakKeyDictionary()


def index_of(db: Any) -> InputIndex:
    """The memo of writer connection ``db`` (either backend's), as long as it lives."""
    index = _WRITERS.get(db)
    if index is None:
        index = _WRITERS[db] = InputIndex()
    return index
