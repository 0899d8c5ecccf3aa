"""The lengths two byte strings share at their start and end: exact, against a byte-by-byte
walk, whatever the block sizes the search doubles through."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.wire.shared_bytes import common_prefix, common_suffix


def test_shared_prefixes_and_suffixes_are_found_exactly() -> None:
    # Against a byte-by-byte walk, on values of few symbols (long runs of equal bytes) and
    # lengths around the block sizes the search doubles through.
    rng = random.Random(3)
    for _ in range(800):
        a = bytes(rng.randrange(3) for _ in range(rng.randrange(0, 5000)))
        b = a[: rng.randrange(0, len(a) + 1)] + bytes(
            rng.randrange(3) for _ in range(rng.randrange(0, 3000))
        )
        prefix = 0
        while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
            prefix += 1
        assert common_prefix(a, b) == prefix
        limit = rng.randrange(0, 6000)
        suffix = 0
        while suffix < min(len(a), len(b), limit) and a[-1 - suffix] == b[-1 - suffix]:
            suffix += 1
        assert common_suffix(a, b, limit) == suffix


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=60), st.integers(0, 200))
def test_a_suffix_shared_after_any_bytes_is_found_exactly(
    a: bytes, b: bytes, common: bytes, limit: int
) -> None:
    a, b = a + common, b + common
    expected = 0
    while expected < min(limit, len(a), len(b)) and a[-1 - expected] == b[-1 - expected]:
        expected += 1
    assert common_suffix(a, b, limit) == expected
