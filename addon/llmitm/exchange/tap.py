"""What recording keeps of a stream while it flows, and the pieces it makes of it at the end.

The hot path is one C call per chunk: a stream callable hands ``(time, chunk in, bytes out)``
to ``list.extend`` (:class:`StreamTap`) or ``(time, chunk)`` (:class:`PassTap`, the stream
callable of a flow relayed untouched). Each Python-level step per chunk costs a busy proxy
about four times what it costs in a tight loop, because it runs between mitmproxy's own work
and finds its code and data out of cache: with the flow's end left out, three appends and a
length test per chunk measured 1.08× the proxy CPU of not recording, this 1.06×
(``scripts/bench_proxy.py``, 64 streams). Everything else happens once, at the flow's end.

Sans-IO: no mitmproxy, no store.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Callable
from time import time as now

from llmitm.replay.model import Pieces

Note = Callable[[tuple[float, bytes, bytes]], object]
"""What a translating stream callable calls per chunk when recording: ``list.extend``."""


class StreamTap:
    """The notes of a translating (or guarding) stream callable: a flat list of
    ``time, chunk in, bytes out`` per call, extended in C."""

    __slots__ = ("notes",)

    def __init__(self) -> None:
        self.notes: list[float | bytes] = []

    @property
    def note(self) -> Note:
        return self.notes.extend

    def finish(self) -> tuple[list[float], list[bytes], list[bytes] | None]:
        """Arrival times, chunks in, and bytes out (``None``: every chunk went out as it came
        in, as a guard hands it on)."""
        notes = self.notes
        ins: list[bytes] = notes[1::3]  # type: ignore[assignment]
        outs: list[bytes] = notes[2::3]  # type: ignore[assignment]
        same = all(map(operator.is_, ins, outs))
        return notes[0::3], ins, None if same else outs  # type: ignore[return-value]


class PassTap:
    """The stream callable of a flow llmitm relays untouched: note each piece's time and
    bytes, pass it on."""

    __slots__ = ("notes",)

    def __init__(self) -> None:
        self.notes: list[float | bytes] = []

    def __call__(self, data: bytes) -> bytes:
        self.notes.extend((now(), data))
        return data  # b"" at the end: mitmproxy sends nothing more for it

    def finish(self) -> tuple[list[float], list[bytes], None]:
        """Arrival times, the chunks, and ``None``: the client got the same."""
        notes = self.notes
        return notes[0::2], notes[1::2], None  # type: ignore[return-value]


def pieces(times: array[float], t0: float, datas: list[bytes], body: bytes) -> Pieces:
    """The pieces that hold bytes, arrived at ``times`` (one per data, empty ones included):
    a stream callable's last call, and a translator holding bytes back, bring none. ``body``
    is ``b"".join(datas)``, made by the caller; ``t0``, when the request was complete."""
    sizes = array("q", map(len, datas))
    empty = sizes.count(0)
    if not empty:
        return Pieces.timed(times, t0, sizes, body)
    if empty <= 64:  # the usual case (a translator's silent events): delete in place
        times, at = array("d", times), 0
        for _ in range(empty):
            at = sizes.index(0, at)
            del sizes[at]
            del times[at]
        return Pieces.timed(times, t0, sizes, body)
    kept = array("d", itertools.compress(times, sizes))
    return Pieces.timed(kept, t0, array("q", filter(None, sizes)), body)
