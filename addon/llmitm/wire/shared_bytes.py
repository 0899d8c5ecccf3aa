"""How many bytes two byte strings share at their start or at their end, compared as memory.

An agent's request on one turn is the last turn's with a few items added, so a value is
mostly the previous one's bytes: the store slices a value from the last one it extends, and
the prefix hasher resumes a hash where the last text's shared end began. Both need the exact
lengths, and a byte-by-byte loop in Python over a few hundred KB every turn is what they
avoid: blocks are compared in place (``bytes.startswith`` of a ``memoryview``; slicing both
sides would copy them first, 60x slower), doubling, then halved inside the block that
differs.
"""

from __future__ import annotations

from collections.abc import Callable


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    view = memoryview(b)
    return _run(min(len(a), len(b)), lambda lo, hi: a.startswith(view[lo:hi], lo))


def common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    la, lb = len(a), len(b)
    view = memoryview(b)
    return _run(min(la, lb, limit), lambda lo, hi: a.startswith(view[lb - hi : lb - lo], la - hi))


def _run(n: int, shared: Callable[[int, int], bool]) -> int:
    """The length of the run of shared bytes, at most ``n``; ``shared(lo, hi)``: whether the
    run's bytes ``lo`` to ``hi`` (counted from the end the search starts at) are shared.
    Blocks double from 1 KiB while shared; the first that is not is halved down to its
    first byte that differs."""
    lo, step = 0, 1024
    while lo < n:
        hi = min(n, lo + step)
        if not shared(lo, hi):
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 1:  # bytes before ``lo`` are shared; not all of ``lo`` to ``hi`` are
        mid = (lo + hi) // 2
        if shared(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo
