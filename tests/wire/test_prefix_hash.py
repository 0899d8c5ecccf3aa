"""A text hashed from a recent text's kept state has the sha256 of the whole text, whatever
it shares with the texts before it."""

from __future__ import annotations

import hashlib
import random

from llmitm.wire import prefix_hash
from llmitm.wire.prefix_hash import PrefixHasher


def test_a_growing_text_is_hashed_from_where_it_grew() -> None:
    rng = random.Random(7)
    hasher = PrefixHasher()
    items: list[bytes] = []
    for _ in range(40):
        items.append(bytes(rng.randrange(97, 123) for _byte in range(2000)))
        text = b'{"body":{"input":[' + b",".join(items) + b'],"tools":"' + b"t" * 3000 + b'"}}'
        assert hasher.digest(text) == hashlib.sha256(text).digest()
        kept = [k for k in hasher._kept.entries() if k.data is text]
        if len(text) >= prefix_hash.SMALLEST + 4000:  # the one before was kept too
            # Where the tail it shares with the last text starts (an item may end alike).
            tail = len(b'],"tools":"' + b"t" * 3000 + b'"}}')
            assert len(text) - tail - 2000 < kept[0].at <= len(text) - tail
        # Another text that starts alike, and one changed early on, are hashed right too.
        for other in (text[: len(text) // 2], b"x" + text[1:]):
            assert hasher.digest(other) == hashlib.sha256(other).digest()


def test_kept_texts_stay_within_the_budget() -> None:
    hasher = PrefixHasher(budget=100_000)
    for n in range(30):
        text = str(n).encode() * 20_000
        assert hasher.digest(text) == hashlib.sha256(text).digest()
    assert sum(len(k.data) for k in hasher._kept.entries()) <= 100_000
    small = b"small"
    assert hasher.digest(small) == hashlib.sha256(small).digest()
    assert len(small) < prefix_hash.SMALLEST
