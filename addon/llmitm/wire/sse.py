"""Server-sent events: an incremental decoder and the encoders for both APIs' frames.

The decoder works on bytes, so a chunk boundary inside a UTF-8 character is harmless: data is
only decoded when its JSON is parsed. It accepts LF, CRLF and CR line ends (also a CR at the
end of one chunk and its LF at the start of the next), comments, multi-line ``data``, events
without an ``event:`` line, and a missing final blank line (flushed by :meth:`SSEDecoder.close`).

The common shapes — ``data: …`` alone and ``event: …`` + ``data: …`` — take a fast path: this
runs once per chunk for every stream through the proxy.

Decoding is linear in bytes for any event size: an unfinished event is kept as a list of its
pieces, each new chunk is scanned only for itself (plus whether the buffered data ended with a
line end, for a blank line split across two chunks), and the pieces are joined once, when the
event's blank line arrives. Re-joining and rescanning the whole pending event per chunk made
one 20 MiB event cost seconds to minutes. A held event that is one ``data: `` line (the shape
of a huge delta) is joined straight into its data: one copy of its bytes, not three (join,
split, slice) — each fresh copy of tens of MiB costs about as much as relaying them.
"""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"
DONE_DATA = b"[DONE]"
DONE_FRAME = b"data: [DONE]\n\n"
BIG_EVENT = 64 << 10
"""Held bytes from this size on make an unfinished ``data:`` line a big one
(:attr:`SSEDecoder.held_line`): a driver may then take it piece by piece."""

type SSEEvent = tuple[str | None, bytes]
"""One dispatched event: its ``event:`` name (``None`` when absent) and its data bytes.
A plain tuple, not a NamedTuple: it is built once per event on the hot path."""


class SSEDecoder:
    """Feed it chunks as they arrive; it returns the events completed so far."""

    __slots__ = ("_ends_lf", "_held", "_lines", "_pending", "_pending_cr", "_started", "held_line")

    def __init__(self) -> None:
        # The unfinished event's bytes (line ends already LF), in arrival order.
        self._pending: list[bytes] = []
        # Whether those bytes end with LF: an LF first in the next chunk is then a blank line.
        self._ends_lf = False
        # Whether those bytes hold a line end (else they are the start of one line).
        self._lines = False
        # A CR that ended the previous chunk: if the next chunk starts with LF, that LF
        # belongs to the same line end.
        self._pending_cr = False
        # Until the first bytes are seen: a UTF-8 byte-order mark there is not data.
        self._started = False
        # How many bytes are held.
        self._held = 0
        self.held_line = False
        """Whether the held bytes are the start of one ``data: `` line of :data:`BIG_EVENT`
        bytes or more, as they came (no CR was rewritten in them): :meth:`held_pieces` then
        gives them as they came."""

    def held_pieces(self) -> list[bytes]:
        """The held bytes of an unfinished event, as a list of the pieces they came in."""
        return list(self._pending)

    def drop_held(self) -> None:
        """Forget the held bytes: the driver took them (with :meth:`held_pieces`) and the
        rest of their event, and will feed what follows."""
        self._pending = []
        self._held = 0
        self._ends_lf = self._lines = self.held_line = False

    @property
    def idle(self) -> bool:
        """Nothing buffered, no pending CR, past the start: a chunk that is one whole event
        means exactly that event."""
        return self._started and not self._pending and not self._pending_cr

    def single_event_data(self, chunk: bytes) -> bytes | None:
        """The data of ``chunk`` if it is exactly one plain event (``data:`` alone, or one
        ``event:`` line and one ``data:`` line) and nothing is buffered; else ``None``.
        A pure check: it consumes nothing, so ``feed(chunk)`` is still the fallback.

        Runs once per chunk: ``find`` rather than ``in`` (``bytes in bytes`` first tries the
        needle as an integer and swallows that TypeError, several times slower)."""
        if self._pending or self._pending_cr or not self._started:
            return None
        if chunk.startswith(b"data: "):
            start = 6
        elif chunk.startswith(b"event: "):
            newline = chunk.find(b"\n", 7)
            if newline < 0 or not chunk.startswith(b"data: ", newline + 1):
                return None
            start = newline + 7
        else:
            return None
        end = len(chunk) - 2
        if (
            chunk.find(b"\n", start) != end  # the data line runs up to the final blank line
            or chunk[-1] != 0x0A
            or chunk.find(b"\r") >= 0  # any CR is a line end in SSE: the general path's job
        ):
            return None
        return chunk[start:end]

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if (
            self._started
            and not self._pending
            and not self._pending_cr
            and chunk.endswith(b"\n\n")
            and chunk.find(b"\n\n", 0, len(chunk) - 2) < 0
            and chunk.find(b"\r") < 0
        ):
            # The hot path: exactly one whole event, as streaming servers write them.
            events: list[SSEEvent] = []
            if len(chunk) > 2:
                _parse_block(chunk[:-2], events)
            return events
        if not chunk:
            # An empty chunk between a CR and its LF must not forget the pending CR (that LF
            # would count as a second line end and dispatch a half-read event).
            return []
        if self._pending_cr:
            self._pending_cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
                if not chunk:
                    return []
        if chunk.find(b"\r") >= 0:
            if chunk.endswith(b"\r"):
                self._pending_cr = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not self._started:
            return self._start(chunk)
        # Only the new bytes are scanned; a blank line may also span the two chunks.
        pending = self._pending
        newline = end = -1  # -1: the held bytes end with the first LF of the blank line
        if not (self._ends_lf and chunk.startswith(b"\n")):
            # A one-byte find is a memchr; a two-byte one scans several times slower, and
            # the pieces of a huge event hold no LF at all.
            newline = chunk.find(b"\n")
            if newline >= 0:
                end = chunk.find(b"\n\n", newline)
            if end < 0:
                pending.append(chunk)
                self._held += len(chunk)
                self._ends_lf = chunk.endswith(b"\n")
                self._lines = self._lines or newline >= 0
                self.held_line = (
                    not self._lines and self._held >= BIG_EVENT and pending[0].startswith(b"data: ")
                )
                return []
        if not pending:
            return self._split(chunk)
        if not self._lines and newline == end >= 0 and pending[0].startswith(b"data: "):
            # A held single ``data:`` line (a huge delta): joined straight into its data.
            pending[0] = pending[0][6:]
            pending.append(chunk[:end])
            data = b"".join(pending)
            self._pending = []
            self._held = 0
            self._ends_lf = self._lines = self.held_line = False
            events: list[SSEEvent] = [(None, data)]
            rest = chunk[end + 2 :]
            if rest:
                events += self._split(rest)
            return events
        pending.append(chunk)
        return self._split(b"".join(pending))

    def _start(self, chunk: bytes) -> list[SSEEvent]:
        """The first bytes: a byte-order mark, maybe split over chunks, is dropped."""
        buffer = b"".join((*self._pending, chunk))
        if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
            self._pending = [buffer]
            self._held = len(buffer)
            return []
        self._started = True
        return self._split(buffer.removeprefix(_BOM))

    def _split(self, buffer: bytes) -> list[SSEEvent]:
        """Dispatch the whole events in ``buffer``; keep what follows its last blank line."""
        blocks = buffer.split(b"\n\n") if len(buffer) < BIG_EVENT else _blocks(buffer)
        rest = blocks.pop()
        self._pending = [rest] if rest else []
        self._ends_lf = rest.endswith(b"\n")
        self._lines = rest.find(b"\n") >= 0
        self._held = len(rest)
        self.held_line = not self._lines and self._held >= BIG_EVENT and rest.startswith(b"data: ")
        events: list[SSEEvent] = []
        for block in blocks:
            if block:
                _parse_block(block, events)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: dispatch an event left without its final blank line."""
        block = b"".join(self._pending)
        self._pending = []
        self._held = 0
        self._ends_lf = self._lines = self.held_line = False
        self._pending_cr = False
        if not self._started:
            block = block.removeprefix(_BOM)
        events: list[SSEEvent] = []
        if block.strip(b"\n"):
            _parse_block(block, events)
        return events


def _blocks(buffer: bytes) -> list[bytes]:
    """``buffer.split(b"\\n\\n")`` for a big buffer: each LF is found with memchr and its
    neighbour looked at, as a two-byte search scans several times slower (a huge event
    holds a handful of LFs, small events a few per event)."""
    blocks = []
    start = 0
    find = buffer.find
    newline = find(b"\n")
    while newline >= 0:
        if buffer[newline + 1 : newline + 2] == b"\n":
            blocks.append(buffer[start:newline])
            start = newline + 2
            newline = find(b"\n", start)
        else:
            newline = find(b"\n", newline + 1)
    blocks.append(buffer[start:])
    return blocks


def _parse_block(block: bytes, events: list[SSEEvent]) -> None:
    """Parse the lines between two blank lines (the fast paths cover nearly every event)."""
    if block.startswith(b"data: "):
        if b"\n" not in block:
            events.append((None, block[6:]))
            return
    elif block.startswith(b"event: "):
        newline = block.find(b"\n")
        if (
            newline > 0
            and block.startswith(b"data: ", newline + 1)
            and block.find(b"\n", newline + 1) < 0
        ):
            # "replace", as in the general path: a non-UTF-8 name must not raise out of feed();
            # an empty name is no name, as there.
            name = block[7:newline].decode("utf-8", "replace") or None
            events.append((name, block[newline + 7 :]))
            return
    _parse_lines(block, events)


def _parse_lines(block: bytes, events: list[SSEEvent]) -> None:
    """The general line-by-line algorithm of the WHATWG event-stream spec."""
    name: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line:
            # A stray blank line inside the block (three newlines in a row) dispatches too.
            if data:
                events.append((name, b"\n".join(data)))
            name, data = None, []
            continue
        if line.startswith(b":"):
            continue
        field, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace") or None
        # "id" and "retry" carry nothing the translators need.
    if data:
        events.append((name, b"\n".join(data)))


def encode_event(name: str | None, data: bytes) -> bytes:
    """One frame; multi-line data is split over several ``data:`` lines."""
    if b"\n" in data or b"\r" in data:
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        body = b"".join(b"data: " + line + b"\n" for line in lines)
    else:
        body = b"data: " + data + b"\n"
    if name is None:
        return body + b"\n"
    return b"event: " + name.encode() + b"\n" + body + b"\n"


def encode_data(data: bytes) -> bytes:
    """A data-only frame (chat chunks), for data known to hold no line breaks (orjson output)."""
    return b"data: " + data + b"\n\n"


def encode_typed(event_type: str, data: bytes) -> bytes:
    """A Responses frame whose ``event:`` repeats the JSON ``type`` (orjson output, one line)."""
    return b"event: " + event_type.encode() + b"\ndata: " + data + b"\n\n"
