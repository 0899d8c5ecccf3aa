"""Right-sized copies of bytes that outlive the call that made them.

Both orjson and zstandard (a recorded stream's compressed parts, :mod:`llmitm.replay.tap`)
hand back bytes in an allocation made for more than they hold.

orjson hands back its output in the buffer it wrote it into, allocated for more than it
wrote and never shrunk (orjson 3.x, measured with tracemalloc: 79 bytes of JSON hold 4 KiB,
3 KB hold 32 KiB, 20 KB hold 254 KiB), for as long as the bytes live. A body llmitm builds
for the upstream lives as long as its flow — the whole stream — so the proxy's memory per
concurrent stream carried that slack. A copy of the exact size costs well under a
microsecond at the usual sizes; past :data:`FIT_BELOW` most of the slack is pages the
allocator maps but nothing touches, and the copy would cost more than it saves.
"""

from __future__ import annotations

FIT_BELOW = 256 << 10
"""Bytes below which :func:`right_sized` copies."""


def right_sized(data: bytes) -> bytes:
    """``data`` in an allocation of its own size (a copy when it is small, else itself)."""
    return bytes(memoryview(data)) if len(data) < FIT_BELOW else data
