"""Same API in and out, bytes untouched — but never a silent end.

A stream relayed without translation still has to end properly: when the upstream stops
before its terminal event (chat ``[DONE]``; Responses ``response.completed``/``incomplete``/
``failed``), the guard appends a terminal error in the stream's own protocol. It only frames
events and looks at their names, so the passthrough path stays nearly free. At the end it
reads the usage, for accounting, from the last two chunks only (the chat usage chunk just
before ``[DONE]``; the Responses terminal event's ``response.usage``).

An event that spans chunks is held as a list of pieces and only each new chunk (plus the last
few held bytes, for a blank line split between chunks) is searched for its end, so one huge
event costs time linear in its size.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmitm.wire.errors import (
    ApiError,
    chat_error_chunk,
    response_object_error,
    responses_error_event,
)
from llmitm.wire.paths import ApiName
from llmitm.wire.sse import DONE_DATA, DONE_FRAME, SSEDecoder, SSEEvent, encode_typed

_TERMINAL_TYPES = (b"response.completed", b"response.incomplete", b"response.failed")
_TERMINAL_NAMES = frozenset(t.decode() for t in _TERMINAL_TYPES)

CUT = ApiError(
    message="The upstream stream ended before its terminal event.",
    type="server_error",
    code="server_error",
    status=502,
)


class StreamGuard:
    """Relay ``api``'s SSE unchanged; close it with an error if the upstream did not."""

    final_response = None  # the upstream's own Response: llmitm stores none of its own
    knows_final_response = False  # its bytes hold it: a store that wants it keeps them

    def __new__(cls, api: ApiName, *, strip_usage: bool = False) -> StreamGuard:
        # The usage-stripping variant is a subclass, so the plain guard's hot path pays
        # nothing for it.
        if strip_usage and cls is StreamGuard:
            cls = UsageStrippingGuard
        return super().__new__(cls)

    def __init__(self, api: ApiName, *, strip_usage: bool = False) -> None:
        self.api = api
        self._first = True
        self._held: list[bytes] = []  # an unfinished event's pieces, in arrival order
        self._tail = b""  # the last bytes held: a blank line may start there
        self._last = b""  # the latest whole events, where a terminal event would be
        self._prev = b""  # the whole events before them, where a chat usage chunk would be
        self.usage: dict[str, Any] | None = None
        """The upstream's usage as it sent it (either API's shape), known after close()."""
        self.finished = False
        self._last_sequence = -1
        self._response: dict[str, Any] | None = None

    @property
    def response_id(self) -> str | None:
        """The id in a Responses stream's ``response.created`` (for the id's owner)."""
        response_id = (self._response or {}).get("id")
        return response_id if isinstance(response_id, str) else None

    def start(self) -> bytes:
        return b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._held and chunk.endswith((b"\n\n", b"\r\n\r\n")):
            # The hot path: whole events in one chunk (one event per chunk, as streaming
            # servers write them). Nothing to parse now; close() looks at the last one.
            if self._first:
                self._first = False
                if self.api == "responses":
                    self._watch_all(chunk)  # response.created: its id names a failure
            if chunk != DONE_FRAME or self.api == "chat":
                # A Responses stream may add [DONE] after its terminal event.
                self._prev, self._last = self._last, chunk
            return chunk
        if self.finished:
            held = self._take_held()
            return held + chunk if held else chunk
        # Only whole events go out: if the upstream is cut mid-event, the client must not
        # get half an event glued to the closing error.
        tail = self._tail
        end = _after_last_event(chunk)
        if not end and tail:
            # Only a blank line that starts in the held bytes is left to find.
            end = _after_last_event(tail + chunk[:_TAIL]) - len(tail)
        if end <= 0:
            # No blank line ends in this chunk (none lies wholly in the tail: held bytes
            # never hold one).
            self._held.append(chunk)
            self._tail = (tail + chunk[-_TAIL:])[-_TAIL:]
            return b""
        rest = chunk[end:]
        if self._held:
            self._held.append(chunk[:end])
            out = self._take_held()
        else:
            out = chunk[:end] if rest else chunk
        if rest:
            self._held = [rest]
            self._tail = rest[-_TAIL:]
        if out != DONE_FRAME or self.api == "chat":
            self._prev, self._last = self._last, out
            if self._first:
                self._first = False
                if self.api == "responses":
                    self._watch_all(self._last)
        return out

    def _take_held(self) -> bytes:
        held = b"".join(self._held)
        self._held = []
        self._tail = b""
        return held

    def close(self) -> bytes:
        held = self._take_held()
        if held and _whole_events(held):
            self._last = held = held + b"\n\n"  # a last event that only lacked its blank line
        else:
            held = b""
        # Each held part is decoded once, and never joined: one of them may be a huge event.
        last = _events(self._last)
        for name, payload in last:
            self._watch(name, payload)
        self.usage = _last_usage(last, self.api) or _last_usage(_events(self._prev), self.api)
        return held if self.finished else held + self.fail(CUT)

    def _watch_all(self, data: bytes) -> None:
        for name, payload in _events(data):
            self._watch(name, payload)

    def fail(self, error: ApiError) -> bytes:
        if self.finished:
            return b""
        self.finished = True
        if self.api == "chat":
            return b"data: " + orjson.dumps(chat_error_chunk(error)) + b"\n\n" + DONE_FRAME
        sequence = self._last_sequence + 1
        event = responses_error_event(error, sequence)
        response = dict(self._response or {"object": "response", "output": []})
        response.update(status="failed", error=response_object_error(error))
        failed = {"type": "response.failed", "sequence_number": sequence + 1, "response": response}
        return encode_typed("error", orjson.dumps(event)) + encode_typed(
            "response.failed", orjson.dumps(failed)
        )

    def _watch(self, name: str | None, data: bytes) -> None:
        if self.api == "chat":
            self.finished = data == DONE_DATA
            return
        if data == DONE_DATA:
            return
        self.finished = name in _TERMINAL_NAMES or (name is None and _looks_terminal(data))
        if self.finished:
            return
        if name == "response.created" or (self._response is None and b"response.created" in data):
            # Keep the Response object, so a synthesized response.failed names the same id.
            self._remember(data)
        elif b'"sequence_number"' in data:
            self._remember_sequence(data)

    def _remember(self, data: bytes) -> None:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(event, dict):
            if isinstance(event.get("response"), dict):
                self._response = event["response"]
            if isinstance(event.get("sequence_number"), int):
                self._last_sequence = event["sequence_number"]

    def _remember_sequence(self, data: bytes) -> None:
        # Cheap: find the number without parsing the whole event.
        start = data.rfind(b'"sequence_number":')
        digits = data[start + 18 : start + 30].split(b",")[0].split(b"}")[0].strip()
        if digits.isdigit():
            self._last_sequence = int(digits)


_EMPTY_CHOICES = (b'"choices":[]', b'"choices": []')
_TAIL = 3  # one byte less than the longest blank-line spelling, CRLF CRLF


class UsageStrippingGuard(StreamGuard):
    """A chat stream whose usage chunk llmitm asked for (``stream_options.include_usage``)
    although the client did not: the chunk is read for accounting, then dropped, so the
    client sees the stream it asked for. Only a chunk with empty ``choices`` is dropped: a
    server that puts usage on its last content chunk keeps it (a field more is harmless)."""

    def feed(self, chunk: bytes) -> bytes:
        out = super().feed(chunk)
        if out and (_EMPTY_CHOICES[0] in out or _EMPTY_CHOICES[1] in out):
            out = _drop_usage_chunks(out)
        return out


def _drop_usage_chunks(data: bytes) -> bytes:
    """``data`` (whole events) without the events that are usage-only chat chunks."""
    separator = b"\r\n\r\n" if b"\r\n\r\n" in data else b"\n\n"
    kept = []
    for frame in data.split(separator):
        empty = _EMPTY_CHOICES[0] in frame or _EMPTY_CHOICES[1] in frame
        if empty and b'"usage"' in frame and _is_usage_chunk(frame):
            continue
        kept.append(frame)
    return separator.join(kept)


def _is_usage_chunk(frame: bytes) -> bool:
    payload = frame.partition(b"data:")[2].strip()
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return (
        isinstance(event, dict)
        and event.get("choices") == []
        and isinstance(event.get("usage"), dict)
    )


def _whole_events(data: bytes) -> bool:
    decoder = SSEDecoder()
    events = decoder.feed(data) + decoder.close()
    return bool(events) and all(_whole(payload) for _name, payload in events)


def _whole(data: bytes) -> bool:
    """Whether an event's data is complete (a cut mid-event leaves unparseable JSON)."""
    if data == DONE_DATA:
        return True
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def _after_last_event(data: bytes) -> int:
    """The index just past the last blank line (any line-end spelling), 0 if there is none.
    One scan per spelling (``rfind`` alone, no ``in`` first), and the CR spellings only when
    there is a CR: this runs once per chunk of an event held across reads."""
    if data.find(b"\r") < 0:
        # memrchr first: the pieces of a huge event hold no LF, and a two-byte search scans
        # several times slower than a one-byte one.
        if data.rfind(b"\n") < 0:
            return 0
        lf = data.rfind(b"\n\n") + 2
        return lf if lf > 1 else 0
    lf = data.rfind(b"\n\n") + 2
    crlf = data.rfind(b"\r\n\r\n") + 4
    cr = data.rfind(b"\r\r") + 2
    return max(lf if lf > 1 else 0, crlf if crlf > 3 else 0, cr if cr > 1 else 0)


def _looks_terminal(data: bytes) -> bool:
    head = data[:200]
    return any(marker in head for marker in _TERMINAL_TYPES) and _is_terminal_json(data)


def _is_terminal_json(data: bytes) -> bool:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and event.get("type") in _TERMINAL_NAMES


def _events(data: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return decoder.feed(data) + decoder.close()


def _last_usage(events: list[SSEEvent], api: ApiName) -> dict[str, Any] | None:
    """The usage of the last of ``events`` that has one: a chat chunk's ``usage``, or a
    Responses terminal event's ``response.usage``. Called once per stream, at its end."""
    for _name, payload in reversed(events):
        if b'"usage"' not in payload:
            continue
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if api == "responses":
            if event.get("type") not in _TERMINAL_NAMES:
                continue
            response = event.get("response")
            event = response if isinstance(response, dict) else {}
        usage = event.get("usage")
        if isinstance(usage, dict) and usage:
            return usage
    return None
