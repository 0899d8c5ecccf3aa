"""What was already worked out for the items of a resent history, by their exact bytes.

An agent resends its whole history on every turn, and a create call's items are checked
(:func:`~llmitm.translate.validation.validate_request`) and, when stored, given ids
(:mod:`llmitm.responses_api.item_ids`) — each a walk or a digest of every item, every turn.
:class:`ItemMemo` keeps, per item named by its exact JSON bytes
(:class:`~llmitm.wire.bytes_lru.BytesLru`, like the recording's memo), whether it passed the
checks and the ids its history gave it; :meth:`ItemMemo.see` serialises a request's items
once, and a resent item then costs a lookup. Results are those of the whole walks, byte for
byte (property tests compare both paths on random growing conversations): an item's checks
do not depend on where it is (its index appears only in a refusal, and a refused item is
never marked), and an id depends on the item and the digest of what came before it, which
is the key it is kept under.

Bounded: :data:`BUDGET` bytes of items, the least recently used forgotten; an item keeps the
ids of its last :data:`HISTORIES` histories. Kept in memory only, as the flows are. One lock:
the event loop uses it, and nothing stops a caller on another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmitm.wire.bytes_lru import BytesLru

BUDGET = 16 * 2**20
"""Bytes the items kept may hold, roughly: each its JSON bytes and its ids."""
HISTORIES = 4
"""Histories whose id an item keeps (the same message in several conversations)."""
_IDS_COST = HISTORIES * 128
"""Bytes an item's kept ids may hold, roughly (charged up front)."""
_TAG = "input"


@dataclass(slots=True)
class _Item:
    valid: bool = False
    """It passed the checks of a Responses input item (at any index: they do not depend on it)."""
    ids: dict[bytes, bytes] = field(default_factory=dict)
    """The digest it gets after each history's digest (most recent last)."""


class SeenItems:
    """One request's items with their bytes and what the memo knew of them."""

    __slots__ = ("_by_object", "_memo")

    def __init__(self, memo: ItemMemo, kept: dict[int, tuple[Any, bytes, _Item]]) -> None:
        self._memo = memo
        # By object identity (the object held, so its id stays its own): a caller that
        # replaces an item (a resolved reference) gets no bytes for the new one.
        self._by_object = kept

    def _entry(self, item: Any) -> tuple[bytes, _Item] | None:
        kept = self._by_object.get(id(item))
        return None if kept is None or kept[0] is not item else (kept[1], kept[2])

    def valid(self, item: Any) -> bool:
        """``item`` passed an input item's checks before."""
        kept = self._by_object.get(id(item))
        return kept is not None and kept[0] is item and kept[2].valid

    def mark_valid(self, items: list[Any]) -> None:
        """Every item of ``items`` passed an input item's checks."""
        for item in items:
            entry = self._entry(item)
            if entry is not None:
                entry[1].valid = True

    def next_id(self, item: Any, before: bytes, digest: Callable[[bytes, bytes], bytes]) -> bytes:
        """The digest ``item`` gets after the history digest ``before``: kept, or
        ``digest(before, item's bytes)`` made now and kept."""
        found = self._by_object.get(id(item))
        if found is None or found[0] is not item:
            return digest(before, orjson.dumps(item))
        ids = found[2].ids
        made = ids.get(before)  # a dict read is atomic: the lock guards only changes
        if made is None:
            with self._memo.lock:
                made = ids[before] = digest(before, found[1])
                while len(ids) > HISTORIES:
                    del ids[next(iter(ids))]
        return made


class ItemMemo:
    """Input items seen lately, by their bytes."""

    def __init__(self, budget: int = BUDGET) -> None:
        self._items: BytesLru[_Item] = BytesLru(budget)
        self.lock = threading.Lock()

    def see(self, items: Any, serialised: list[bytes] | None = None) -> SeenItems | None:
        """``items`` (a request's ``input``) with their bytes (``serialised``: each item's
        ``orjson.dumps``, made already); ``None`` when not an array."""
        if type(items) is not list:
            return None
        if serialised is not None and len(serialised) != len(items):
            serialised = None
        kept: dict[int, tuple[Any, bytes, _Item]] = {}
        cache = self._items
        with self.lock:
            for index, item in enumerate(items):
                if type(item) is not dict or id(item) in kept:
                    continue
                if serialised is not None:
                    data = serialised[index]
                else:
                    try:
                        data = orjson.dumps(item)
                    except orjson.JSONEncodeError:  # nested past orjson's limit: refused anyway
                        continue
                entry = cache.get(_TAG, data)
                if entry is None:
                    entry = _Item()
                    cache.put(_TAG, data, entry, _IDS_COST)
                kept[id(item)] = (item, data, entry)
            cache.trim()
        return SeenItems(self, kept)
