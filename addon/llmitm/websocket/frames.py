"""The one WebSocket frame llmitm writes on its hot path: a server's unmasked, unfragmented
text frame (RFC 6455 §5.2). wsproto reads everything and writes the rest (pings, closes);
building this frame through it cost ~6 µs per event, several times the rest of an event's
work on the socket."""

from __future__ import annotations

import struct

_TEXT = 0x81  # FIN + opcode 1 (text)


def text_frame(payload: bytes) -> bytes:
    """``payload`` (UTF-8 text) as one final text frame from a server (servers never mask)."""
    size = len(payload)
    if size < 126:
        return bytes((_TEXT, size)) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", _TEXT, 126, size) + payload
    return struct.pack("!BBQ", _TEXT, 127, size) + payload
