"""How recorded bodies and chunk indexes sit in SQLite: zstd (level 1) from 1 KiB up.

A recorded stream is nearly all repeated JSON framing: a 2000-event chat stream of 330 KB
becomes about 8 KB in 0.4 ms. Written raw, each byte crossed the kernel three times (the WAL
append, the checkpoint's read, the database write), which cost recording ~8 ms of CPU per
such stream — more than compressing it. Small bodies stay raw: their frames would cost more
than they save. The codec is stored beside the bytes, so old raw rows read as they are.

zstd comes with Python 3.14 (``compression.zstd``) and, before it, with mitmproxy itself
(``backports.zstd``).
"""

from __future__ import annotations

import threading

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # Python < 3.14
    from backports import zstd  # type: ignore[no-redef]

RAW = ""
ZSTD = "zstd"
COMPRESS_FROM = 1024


_compressors = threading.local()


def encode(data: bytes) -> tuple[str, bytes]:
    """``(codec, stored bytes)`` for ``data``."""
    if len(data) < COMPRESS_FROM:
        return RAW, data
    return ZSTD, _compressor().compress(data, zstd.ZstdCompressor.FLUSH_FRAME)


def _compressor() -> zstd.ZstdCompressor:
    """This thread's compressor: one kept for good, since making one (its tables) costs
    ~50 µs, as much as compressing a whole recorded stream."""
    compressor = getattr(_compressors, "zstd", None)
    if compressor is None:
        compressor = _compressors.zstd = zstd.ZstdCompressor(level=1)
    return compressor


def decode(codec: str, stored: bytes) -> bytes:
    if codec == RAW:
        return stored
    if codec == ZSTD:
        return zstd.decompress(stored)
    raise ValueError(f"unknown blob codec {codec!r} (written by a newer llmitm?)")
