"""Frames of one stream that differ only in one JSON string: read that string, skip the parse.

A chat upstream writes its text deltas as the same bytes around a different string::

    data: {"id":"chatcmpl-1",…,"choices":[{"index":0,"delta":{"content":"Hello"},…}]}\\n\\n

:meth:`StringSlotTemplate.learn` takes one such frame, already parsed by the general path, and
keeps the bytes before and after the string at a given key path; :meth:`StringSlotTemplate.value`
then reads a later frame's string from between them, parsing only the string literal instead of
the whole object (the hot path of a Responses client over a chat upstream, once per event).

Why that is the same as parsing the frame: ``learn`` only accepts a slot after checking that
putting another string literal there parses to the learned object with just that string
changed; JSON is compositional, so any valid string literal in the slot parses the same way.
``value`` accepts nothing but a lone string literal (so no whitespace or line break — the frame
stays one SSE ``data:`` line), which ``orjson`` validates (escapes, UTF-8, control characters).
"""

from __future__ import annotations

from typing import Any

import orjson

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

# A literal that cannot be confused with anything an upstream sends by chance.
_PROBE = "\x00llmitm-slot-probe\x00"
_PROBE_LITERAL = orjson.dumps(_PROBE)

type KeyPath = tuple[str | int, ...]


class StringSlotTemplate:
    """The constant bytes of a frame around one JSON string value."""

    __slots__ = ("_prefix_len", "_suffix_len", "prefix", "suffix")

    def __init__(self, prefix: bytes, suffix: bytes) -> None:
        self.prefix = prefix
        self.suffix = suffix
        self._prefix_len = len(prefix)
        self._suffix_len = len(suffix)

    @classmethod
    def learn(cls, frame: bytes, data: bytes, path: KeyPath) -> StringSlotTemplate | None:
        """The template of ``frame`` (one whole SSE event) around the string at ``path`` in its
        JSON ``data`` (which must be the single ``data:`` line's payload, a slice of ``frame``
        that ends two bytes before it), or ``None`` if no unambiguous slot is found."""
        offset = len(frame) - 2 - len(data)
        if offset < 0 or frame[offset : offset + len(data)] != data:
            return None
        try:
            expected = _loads(data)
            parent = _walk(expected, path[:-1])
            if type(parent) is not dict or type(parent.get(path[-1])) is not str:
                return None
            parent[path[-1]] = _PROBE
        except (_JSONDecodeError, KeyError, IndexError, TypeError):
            return None
        key = orjson.dumps(path[-1]) if isinstance(path[-1], str) else None
        if key is None:
            return None
        position = data.find(key)
        while position >= 0:
            start = _value_start(data, position + len(key))
            if start >= 0:
                end = _string_end(data, start)
                if end > 0:
                    probe = data[:start] + _PROBE_LITERAL + data[end:]
                    try:
                        if _loads(probe) == expected:
                            return cls(frame[: offset + start], frame[offset + end :])
                    except _JSONDecodeError:
                        pass
            position = data.find(key, position + 1)
        return None

    def value(self, frame: bytes) -> str | None:
        """The string in ``frame``'s slot if ``frame`` is the template with a string literal
        there (and nothing else: no whitespace around it); else ``None``."""
        if not (frame.startswith(self.prefix) and frame.endswith(self.suffix)):
            return None
        literal = frame[self._prefix_len : len(frame) - self._suffix_len]
        if len(literal) < 2 or literal[0] != 0x22 or literal[-1] != 0x22:  # '"'
            return None
        try:
            value = _loads(literal)
        except _JSONDecodeError:
            return None
        return value if type(value) is str else None


def _walk(obj: Any, path: KeyPath) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _value_start(data: bytes, position: int) -> int:
    """After a key literal: the index of the value's opening quote, or -1 if the key is not
    followed by ``:`` and a string."""
    size = len(data)
    while position < size and data[position] in b" \t":
        position += 1
    if position >= size or data[position] != 0x3A:  # ':'
        return -1
    position += 1
    while position < size and data[position] in b" \t":
        position += 1
    return position if position < size and data[position] == 0x22 else -1


def _string_end(data: bytes, start: int) -> int:
    """The index just past the string literal opening at ``start``, or -1."""
    position = start + 1
    while True:
        quote = data.find(b'"', position)
        if quote < 0:
            return -1
        backslashes = 0
        while data[quote - 1 - backslashes] == 0x5C:  # '\\'
            backslashes += 1
        if backslashes % 2 == 0:
            return quote + 1
        position = quote + 1
