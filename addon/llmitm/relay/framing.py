"""Response body framing for the relay: chunked transfer-coding, content-length, or read to
close. The decoder tells a complete body from a cut one; on the hot path (one chunk per read,
as streaming servers send them) it is a find and two slices."""

from __future__ import annotations

from llmitm.errors import TransportError


class FramingError(TransportError, ValueError):
    """The body's framing is broken."""


class ChunkedDecoder:
    """Incremental ``transfer-encoding: chunked`` decoder."""

    __slots__ = ("_buffer", "_remaining", "done")

    def __init__(self) -> None:
        self._buffer = b""
        self._remaining = 0  # payload bytes (plus the CRLF after them) still to come
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        pieces: list[bytes] = []
        position = 0
        end = len(data)
        while position < end and not self.done:
            if self._remaining:
                take = min(self._remaining, end - position)
                payload_left = self._remaining - 2  # the trailing CRLF is not payload
                if payload_left > 0:
                    pieces.append(data[position : position + min(take, payload_left)])
                self._remaining -= take
                position += take
                continue
            line_end = data.find(b"\r\n", position)
            if line_end < 0:
                self._buffer = data[position:]
                break
            size_text = data[position:line_end].split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise FramingError(f"bad chunk size {size_text[:20]!r}") from None
            position = line_end + 2
            if size == 0:
                # Trailers are not relayed; the body is complete once the size-0 line arrives.
                self.done = True
                break
            self._remaining = size + 2
        return [piece for piece in pieces if piece]


class LengthDecoder:
    """A body of ``content-length`` bytes."""

    __slots__ = ("_remaining", "done")

    def __init__(self, length: int) -> None:
        self._remaining = length
        self.done = length == 0

    def feed(self, data: bytes) -> list[bytes]:
        if len(data) >= self._remaining:
            data = data[: self._remaining]
            self.done = True
        self._remaining -= len(data)
        return [data] if data else []


class CloseDecoder:
    """A body that ends when the connection does (so a cut cannot be told from the end)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        return [data] if data else []


type BodyDecoder = ChunkedDecoder | LengthDecoder | CloseDecoder


def body_decoder(headers: list[tuple[str, str]], status: int, method: str) -> BodyDecoder:
    lowered = {name.lower(): value for name, value in headers}
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return LengthDecoder(0)
    if "chunked" in lowered.get("transfer-encoding", "").lower():
        return ChunkedDecoder()
    length = lowered.get("content-length")
    if length is not None and length.strip().isdigit():
        return LengthDecoder(int(length))
    return CloseDecoder()
