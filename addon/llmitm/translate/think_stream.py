"""Incremental ``<think>…</think>`` splitting of streamed chat content.

Backends without a reasoning parser (Qwen3, R1 distills) put their reasoning inline in
``content``. Tags may be split across chunks (``<thi`` + ``nk>``), so a possible tag prefix at the
end of a chunk is held back until the next chunk decides it. An opening tag counts only before
any visible text: a model quoting ``<think>`` in an answer must not lose the rest of it. Some
templates swallow the opening tag; with ``open_missing`` the stream starts inside reasoning.
"""

from __future__ import annotations

from typing import Final

OPEN_TAG: Final = "<think>"
CLOSE_TAG: Final = "</think>"

Segment = tuple[bool, str]
"""``(is_reasoning, text)``."""


def _held_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class ThinkTagSplitter:
    """Feed content deltas; get back reasoning and visible-text segments, tags removed."""

    __slots__ = ("_held", "_inside", "_may_open", "_strip_leading")

    def __init__(self, open_missing: bool = False) -> None:
        self._inside = open_missing
        self._may_open = not open_missing
        self._held = ""
        # Whitespace right after a tag is layout, not text: "<think>\n…</think>\n\nAnswer".
        self._strip_leading = open_missing

    @property
    def settled(self) -> bool:
        """Past the leading think block: every further delta is plain text."""
        return not (self._inside or self._may_open or self._held or self._strip_leading)

    def feed(self, text: str) -> list[Segment]:
        if self._held or "<" in text:
            return self._scan(self._held + text)
        # Fast path: no tag can start in this delta.
        if self._strip_leading:
            text = text.lstrip()
            if not text:
                return []
            self._strip_leading = False
        if not self._inside and self._may_open:
            if not text.strip():
                self._held = text  # leading whitespace may still precede a <think>
                return []
            self._may_open = False
        return [(self._inside, text)]

    def close(self) -> list[Segment]:
        """End of content: whatever was held back was text after all."""
        held, self._held = self._held, ""
        return [(self._inside, held)] if held else []

    def _scan(self, text: str) -> list[Segment]:
        self._held = ""
        segments: list[Segment] = []
        while text:
            if self._strip_leading:
                text = text.lstrip()
                if not text:
                    break
                self._strip_leading = False
            if self._inside:
                position = text.find(CLOSE_TAG)
                if position >= 0:
                    if position:
                        segments.append((True, text[:position]))
                    self._inside = self._may_open = False
                    self._strip_leading = True
                    text = text[position + len(CLOSE_TAG) :]
                    continue
                held = _held_suffix(text, CLOSE_TAG)
                if held:
                    text, self._held = text[:-held], text[-held:]
                if text:
                    segments.append((True, text))
                break
            if self._may_open:
                stripped = text.lstrip()
                if stripped.startswith(OPEN_TAG):
                    self._inside = self._strip_leading = True
                    text = stripped[len(OPEN_TAG) :]
                    continue
                if OPEN_TAG.startswith(stripped):
                    self._held = text  # "<thi" or whitespace: the next delta decides
                    break
                self._may_open = False
            segments.append((False, text))
            break
        return segments
