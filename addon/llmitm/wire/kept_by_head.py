"""Recent byte strings found by their leading bytes, within a budget: what the growing-body
parser and the prefix hasher keep of an agent's last turn.

Both keep, per conversation, the last turn's bytes with some work done on them, and look for
the entry a new body extends among the entries whose first :attr:`KeptByHead.head` bytes
are the new body's (conversations that start alike: one agent's prompt), at most
:attr:`KeptByHead.per_head` of them. Past :attr:`KeptByHead.budget` bytes, weighted per entry,
the least recently kept entries are forgotten. A hit replaces the entry it extends, so one
conversation holds one entry.

Not thread-safe: its owners hold their own lock around it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class Kept(Protocol):
    @property
    def data(self) -> bytes: ...


class KeptByHead[K: Kept]:
    """Entries by their data's leading bytes, the least recently kept forgotten past
    ``budget`` (each entry costs ``weight`` times its data's length)."""

    def __init__(self, budget: int, head: int, per_head: int, weight: int = 1) -> None:
        self.budget = budget
        self.head = head
        self.per_head = per_head
        self.weight = weight
        self._entries: OrderedDict[int, K] = OrderedDict()
        self._heads: dict[bytes, list[K]] = {}
        self.held = 0
        """Bytes the entries cost."""

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[K]:
        """What is kept, least recently kept first."""
        return list(self._entries.values())

    def alike(self, data: bytes) -> Sequence[K]:
        """The entries that start with ``data``'s leading bytes, oldest first."""
        return self._heads.get(data[: self.head], ())

    def keep(self, entry: K) -> None:
        """Keep ``entry``, then forget what no longer fits."""
        alike = self._heads.setdefault(entry.data[: self.head], [])
        alike.append(entry)
        self._entries[id(entry)] = entry
        self.held += self.weight * len(entry.data)
        while len(alike) > self.per_head:
            self.drop(alike[0])
        while self.held > self.budget and self._entries:
            self.drop(next(iter(self._entries.values())))

    def drop(self, entry: K) -> None:
        """Forget ``entry`` (nothing if it is not kept)."""
        if self._entries.pop(id(entry), None) is None:
            return
        self.held -= self.weight * len(entry.data)
        head = entry.data[: self.head]
        alike = self._heads.get(head)
        if alike is not None:
            alike[:] = [other for other in alike if other is not entry]
            if not alike:
                del self._heads[head]
