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


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    view = memoryview(b)
    lo, step = 0, 1024
    while lo < n:
        hi = min(n, lo + step)
        if not a.startswith(view[lo:hi], lo):
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a.startswith(view[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """Length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    la, lb = len(a), len(b)
    view = memoryview(b)
    lo, step = 0, 1024
    while lo < n:
        hi = min(n, lo + step)
        if not a.startswith(view[lb - hi : lb - lo], la - hi):
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a.startswith(view[lb - mid : lb - lo], la - mid):
            lo = mid
        else:
            hi = mid
    while lo < hi and a[la - lo - 1] == b[lb - lo - 1]:
        lo += 1
    return lo
