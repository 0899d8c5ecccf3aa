"""The byte template of a conformant Responses delta event: relay it without parsing it.

A conformant upstream (OpenAI, Azure) writes the deltas of one item as the same bytes around
three values that change from event to event::

    event: response.output_text.delta
    data: {"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_1",
           "output_index":0,"content_index":0,"delta":"Hi","logprobs":[],"obfuscation":"x1"}

:meth:`DeltaTemplate.learn` takes one such event that the normaliser's general path wrote back
as the very bytes it came as (``orjson.dumps`` of the normalised event equals the input data),
and keeps the constant bytes between the ``sequence_number``, ``delta`` and ``obfuscation``
values. :meth:`DeltaTemplate.match` then reads a later event's delta text from those slots.

Why a match is what the general path would write, byte for byte: JSON is compositional, so an
event whose bytes are the learned ones with other literals in the slots parses to the learned
event with just those values changed — the same item, position and indexes, which the general
path leaves as they are. The general path then writes that event with orjson. ``match`` only
accepts the sequence number the normaliser would write, in its canonical digits, and string
literals that are orjson's own spelling of their value, so orjson's output is again the input.
(``_loads`` of a literal ending at the slot's closing quote can only yield a string.)
Each slot's key occurs once in the learned bytes, so it is the top-level key, not a nested one.

The item's closing events need the text of its deltas, but reading each delta's literal with
orjson is most of what a relayed delta costs. A literal of printable ASCII without a quote or
a backslash is its own text, and orjson's spelling of it (orjson escapes only quotes,
backslashes and control characters): the hot paths prove that with one table lookup per byte
(:data:`PLAIN`) and keep its bytes, which :func:`text_of` turns into text when the item
closes. Any other literal is read with orjson as it arrives, as before.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

import orjson

_dumps = orjson.dumps
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

_SEQ, _DELTA, _OTHER = 0, 1, 2

PLAIN = bytes(b if 0x20 <= b < 0x80 and b not in b'"\\' else 0x20 for b in range(256))
"""A ``bytes.translate`` table that leaves a byte as it is when a JSON string literal holds it
as its own character in orjson's spelling (printable ASCII and DEL, but for the quote and the
backslash) and changes every other byte: ``body.translate(PLAIN) == body`` says the literal
body ``body`` is its own text, byte for byte, in one C call."""


type Parts = list[str | bytes | bytearray]
"""An item's streamed deltas as the hot paths keep them (see :func:`text_of`)."""


def text_of(parts: Parts) -> str:
    """The text of an item's streamed deltas as the hot paths keep it: each part the text
    itself (``str``) or the bytes of a literal that :data:`PLAIN` leaves as it is, which are
    that text in ASCII, after what :func:`fold` joined (a ``bytearray`` of UTF-8). Runs of
    such bytes are joined and decoded at once."""
    texts: list[str] = []
    for kind, run in groupby(parts, type):
        if kind is str:
            texts.extend(run)  # type: ignore[arg-type]
        elif kind is bytes:
            texts.append(b"".join(run).decode("ascii"))  # type: ignore[arg-type]
        else:
            texts.extend(joined.decode() for joined in run)  # type: ignore[union-attr]
    return "".join(texts)


FOLD_FROM = 32
"""Parts an item's list holds before :func:`fold` joins them."""


def fold(parts: Parts) -> None:
    """Join ``parts`` into one UTF-8 ``bytearray`` at its head, in place (a template appends
    to this very list). A delta kept as an object of its own costs ~50 bytes of header for a
    few characters, for as long as the item is open: a 1,000-event answer held ~50 KiB. Each
    character is copied once more; the head grows in place, so never again. Run off the hot
    paths only (the shell calls it now and then on a live stream): a template's ``scan`` may
    take back the part it just appended, in the same call."""
    if len(parts) < FOLD_FROM:
        return
    head = parts[0]
    if type(head) is bytearray:
        head += text_of(parts[1:]).encode()
        del parts[1:]
    else:
        parts[:] = [bytearray(text_of(parts).encode())]


_SLOT_KEYS = ((b'"sequence_number":', _SEQ), (b'"delta":', _DELTA), (b'"obfuscation":', _OTHER))


def string_end(buffer: bytes, start: int) -> int:
    """Just past the string literal whose opening quote is at ``start``, or -1."""
    position = start + 1
    while True:
        quote = buffer.find(b'"', position)
        if quote < 0:
            return -1
        backslashes = 0
        while buffer[quote - 1 - backslashes] == 0x5C:  # an escaped quote is not the end
            backslashes += 1
        if backslashes % 2 == 0:
            return quote + 1
        position = quote + 1


class DeltaTemplate:
    """One item's delta events as constant bytes around their changing values."""

    __slots__ = ("event_type", "item", "line", "parts", "relay", "scan", "sink", "tail")

    def __init__(
        self,
        event_type: str,
        parts: tuple[tuple[bytes, int, int, bytes | None], ...],
        tail: bytes,
        item: Any,
        sink: Parts,
        counter: Any = None,
    ) -> None:
        self.event_type = event_type
        self.line = b"event: " + event_type.encode() + b"\ndata: "
        """The frame's start as the encoder writes it: an ``event:`` line naming the type."""
        self.parts = parts
        """(constant bytes, their length, the slot after them, the bytes that close a string
        slot), in the order the upstream writes them. The closer is the closing quote and the
        whole next constant: one ``find`` then both ends the literal and checks what follows
        it. (It cannot be found inside a literal: the constant's first quote follows a comma,
        a literal's quotes follow a backslash; the literal is validated all the same.)"""
        self.tail = tail
        self.item = item
        """The normaliser's record of the item: the template holds while it is open."""
        self.sink = sink
        """Where the item's streamed text of this kind is kept (the delta is appended, as
        text or as the bytes of a plain literal: :func:`text_of` reads it)."""
        self.scan, self.relay = _fast_paths(self, counter)
        """The hot paths (see :func:`_fast_paths`). ``scan(buffer, start, seq)`` is the end
        of the fitting frame at ``start`` (its text kept), else -1 (nothing kept: :meth:`match`
        then decides). ``relay(chunk)`` says whether ``chunk`` is one whole fitting frame
        numbered ``counter.next_sequence``; when it is, its text is kept and the number
        counted. ``None`` for layouts they do not know (and ``relay`` without a counter)."""

    @classmethod
    def learn(
        cls,
        event: dict[str, Any],
        data: bytes,
        item: Any,
        sink: Parts,
        counter: Any = None,
    ) -> DeltaTemplate | None:
        """The template of ``data``, which must be ``orjson.dumps(event)``: one normalised delta
        event whose output bytes are its input bytes. ``None`` when its slots are ambiguous.
        ``counter``: the object whose ``next_sequence`` numbers the events (the normaliser),
        which :attr:`relay` counts on."""
        if type(event.get("delta")) is not str or type(event.get("sequence_number")) is not int:
            return None
        slots: list[tuple[int, int, int]] = []  # (value start, value end, kind)
        for key, kind in _SLOT_KEYS:
            position = data.find(key)
            if position < 0:
                if kind == _OTHER:
                    continue  # an upstream without obfuscation
                return None
            if data.find(key, position + 1) >= 0:
                return None  # also a nested key: which one is the event's is not obvious
            start = position + len(key)
            if kind == _SEQ:
                end = start + len(b"%d" % event["sequence_number"])
            else:
                if data[start : start + 1] != b'"':
                    return None
                end = string_end(data, start)
                if end < 0:
                    return None
            slots.append((start, end, kind))
        slots.sort()
        constants = []
        position = 0
        for start, end, _kind in slots:
            constants.append(data[position:start])
            position = end
        constants.append(data[position:])
        parts = []
        for k, (_start, _end, kind) in enumerate(slots):
            following = constants[k + 1]
            closer = b'"' + following if kind != _SEQ and b'"' in following[1:] else None
            parts.append((constants[k], len(constants[k]), kind, closer))
        return cls(event["type"], tuple(parts), constants[-1], item, sink, counter)

    def match(self, buffer: bytes, start: int, end: int, sequence: int) -> str | None:
        """The delta text when ``buffer[start:end]`` is this template's data with ``sequence``
        as its sequence number and canonical literals in the other slots; else ``None``."""
        position = start
        delta = None
        checked = False  # whether the constant at position was found with the closer
        for constant, size, kind, closer in self.parts:
            if not checked and not buffer.startswith(constant, position):
                return None
            position += size
            checked = False
            if kind == _SEQ:
                digits = b"%d" % sequence
                if not buffer.startswith(digits, position):
                    return None  # (a longer number fails at the next constant's first byte)
                position += len(digits)
                continue
            if not buffer.startswith(b'"', position):
                return None
            if closer is not None:
                after = buffer.find(closer, position + 1, end) + 1
                if not after:
                    return None
                checked = True
            else:
                after = string_end(buffer, position)
                if after < 0 or after > end:
                    return None
            literal = buffer[position:after]
            position = after
            if kind == _OTHER and literal[1:-1].isalnum():
                continue  # ASCII letters and digits: already orjson's spelling
            try:
                value = _loads(literal)
            except _JSONDecodeError:
                return None
            # Without a backslash a valid literal is orjson's spelling (it escapes only quotes,
            # backslashes and control characters, which a valid literal holds escaped).
            if literal.find(b"\\") >= 0 and _dumps(value) != literal:
                return None
            if kind == _DELTA:
                delta = value
        tail = self.tail
        if end - position != len(tail) or not (checked or buffer.startswith(tail, position)):
            return None
        return delta


_QUOTE = b'"'
_BACKSLASH = b"\\"

ENDINGS_KEPT = 8
"""How many layouts' numbered endings the process keeps (see :func:`numbered_endings`)."""
ENDINGS_NUMBERS = 4096
"""How many of a layout's numbered endings are kept: 0..4095 (an event beyond formats its own).
At most ``ENDINGS_KEPT * ENDINGS_NUMBERS`` short bytes, about 3 MB."""
_ENDINGS: dict[bytes, list[bytes]] = {}


def numbered_endings(ending: bytes) -> list[bytes]:
    """The process's list of ``ending % n`` for n = 0, 1, ... as far as streams have got: the
    fixed end of a delta frame with its sequence number formatted in, shared by the streams
    of every upstream that writes this layout (OpenAI's and OpenRouter's end holds no id).

    Formatting the number was a thousand instructions of each relayed delta; a stream that
    finds its numbers here takes one list item instead (a stream that gets ahead of the
    others appends them, in order). Kept for the last :data:`ENDINGS_KEPT` layouts asked for,
    the oldest dropped first. Only the event loop's one thread relays, so ``n`` is always the
    item at index ``n``: a list is extended from its length on, in one step.
    """
    endings = _ENDINGS.get(ending)
    if endings is None:
        if len(_ENDINGS) >= ENDINGS_KEPT:
            del _ENDINGS[next(iter(_ENDINGS))]
        endings = _ENDINGS[ending] = []
    return endings


def _fast_paths(template: DeltaTemplate, counter: Any) -> tuple[Any, Any]:
    """The template's two hot paths, ``(scan, relay)``, for the layouts upstreams write: the
    delta alone or with an obfuscation string, the sequence number anywhere (``None`` for
    other layouts). Each checks one whole frame (``event:`` line, data, blank line) in a
    handful of C calls.

    The frame is fixed bytes around one or two string literals; the sequence number is
    formatted into the fixed bytes around it, so it is checked with them. ``scan`` reads a
    frame that starts at an offset of a read of several: a literal ends at the first quote
    after its start. ``relay`` takes a chunk that is one frame, the proxy's usual read: its
    first and last fixed bytes are compared at both ends of the chunk, so the literals lie
    between them. Either way the delta literal is then proven orjson's spelling of its text:
    plain (see :data:`PLAIN`: no quote at all) and kept as its bytes, or read by ``orjson``,
    which proves its quotes the only unescaped ones (a literal that holds an escaped quote
    fails ``scan``; :meth:`match`, which looks for the bytes that follow a literal, reads
    it). A literal it reads without escapes is orjson's own spelling: one whose text is as
    long as its bytes holds neither an escape nor a non-ASCII byte, and else one without a
    backslash is checked in C; escapes go to :meth:`match`. The obfuscation value must be
    ASCII letters and digits, as OpenAI's are.

    Every call on these paths is one event of a conformant stream, and ``relay`` is the one
    Python call the proxy makes for such an event. Its checks are the cheapest C calls that
    make them (counted in instructions): ``removeprefix``/``removesuffix`` compare a fixed
    end in place and hand on the rest (a slice compared with ``==`` builds a slice object and
    a copy; ``startswith`` parses its arguments the slow way), ``partition`` splits at the
    fixed bytes between two literals, and ``translate`` of a plain literal returns the very
    object, so ``is`` compares it.
    """
    line, parts, tail, keep = template.line, template.parts, template.tail, template.sink.append
    strings = [kind for _constant, _size, kind, _closer in parts if kind != _SEQ]
    if strings not in ([_DELTA], [_DELTA, _OTHER], [_OTHER, _DELTA]):
        return None, None
    fixed: list[tuple[bytes, bool]] = []  # the bytes between literals: (format, has a number)
    current = [line.replace(b"%", b"%%")]
    numbered = False
    for constant, _size, kind, _closer in parts:
        current.append(constant.replace(b"%", b"%%"))
        if kind == _SEQ:
            current.append(b"%d")
            numbered = True
        else:
            current.append(_QUOTE)
            fixed.append((b"".join(current), numbered))
            current, numbered = [_QUOTE], False
    current.append(tail.replace(b"%", b"%%") + b"\n\n")
    fixed.append((b"".join(current), numbered))
    # Pieces without a number are compared as bytes.
    pieces = [(piece if n else piece.replace(b"%%", b"%"), n) for piece, n in fixed]
    (head, head_n), (mid, mid_n) = pieces[:2]
    final, final_n = pieces[-1]  # mid again for one literal
    two = len(strings) == 2
    delta_first = strings[0] == _DELTA
    loads, decode_error, quote, backslash = _loads, _JSONDecodeError, _QUOTE, _BACKSLASH
    plain = PLAIN
    match, frame_start = template.match, len(line)

    def literal_text(buffer: bytes, begin: int, end: int) -> str | None:
        """The text of the delta literal ``buffer[begin:end]`` (quotes excluded) when it is
        orjson's spelling without escapes, else ``None``."""
        try:
            text = loads(buffer[begin - 1 : end + 1])
        except decode_error:
            return None
        if len(text) != end - begin and buffer.find(backslash, begin, end) >= 0:
            return None  # escapes: match() checks their spelling
        return text  # type: ignore[no-any-return]

    def scan(buffer: bytes, start: int, seq: int) -> int:
        before = head % seq if head_n else head
        begin = start + len(before)
        if buffer[start:begin] != before:
            return -1
        end = buffer.find(quote, begin)
        between = mid % seq if mid_n else mid
        if end < 0 or buffer[end : end + len(between)] != between:
            return -1
        after_end = end + len(between)
        if two:
            begin2 = after_end
            end2 = buffer.find(quote, begin2)
            after = final % seq if final_n else final
            if end2 < 0 or buffer[end2 : end2 + len(after)] != after:
                return -1
            after_end = end2 + len(after)
            if delta_first:
                other = buffer[begin2:end2]
            else:
                other = buffer[begin:end]
                begin, end = begin2, end2
            if not other.isalnum():
                return -1
        body = buffer[begin:end]
        if body.translate(plain) == body:
            keep(body)  # its own text (see PLAIN)
            return after_end
        text = literal_text(buffer, begin, end)
        if text is None:
            return -1
        keep(text)
        return after_end

    if counter is None:
        return scan, None

    # The fixed end with the number formatted in, from the process's list where it is there
    # (an end without a number is the same for every event).
    endings = numbered_endings(final) if final_n else []
    bound = ENDINGS_NUMBERS

    def ending(seq: int) -> bytes:
        """``final % seq``, kept in ``endings`` with those before it (the events before a
        stream's first delta were numbered too) when it is within the bound."""
        if seq >= bound:
            return final % seq
        endings.extend([final % n for n in range(len(endings), seq + 1)])
        return endings[seq]

    def relay(chunk: bytes) -> bool:
        seq = counter.next_sequence
        before = head % seq if head_n else head
        if not final_n:
            after = final
        elif seq < len(endings):
            after = endings[seq]
        else:
            after = ending(seq)
        # Both fixed ends at once, no slice of them: each ``remove*`` is one C call that
        # compares its bytes in place, and the lengths say whether both were there.
        rest = chunk.removeprefix(before).removesuffix(after)
        if len(chunk) - len(rest) != len(before) + len(after):
            return False
        if two:
            # The first literal ends where the fixed bytes between them start: a plain
            # literal holds no quote, and an obfuscation value is letters and digits.
            first, between, second = rest.partition(mid % seq if mid_n else mid)
            body, other = (first, second) if delta_first else (second, first)
            if not between or not other.isalnum():
                # An escaped quote in the first literal, or an unusual obfuscation value:
                # spelled as orjson would, or not.
                return fitting(chunk, seq)
        else:
            body = rest
        if body.translate(plain) is body:  # unchanged: the very object (see PLAIN)
            keep(body)  # its own text
            counter.next_sequence = seq + 1
            return True
        return read(chunk, body, seq)

    def read(chunk: bytes, body: bytes, seq: int) -> bool:
        """The relay of a frame whose delta literal ``body`` is not plain: read with orjson,
        which proves it valid and, without escapes, orjson's spelling; else :meth:`match`."""
        try:
            text = loads(quote + body + quote)
        except decode_error:
            return fitting(chunk, seq)
        if len(text) != len(body) and body.find(backslash) >= 0:
            return fitting(chunk, seq)  # escapes: spelled as orjson would, or not
        keep(text)
        counter.next_sequence = seq + 1
        return True

    def fitting(chunk: bytes, seq: int) -> bool:
        """:meth:`match` for a frame whose literals the relay could not take as they are."""
        text = match(chunk, frame_start, len(chunk) - 2, seq)
        if text is None:
            return False
        keep(text)
        counter.next_sequence = seq + 1
        return True

    if two or head_n:
        return scan, relay
    # The delta alone, its number after it (OpenRouter's layout, and the fake upstream's):
    # the same checks with fewer steps (the fixed start is the same for every event).
    begin_at = len(head)

    def relay_one(chunk: bytes) -> bool:
        seq = counter.next_sequence
        after = endings[seq] if seq < len(endings) else ending(seq)
        body = chunk.removeprefix(head).removesuffix(after)
        if len(chunk) - len(body) != begin_at + len(after):
            return False
        if body.translate(plain) is body:  # unchanged: the very object (see PLAIN)
            keep(body)  # its own text
            counter.next_sequence = seq + 1
            return True
        return read(chunk, body, seq)

    return scan, relay_one
