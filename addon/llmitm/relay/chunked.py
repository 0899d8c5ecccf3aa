"""HTTP/1.1 chunked framing, decoded from the bytes of each read without copying them around.

h11 decodes a chunked body by appending every read to its receive buffer, slicing each
chunk's data out of it and handing it on as a ``bytearray``, which the relay then joins into
``bytes``: four copies of every byte, which a 20 MiB event pays in full. :class:`ChunkedBody`
takes the framing over where h11 stands (right after the head: what h11 read beyond it is
:attr:`ChunkedBody.pending`, decoded before the next read) and
returns each read's data as slices of that read — the read itself when it lies inside one
chunk, the common case for a large event. When the body ends, the relay hands h11 a last
chunk of its own, so h11, and with it httpcore's pool, sees the message end as it would have.

Pure: bytes in, bytes out; strict where h11 is (a malformed size line or chunk end is an
error, not guessed at).
"""

from __future__ import annotations

import re

from llmitm.errors import TransportError

_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})[ \t]*(?:;.*)?")
_MAX_LINE = 64 * 1024
"""The longest size or trailer line taken (h11's own bound on an incomplete event)."""


class ChunkError(TransportError, ValueError):
    """The framing is broken: a size line, a chunk's end or a trailer is not HTTP/1.1's."""


class ChunkedBody:
    """The framing state of one chunked body, from where h11 left it."""

    __slots__ = ("_carry", "_crlf", "_left", "_trailer", "ended", "pending", "rest")

    def __init__(self, left: int = 0, crlf: bytes = b"") -> None:
        self._left = left
        """Data bytes still to come in the current chunk."""
        self._crlf = crlf
        """The part of the CRLF after the current chunk's data still to come."""
        self._carry = b""
        """An incomplete line (a size line or a trailer) kept for the next read."""
        self._trailer = False
        """The last chunk has come; trailer lines, then an empty line, end the body."""
        self.ended = False
        self.rest = b""
        """Bytes read after the body's end (h11 gets them, as it would have)."""
        self.pending = b""
        """Bytes of the body already read (h11 held them), to decode before the next read."""

    def feed(self, data: bytes) -> list[bytes]:
        """The data in ``data``, the next bytes read; ``[]`` when it holds framing only.
        Raises :class:`ChunkError` on broken framing."""
        if not data:
            return []
        if self._carry:
            data, self._carry = self._carry + data, b""
        left = self._left
        if left >= len(data) and not self._crlf:
            self._left = left - len(data)  # the hot path: the read lies inside one chunk
            if self._left == 0:
                self._crlf = b"\r\n"
            return [data]
        pieces: list[bytes] = []
        position, end = 0, len(data)
        while position < end and not self.ended:
            if self._left:
                take = min(self._left, end - position)
                pieces.append(data[position : position + take])
                position += take
                self._left -= take
                if not self._left:
                    self._crlf = b"\r\n"
            elif self._crlf:
                position = self._chunk_end(data, position)
            else:
                line_end = data.find(b"\r\n", position)
                if line_end < 0:
                    self._keep(data[position:])
                    break
                line = data[position:line_end]
                position = line_end + 2
                if self._trailer:
                    self.ended = not line  # trailer fields are dropped, as h11 drops them
                else:
                    self._size_line(line)
        if self.ended:
            self.rest = data[position:]
        return pieces

    def _chunk_end(self, data: bytes, position: int) -> int:
        expected = self._crlf
        got = data[position : position + len(expected)]
        if got != expected[: len(got)]:
            raise ChunkError(f"malformed chunk end: {got!r}")
        self._crlf = expected[len(got) :]
        return position + len(got)

    def _size_line(self, line: bytes) -> None:
        match = _SIZE_LINE.fullmatch(line)
        if match is None:
            raise ChunkError(f"illegal chunk header: {line[:100]!r}")
        self._left = int(match.group(1), 16)
        self._trailer = self._left == 0

    def _keep(self, partial: bytes) -> None:
        if len(partial) > _MAX_LINE:
            raise ChunkError("a chunk size or trailer line is too long")
        self._carry = partial
