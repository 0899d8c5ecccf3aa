"""Bytes in, bytes out: one upstream SSE stream through decoder, translator and encoder.

This is what the proxy's stream callable, ``llmitm translate`` and the benchmarks drive. Feed
it chunks split anywhere; each call returns the bytes ready for the client (possibly empty —
the caller decides how to pass "nothing yet" to its transport). ``close()`` at the end of the
upstream body always ends the client's stream properly: a terminal event in the client's
protocol, never a silent clean end. A malformed upstream event ends the stream the same way.

:meth:`StreamPipeline.feed_parts` gives the same bytes as a list of parts, for a transport that
sends each part as it is (mitmproxy's stream callable): there an event held across many reads
(a huge delta) costs no copy of its size beyond the one parse needs. A chat event that goes out
as it came is the very pieces it came in; a huge text in Responses events is encoded once and
shared by every event that repeats it (the delta and the four closing events), each event
being its small JSON around that one encoding. Every fresh copy of tens of MiB costs about as
much as relaying them, so these copies were most of what one huge event cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from llmitm.translate.chat_normalise import MARKER_SPAN, ChatNormaliser, has_marker
from llmitm.translate.context import TranslationContext
from llmitm.translate.normalise import ResponsesNormaliser
from llmitm.translate.protocol import EventTranslator
from llmitm.translate.responses_compat import CallRestorer
from llmitm.translate.stream_to_chat import DONE, ResponsesToChatStream
from llmitm.translate.stream_to_responses import ChatToResponsesStream
from llmitm.translate.think_summary import ReasoningAsSummary
from llmitm.wire.errors import ApiError
from llmitm.wire.modes import Direction
from llmitm.wire.sse import DONE_DATA, DONE_FRAME, SSEDecoder

_dumps = orjson.dumps
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

BIG_TEXT = 1 << 20
"""A string this long in a Responses event is encoded once per stream and sent in parts of
its own, of at most this size (see :meth:`StreamPipeline.feed_parts`)."""
_SLOT = orjson.Fragment(b"\x00")
"""Stands for a big string while the event around it is encoded: orjson escapes every NUL in
a string, so a raw NUL in its output is only ever this."""


def _malformed(data: bytes) -> ApiError:
    preview = data[:80].decode("utf-8", "replace")
    return ApiError(
        message=f"The upstream sent a malformed stream event: {preview!r}",
        type="server_error",
        code="server_error",
        status=502,
    )


class StreamPipeline:
    """One stream's translation from upstream bytes to client bytes."""

    def __init__(
        self,
        direction: Direction,
        context: TranslationContext | None = None,
        *,
        strip_usage: bool = False,
    ) -> None:
        """``strip_usage`` (``normalise-chat`` only): drop the usage chunk llmitm asked for
        on the client's behalf, after reading it."""
        self.direction = direction
        self.context = context or TranslationContext()
        self._decoder = SSEDecoder()
        self._events = 0
        """Events read, but for those :attr:`relay` passed on while armed (see events_in)."""
        self._chat_in: ChatToResponsesStream | None = None
        """The translator when it takes chat chunks (it starts a stream and reads [DONE])."""
        self._chat_norm: ChatNormaliser | None = None
        """The translator when it relays chat chunks as chat: it reads [DONE] and is given
        each event's raw data, so what needs no repair keeps its bytes."""
        self._responses_norm: ResponsesNormaliser | RestoringNormaliser | None = None
        """The translator when it relays Responses events as Responses: it is given each
        event's name and raw data, so a conformant delta keeps its bytes."""
        self.translator: EventTranslator
        if direction == "responses-to-chat":
            self.translator = ResponsesToChatStream(self.context)
            self._encode = _encode_chat
        elif direction == "chat-to-responses":
            self.translator = self._chat_in = ChatToResponsesStream(self.context)
            self._encode = _encode_responses
        elif direction == "normalise-chat":
            self.translator = self._chat_norm = ChatNormaliser(
                self.context, strip_usage=strip_usage
            )
            self._encode = b"".join
        elif direction == "normalise-responses":
            normaliser = ResponsesNormaliser(self.context)
            restoring = RestoringNormaliser(normaliser) if self.context.tools else normaliser
            if self.context.options.reasoning_summary:
                # Raw reasoning rewritten as summary events: every event is parsed.
                self.translator = ReasoningAsSummary(restoring)
                self._encode = _encode_responses
            else:
                self.translator = self._responses_norm = restoring
                self._encode = _encode_normalised
        else:
            raise ValueError(f"unknown direction {direction!r}")
        self.knows_final_response = isinstance(
            self.translator, ChatToResponsesStream | ResponsesNormaliser
        )
        """Whether the translator's final Response is the one the client got (a wrapper
        that rewrites events after it, restoring tools or summarising reasoning, says no)."""
        self._fast_frame = self.translator.fast_frame
        self._fast_chunk = self.translator.fast_chunk
        self._idle = False
        """The decoder's ``idle``, kept since it last took bytes: the hot path reads it per
        chunk (an attribute, not a property call)."""
        if self._responses_norm is not None:
            self._fast_frame = self._normalised_frame
        self.relay: Callable[[bytes], bool] | None = None
        """The hottest path, armed between chunks when one applies: ``relay(chunk)`` says
        whether ``chunk`` is one whole event that goes out as it came, and then has taken
        it into account (a conformant Responses delta that fits its item's template, a chat
        text delta shaped like the stream's first plain one). A driver that calls it first
        sends such a chunk itself (the proxy's stream callable: one Python call per event);
        :meth:`feed` and :meth:`feed_parts` try it first on their own."""
        self._relaying: ResponsesNormaliser | ChatNormaliser | None = self._chat_norm
        """The normaliser whose relay :attr:`relay` is armed with (a restoring one's events
        must be numbered by its restorer too: it has none)."""
        if type(self._responses_norm) is ResponsesNormaliser:
            self._relaying = self._responses_norm
        self._armed_at = 0
        """The normaliser's :meth:`_relay_mark` when :attr:`relay` was armed: the events it
        relays since are counted by the difference."""
        self._big: dict[int, tuple[str, list[bytes]]] | None = None
        """Once a big event was held across reads (Responses clients): the JSON of each big
        string encoded so far, by the string's id (the string is kept, so its id stays its
        own)."""
        # The chat normaliser's markers, searched in a held event's pieces as they come: the
        # event's first piece, how many pieces were searched, their last bytes, whether one
        # was found.
        self._scan_first: bytes | None = None
        self._scanned = 0
        self._scan_tail = b""
        self._marked = False

    @property
    def finished(self) -> bool:
        return self.translator.finished

    @property
    def events_in(self) -> int:
        """Upstream events read so far."""
        if self.relay is None:
            return self._events
        return self._events + self._relay_mark() - self._armed_at

    def _relay_mark(self) -> int:
        """What grows by one with each event the armed relay takes."""
        normaliser = self._relaying
        if type(normaliser) is ResponsesNormaliser:
            return normaliser.next_sequence
        return normaliser.relayed  # type: ignore[union-attr]

    @property
    def usage(self) -> dict[str, Any] | None:
        """The upstream's usage once the stream has ended (either API's shape), if it sent
        any: what accounting reads, also when the client did not ask to see it."""
        return self.translator.usage

    @property
    def response_id(self) -> str | None:
        return self.translator.response_id

    @property
    def final_response(self) -> dict[str, Any] | None:
        return self.translator.final_response

    def start(self) -> bytes:
        """Bytes to send before the upstream answers (Responses clients get
        ``response.created`` at once when the client's model is known)."""
        if self._chat_in is not None and self.context.model:
            return self._encode(self._chat_in.start())
        return b""

    def feed(self, chunk: bytes) -> bytes:
        relay = self.relay
        if relay is not None and relay(chunk):
            return chunk
        tried = self._disarm()
        out = self._feed(chunk, tried)
        self._arm()
        return out

    def _disarm(self) -> bool:
        """An event takes another path than :attr:`relay`: count what it relayed, and
        disarm it (whether it was armed)."""
        if self.relay is None:
            return False
        self._events += self._relay_mark() - self._armed_at
        self.relay = None
        return True

    def _arm(self) -> None:
        """Arm :attr:`relay` for the next chunk if a template holds and nothing is held."""
        normaliser = self._relaying
        if normaliser is None:
            return
        self._disarm()
        if self._idle and self._big is None and not self._decoder.held_line:
            self.relay = normaliser.fast_relay()
            self._armed_at = self._relay_mark()

    def _feed(self, chunk: bytes, relay_tried: bool = False) -> bytes:
        # The hot paths, once per upstream chunk, for a chunk that is one whole event: byte for
        # byte what the general path writes, which the split-invariance property tests check.
        idle = self._idle
        fast_chunk = self._fast_chunk
        if idle and fast_chunk is not None and not relay_tried:
            # (A relay that did not take the chunk: the template's fast chunk would not.)
            # Straight from the raw bytes (a chat text delta matching the stream's template).
            out = fast_chunk(chunk)
            if out is not None:
                self._events += 1
                return out
        decoder = self._decoder
        responses_norm = self._responses_norm
        if responses_norm is not None:
            if idle:
                # Several events in one read (a busy proxy reads many at once): the leading
                # ones that fit the template go out as they came, the rest as usual.
                before = responses_norm.sequence
                relayed = responses_norm.relay_events(chunk)
                if relayed:
                    self._events += responses_norm.sequence - before
                    if relayed == len(chunk):
                        return chunk
                    return chunk[:relayed] + self.feed(chunk[relayed:])
            elif chunk.find(b"\r") < 0:
                # A read that starts inside an event: the decoder takes it up to the first
                # blank line, so the events after it can go the way above.
                cut = chunk.find(b"\n\n") + 2
                if 1 < cut < len(chunk):
                    return self.feed(chunk[:cut]) + self.feed(chunk[cut:])
        fast = self._fast_frame
        if fast is not None:
            # One parsed event whose translation the translator writes straight to bytes
            # (a plain text delta).
            data = decoder.single_event_data(chunk)
            if data is not None and data != DONE_DATA:
                try:
                    obj = _loads(data)
                except _JSONDecodeError:
                    obj = None
                if type(obj) is dict:
                    self._events += 1
                    out = fast(obj, chunk, data)
                    if out is not None:
                        return out
                    frames = self.translator.feed(obj)
                    return self._encode(frames) if frames else b""
        frames = self._translate(decoder.feed(chunk))
        self._idle = decoder.idle
        if not frames:
            return b""
        out = self._encode(frames)
        # A read of events all relayed as they came is passed on as the very object: a
        # recorder then keeps one leg, not two.
        return chunk if self._responses_norm is not None and out == chunk else out

    def feed_parts(self, chunk: bytes) -> list[bytes]:
        """:meth:`feed`'s bytes as a list of non-empty parts (their join is what ``feed``
        returns); like ``feed``, it tries :attr:`relay` first (a driver that tried it
        already asks again only for the few chunks it does not take). Only a big event held
        across reads takes another way: a chat event that
        goes out as it came is the pieces it came in, and from then on big strings in
        Responses events are parts of their own, encoded once."""
        if self._big is None and not self._decoder.held_line:
            out = self.feed(chunk)
            return [out] if out else []
        self._disarm()
        parts = self._feed_big(chunk)
        self._idle = self._decoder.idle  # what feed's fast paths read
        self._arm()
        return parts

    def _feed_big(self, chunk: bytes) -> list[bytes]:
        decoder = self._decoder
        if self._big is None and self._encode in _RESPONSES_ENCODERS:
            self._big = {}
        newline = chunk.find(b"\n")  # memchr: a huge event's pieces hold no LF
        end = chunk.find(b"\n\n", newline) if newline >= 0 else -1
        if not decoder.held_line or end < 0 or newline != end or chunk.find(b"\r", 0, end + 2) >= 0:
            # More of the held event, nothing held, or a held event whose end the decoder
            # rewrites (its bytes are then not the ones that came).
            if decoder.held_line:
                self._scan_held(decoder.held_pieces())
            return self._parts(self._translate(decoder.feed(chunk)))
        pieces = decoder.held_pieces()
        chat_norm = self._chat_norm
        if chat_norm is not None:
            self._scan_held(pieces)
            marked = self._marked or self._marks(self._scan_tail, chunk[:end])
            self._scan_first, self._scan_tail = None, b""
            pieces.append(chunk[: end + 2])
            self._events += 1
            if chat_norm.plain_held(pieces[0][6:4096], marked):
                # Nothing to look at: the event goes out as the pieces it came in, unjoined.
                decoder.drop_held()
                rest = chunk[end + 2 :]
                return pieces + self._parts(self._translate(decoder.feed(rest))) if rest else pieces
            events = decoder.feed(chunk)  # the held event first: one data line, joined once
            frames = self._held_chat(chat_norm, events[0][1])
            parts = pieces if frames is None else self._parts(frames)
        else:
            events = decoder.feed(chunk)
            parts = self._parts(self._translate(events[:1]))
        if len(events) > 1:
            parts += self._parts(self._translate(events[1:]))
        return parts

    @staticmethod
    def _marks(tail: bytes, piece: bytes) -> bool:
        """Whether ``piece``, or it and the bytes searched before it (``tail``), hold one of
        the chat normaliser's markers; the piece is not copied to be searched."""
        return has_marker(tail + piece[:MARKER_SPAN]) or has_marker(piece)

    def _scan_held(self, pieces: list[bytes]) -> None:
        """Search the held pieces not searched yet for the chat normaliser's markers (as
        they come, so a held event's end finds the answer ready)."""
        if self._chat_norm is None:
            return
        if pieces[0] is not self._scan_first:  # another held event than the last searched
            self._scan_first, self._scanned, self._scan_tail = pieces[0], 0, b""
            self._marked = False
        if self._marked:
            return
        tail = self._scan_tail
        for piece in pieces[self._scanned :]:
            if self._marks(tail, piece):
                self._marked = True
                return
            tail = (tail + piece[-MARKER_SPAN:])[-MARKER_SPAN:]
        self._scanned = len(pieces)
        self._scan_tail = tail

    def _held_chat(self, chat_norm: ChatNormaliser, data: bytes) -> list[bytes] | None:
        """What :meth:`_translate` makes of a chat event that is not plain, ``None`` when
        that is the event as it came (then its pieces go out, not a copy)."""
        try:
            obj = _loads(data)
        except _JSONDecodeError:
            return chat_norm.fail(_malformed(data))
        if type(obj) is not dict:
            return chat_norm.fail(_malformed(data))
        return chat_norm.repair(obj)

    def _parts(self, frames: list[Any]) -> list[bytes]:
        """Frames as parts: Responses events around their big strings, encoded once."""
        if not frames:
            return []
        big = self._big
        if big is None:
            out = self._encode(frames)
            return [out] if out else []
        parts: list[bytes] = []
        small: list[bytes] = []
        for event in frames:
            if type(event) is bytes:
                small.append(event)
                continue
            strings: list[list[bytes]] = []
            swapped = _swap_big(event, big, strings)
            line = _EVENT_LINES.get(event["type"]) or _event_line(event["type"])
            if not strings:
                small += (line, _dumps(event), b"\n\n")
                continue
            pieces = _dumps(swapped).split(b"\x00")
            small += (line, pieces[0])
            for encoded, piece in zip(strings, pieces[1:], strict=True):
                parts.append(b"".join(small))
                parts += encoded
                small = [piece]
            small.append(b"\n\n")
        if small:
            parts.append(b"".join(small))
        return [part for part in parts if part]

    def _normalised_frame(self, event: dict[str, Any], chunk: bytes, data: bytes) -> bytes:
        """The parsed-event path of ``normalise-responses``: the general path, which learns
        the item's delta template from an event it writes back unchanged."""
        name = None
        if chunk.startswith(b"event: "):
            name = chunk[7 : chunk.find(b"\n")].decode("utf-8", "replace")
        frames = self._responses_norm.feed_event(event, name, data)  # type: ignore[union-attr]
        if not frames:
            return b""
        out = self._encode(frames)
        return chunk if out == chunk else out

    def _translate(self, events: list[tuple[str | None, bytes]]) -> list[Any]:
        translator = self.translator
        chat_in = self._chat_in
        chat_norm = self._chat_norm
        responses_norm = self._responses_norm
        frames: list[Any] = []
        for name, data in events:
            self._events += 1
            if responses_norm is not None:
                # Several events in one read: each delta that fits the template still goes
                # out unparsed.
                frame = responses_norm.fast_event(name, data)
                if frame is not None:
                    frames.append(frame)
                    continue
            if data == DONE_DATA:
                if chat_in is not None:
                    frames += chat_in.done()
                elif chat_norm is not None:
                    frames += chat_norm.done()
                continue
            if chat_norm is not None and chat_norm.plain(data):
                # Several events in one read: each conformant one still goes out unparsed.
                frames.append(b"data: " + data + b"\n\n")
                continue
            try:
                obj = _loads(data)
            except _JSONDecodeError:
                frames += translator.fail(_malformed(data))
                continue
            if type(obj) is not dict:
                frames += translator.fail(_malformed(data))
                continue
            if chat_norm is not None:
                frames += chat_norm.feed_data(obj, data)
            elif responses_norm is not None:
                frames += responses_norm.feed_event(obj, name, data)
            else:
                frames += translator.feed(obj)
        return frames

    @property
    def holds_deltas(self) -> bool:
        """Whether the translator holds its deltas one by one until their items close (a
        normalised Responses stream), which :meth:`fold` joins."""
        return hasattr(self.translator, "fold")

    def fold(self) -> None:
        """Join the deltas the translator holds for its closing events into few objects: for
        the shell to call now and then on a live stream, between chunks, never per chunk."""
        fold = getattr(self.translator, "fold", None)
        if fold is not None:
            fold()

    def close(self) -> bytes:
        """The upstream body ended (or broke): flush and terminate the client's stream."""
        self._disarm()
        out = self.feed_events_at_close()
        return out + self._encode(self.translator.close())

    def fail(self, error: ApiError) -> bytes:
        """The upstream broke mid-stream: end the client's stream with ``error``."""
        self._disarm()
        return self._encode(self.translator.fail(error))

    def feed_events_at_close(self) -> bytes:
        # The same handling as feed(): a last "data: [DONE]" without its blank line is still
        # [DONE] (it used to be skipped, failing a chat stream that had no finish_reason).
        self._disarm()
        frames = self._translate(self._decoder.close())
        return self._encode(frames) if frames else b""


class RestoringNormaliser:
    """The normaliser, then the calls of tools renamed for the upstream restored
    (:class:`~llmitm.translate.responses_compat.CallRestorer`).

    The normaliser's fast path holds here too while the restorer numbers events as the
    normaliser does, for deltas the restorer never changes (arguments may belong to a call
    it turns into a custom tool call, so they take the general path)."""

    fast_frame = None
    final_response = None

    def __init__(self, normaliser: ResponsesNormaliser) -> None:
        self.normaliser = normaliser
        self.restorer = CallRestorer(normaliser.context)

    @property
    def finished(self) -> bool:
        return self.normaliser.finished

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.normaliser.usage

    @property
    def error(self) -> ApiError | None:
        return self.normaliser.error

    @property
    def response_id(self) -> str | None:
        return self.normaliser.response_id

    @property
    def sequence(self) -> int:
        return self.normaliser.sequence

    def fold(self) -> None:
        self.normaliser.fold()

    def _in_step(self) -> bool:
        template = self.normaliser.template
        return (
            template is not None
            and template.event_type != "response.function_call_arguments.delta"
            and self.restorer.next_sequence == self.normaliser.sequence
        )

    def fast_chunk(self, chunk: bytes) -> bytes | None:
        if not self._in_step():
            return None
        out = self.normaliser.fast_chunk(chunk)
        if out is not None:
            self.restorer.relayed_around()
        return out

    def relay_events(self, chunk: bytes) -> int:
        if not self._in_step():
            return 0
        before = self.normaliser.sequence
        relayed = self.normaliser.relay_events(chunk)
        self.restorer.relayed_around(self.normaliser.sequence - before)
        return relayed

    def fast_event(self, name: str | None, data: bytes) -> bytes | None:
        if not self._in_step():
            return None
        out = self.normaliser.fast_event(name, data)
        if out is not None:
            self.restorer.relayed_around()
        return out

    def feed_event(self, event: dict[str, Any], name: str | None, data: bytes) -> list[Any]:
        # Only parsed events: the restorer may change any that is not a delta.
        events = self.normaliser.feed_event(event, name, data, keep_bytes=False)
        return self.restorer.events(events)  # type: ignore[arg-type]

    def feed(self, event: dict[str, Any]) -> list[Any]:
        return self.restorer.events(self.normaliser.feed(event))

    def close(self) -> list[Any]:
        return self.restorer.events(self.normaliser.close())

    def fail(self, error: ApiError) -> list[Any]:
        return self.restorer.events(self.normaliser.fail(error))


def _swap_big(
    value: Any, big: dict[int, tuple[str, list[bytes]]], strings: list[list[bytes]]
) -> Any:
    """``value`` with each string of :data:`BIG_TEXT` or more replaced by :data:`_SLOT`, its
    JSON (in pieces of at most that size) appended to ``strings`` in the order orjson writes
    them; ``value`` itself when it holds none (nothing is changed in place: the events are
    also the stored Response)."""
    kind = type(value)
    if kind is str:
        if len(value) < BIG_TEXT:
            return value
        known = big.get(id(value))
        if known is None or known[0] is not value:
            encoded = _dumps(value)
            # Cut once into the pieces the proxy sends, shared by every event repeating it.
            slices = [encoded[at : at + BIG_TEXT] for at in range(0, len(encoded), BIG_TEXT)]
            known = big[id(value)] = (value, slices)
        strings.append(known[1])
        return _SLOT
    if kind is dict:
        swapped = None
        for key, item in value.items():
            new = _swap_big(item, big, strings)
            if new is not item:
                if swapped is None:
                    swapped = dict(value)
                swapped[key] = new
        return value if swapped is None else swapped
    if kind is list:
        items = [_swap_big(item, big, strings) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def _encode_chat(frames: list[Any]) -> bytes:
    parts = []
    for frame in frames:
        if frame is DONE:
            parts.append(DONE_FRAME)
        else:
            parts.append(b"data: " + _dumps(frame) + b"\n\n")
    return b"".join(parts)


_EVENT_LINES: dict[str, bytes] = {}


def _event_line(event_type: str) -> bytes:
    line = _EVENT_LINES.get(event_type)
    if line is None:
        line = _EVENT_LINES[event_type] = b"event: " + event_type.encode() + b"\ndata: "
    return line


def _encode_normalised(frames: list[Any]) -> bytes:
    """Responses events, some already frames (deltas relayed as their own bytes)."""
    parts = []
    for event in frames:
        if type(event) is bytes:
            parts.append(event)
        else:
            line = _EVENT_LINES.get(event["type"]) or _event_line(event["type"])
            parts.append(line + _dumps(event) + b"\n\n")
    return b"".join(parts)


def _encode_responses(frames: list[Any]) -> bytes:
    parts = []
    for event in frames:
        line = _EVENT_LINES.get(event["type"]) or _event_line(event["type"])
        parts.append(line + _dumps(event) + b"\n\n")
    return b"".join(parts)


_RESPONSES_ENCODERS = (_encode_responses, _encode_normalised)
