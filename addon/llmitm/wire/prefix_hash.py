"""sha256 of texts that extend a recent one, hashed from where they differ.

A recording's match key is the sha256 of the request's canonical text, and an agent's
request on turn N is turn N−1's with a few items added: the text is the last one's up to
the end of its conversation, then the new items, then the same closing fields. Hashing it
whole costs the history's length every turn (sha256 runs at ~0.5–2 GB/s, so ~0.2–0.8 ms a
turn at 400 KB). :class:`PrefixHasher` keeps, per recent text, the hash state at the point
where the next turn's text will most likely start to differ — where the part this text
shares at its end with the one before began — and resumes from it when a text starts with
the bytes up to that point. The digest is the sha256 of the whole text either way: a state
is only resumed for a text that starts with exactly the bytes it hashed.

Bounded: :data:`BUDGET` bytes of kept texts, the least recently used forgotten. One lock.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

from llmitm.wire.kept_by_head import KeptByHead
from llmitm.wire.shared_bytes import common_suffix

BUDGET = 16 * 2**20
"""Bytes of kept texts."""
SMALLEST = 16 * 1024
"""Texts shorter than this are hashed whole and not kept."""
HEAD = 256
"""The leading bytes that name a kept text's candidates."""
PER_HEAD = 8
GUESS = 64 * 1024
"""For a text with no predecessor: its state is kept this many bytes before its end."""


@dataclass(slots=True, eq=False)
class _Kept:
    data: bytes
    at: int
    """Where ``state`` stopped: the sha256 of ``data[:at]``."""
    state: Any


class PrefixHasher:
    """sha256 digests of texts, resumed from a recent text's kept state."""

    def __init__(self, budget: int = BUDGET) -> None:
        self._kept: KeptByHead[_Kept] = KeptByHead(budget, HEAD, PER_HEAD)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def digest(self, data: bytes) -> bytes:
        """``hashlib.sha256(data).digest()``."""
        if len(data) < SMALLEST:
            return hashlib.sha256(data).digest()
        with self._lock:
            base = None
            for kept in self._kept.alike(data):
                longer = base is None or kept.at > base.at
                if (
                    longer
                    and kept.at <= len(data)
                    and data.startswith(memoryview(kept.data)[: kept.at])
                ):
                    base = kept
            if base is not None:
                self._kept.drop(base)
                at = len(data) - common_suffix(data, base.data, len(data) - base.at)
                hasher = base.state.copy()
                hasher.update(memoryview(data)[base.at : at])
            else:
                at = max(0, len(data) - GUESS)
                hasher = hashlib.sha256(memoryview(data)[:at])
            self._kept.keep(_Kept(data, at, hasher.copy()))
        hasher.update(memoryview(data)[at:])
        return hasher.digest()
