"""A bounded cache of values named by exact bytes: what a growing conversation's memos share.

An agent resends its whole history on every turn, so work done on one item (redacting and
keying it for a recording, checking it, giving it an id) is worth keeping for the next turn.
Each memo names an item by its exact JSON bytes — not its Python value, since ``True == 1`` —
under a tag of its own (what the bytes are: which field, which kind of item, after what).
:class:`BytesLru` looks an entry up by tag, length and hash and confirms it by its bytes (an
agent's tool outputs often share their length, first and last bytes: the ends are not
enough), and forgets the least recently used entries past a budget of bytes.

Not thread-safe: a memo used from several threads holds its own lock around it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

ENTRY = 256
"""Bytes an entry costs besides its bytes and value, roughly."""


class BytesLru[V]:
    """Values by ``(tag, bytes)``, the least recently used forgotten past ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[tuple[Hashable, int, int], tuple[bytes, V, int]] = OrderedDict()
        self._held = 0

    def __len__(self) -> int:
        return len(self._entries)

    def kept(self) -> dict[tuple[Hashable, int, int], V]:
        """What is kept, by tag, length and hash, least recently used first."""
        return {key: value for key, (_, value, _) in self._entries.items()}

    @property
    def held(self) -> int:
        """Bytes the entries cost, roughly."""
        return self._held

    def get(self, tag: Hashable, data: bytes) -> V | None:
        """The value kept for exactly ``data`` under ``tag``, now the most recently used."""
        key = (tag, len(data), hash(data))
        entry = self._entries.get(key)
        if entry is None or entry[0] != data:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, tag: Hashable, data: bytes, value: V, extra: int = 0) -> None:
        """Keep ``value`` for ``data`` under ``tag`` (replacing what another value of that
        length and hash had); it costs :data:`ENTRY`, ``data``'s length and ``extra`` bytes.
        Call :meth:`trim` once the caller no longer needs what it got from the cache."""
        key = (tag, len(data), hash(data))
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= old[2]
        cost = ENTRY + len(data) + extra
        self._entries[key] = (data, value, cost)
        self._held += cost

    def charge(self, tag: Hashable, data: bytes, extra: int) -> None:
        """The entry for ``data`` under ``tag`` now costs ``extra`` bytes besides its entry
        and bytes (its value grew or shrank)."""
        key = (tag, len(data), hash(data))
        entry = self._entries.get(key)
        if entry is None or entry[0] != data:
            return
        cost = ENTRY + len(data) + extra
        self._held += cost - entry[2]
        self._entries[key] = (entry[0], entry[1], cost)

    def trim(self) -> None:
        """Forget the least recently used entries until what is kept fits the budget."""
        while self._held > self.budget and self._entries:
            _, (_, _, cost) = self._entries.popitem(last=False)
            self._held -= cost
