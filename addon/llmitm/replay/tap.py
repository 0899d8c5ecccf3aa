"""What recording keeps of a stream while it flows, and the pieces it makes of it at the end.

The hot path is one C call per chunk: a stream callable hands ``(time, chunk in, bytes out)``
to ``list.extend`` (:class:`StreamTap`) or ``(time, chunk)`` (:class:`PassTap`, whose
``relay`` is the stream callable of a flow relayed untouched). Each Python-level step per
chunk costs a busy proxy about four times what it costs in a tight loop, because it runs
between mitmproxy's own work and finds its code and data out of cache: with the flow's end
left out, three appends and a length test per chunk measured 1.08× the proxy CPU of not
recording, one extend 1.06× (``scripts/bench_proxy.py``, 64 streams).

Every so often, off the hot path, the recorder's compactor calls :meth:`compact`: the notes
so far are joined into one buffer per direction and compressed (zstd, level 1: ~0.4 µs an
event, a few times smaller — what a recorded stream holds while it flows and until its record
is built is most of what recording costs in memory per stream), their sizes and times go
into arrays, and the chunks are let go. Notes held until the flow's end instead were
thousands of small objects per stream, which the garbage collector walked, the allocator
could not reuse, and the end's passes found out of cache: ~3% of a busy proxy's CPU.

A frame of eight events starts with nothing to refer back to, while every event of a stream,
and of every other stream from the same upstream, repeats the same JSON around its few new
bytes. So frames are compressed against a dictionary (:class:`Primer`): the first
:data:`PRIMER_BYTES` the process compacts, taken once, in memory only. Against it a stream's
compressed legs came to ~60% of their size without (64 translated streams through
``scripts/bench_big_request.py``'s fake upstream), and each frame compressed faster. A leg
keeps the dictionary its frames were made with, so what the builder decompresses never
depends on the process's state.

A stream's own ids, model and words repeat within it, not in the dictionary, so a leg merges
its older frames into longer ones as it grows (:class:`Leg`): a 1,216-event chat stream's
leg held 21 bytes an event against 48 with eight-event frames alone, for ~0.45 µs of
compaction more per event. Merging decompresses, and ``zstandard``'s codecs keep their
contexts from call to call: a small frame decompresses in ~2 µs, against ~12 µs with the
standard library's ``compression.zstd`` (its backport here), which makes a new context for
every frame — the record builder too decompresses every frame of a leg.

Sans-IO: no mitmproxy, no store, no clock but the chunks' arrival times.
"""

from __future__ import annotations

import itertools
import operator
import threading
from array import array
from collections.abc import Callable
from time import time as now

import zstandard

from llmitm.exchange.stream import Note
from llmitm.replay.model import Pieces
from llmitm.wire.sized import right_sized

PRIMER_BYTES = 16384
"""Bytes the dictionary is made of: the start of the first batches compacted, up to
:data:`PRIMER_SAMPLE` of each, so that several streams, and both directions, are in it."""
PRIMER_SAMPLE = 4096
MERGE_PARTS = 8
"""Frames of one rank a leg merges into one frame of the next rank."""
MERGE_UP_TO = 64 << 10
"""Bytes of content beyond which frames are not merged: each merge compresses its content
once more, on the event loop, and frames of tens of KB gain little more from it."""

Dictionary = zstandard.ZstdCompressionDict


class Primer:
    """The dictionary frames are compressed against: gathered from the first batches it
    sees, then fixed for the life of the process."""

    def __init__(self, size: int = PRIMER_BYTES, sample: int = PRIMER_SAMPLE) -> None:
        self.size = size
        self.sample = sample
        self._gathered = bytearray()
        self.dictionary: Dictionary | None = None

    def for_leg(self, first: bytes) -> Dictionary | None:
        """The dictionary for a leg whose first batch is ``first``; ``None`` until there is
        one (the leg's frames then use none)."""
        if self.dictionary is None:
            self._gathered += first[: self.sample]
            if len(self._gathered) >= self.size:
                self.dictionary = Dictionary(
                    bytes(self._gathered), dict_type=zstandard.DICT_TYPE_RAWCONTENT
                )
                self._gathered = bytearray()
        return self.dictionary


PRIMER = Primer()


class _Codec:
    """One thread's compressor and decompressor for one dictionary: zstandard's keep their
    contexts from call to call (making one costs tens of µs, more than a frame of eight
    events takes to compress) and are not to be shared between threads. A frame it makes
    sits in an allocation of the most the input could compress to, so a part is kept in a
    copy of its own size (:func:`~llmitm.wire.sized.right_sized`): held as they came, 5 MB
    of parts held 35 MB."""

    __slots__ = ("compress", "decompress", "dictionary")

    def __init__(self, dictionary: Dictionary | None) -> None:
        self.dictionary = dictionary  # held: the thread's codecs are found by its id
        if dictionary is None:
            self.compress = zstandard.ZstdCompressor(level=1).compress
            self.decompress = zstandard.ZstdDecompressor().decompress
        else:
            self.compress = zstandard.ZstdCompressor(level=1, dict_data=dictionary).compress
            self.decompress = zstandard.ZstdDecompressor(dict_data=dictionary).decompress


_codecs = threading.local()


def _codec(dictionary: Dictionary | None) -> _Codec:
    """This thread's codec for ``dictionary``."""
    codecs: dict[int, _Codec] | None = getattr(_codecs, "by_dictionary", None)
    if codecs is None:
        codecs = _codecs.by_dictionary = {}
    codec = codecs.get(id(dictionary))
    if codec is None:
        codec = codecs[id(dictionary)] = _Codec(dictionary)
    return codec


class Leg:
    """One direction of a stream, compacted: its bytes in compressed parts, all against the
    same dictionary, and each piece's size.

    A compaction adds a frame of rank 0; :data:`MERGE_PARTS` frames of one rank at the end
    are merged into one frame of the next rank (up to :data:`MERGE_UP_TO` bytes of content),
    so a long stream holds a few frames a rank, each compressed across a long span of the
    stream, whose ids, model and words repeat within it and not in the dictionary."""

    __slots__ = ("dictionary", "parts", "primer", "ranks", "raws", "sizes")

    def __init__(self, primer: Primer = PRIMER) -> None:
        self.primer: Primer | None = primer
        """Asked for the dictionary at the first part; ``None`` once it was."""
        self.dictionary: Dictionary | None = None
        self.parts: list[bytes] = []
        self.ranks = array("B")
        """Each part's rank: how many merges made it."""
        self.raws = array("I")
        """Each part's bytes before compression."""
        self.sizes = array("I")
        """Each piece's size: a piece is one chunk, far below 4 GiB (half of ``q``'s bytes,
        which every event of a long stream held twice)."""

    def add(self, datas: list[bytes]) -> None:
        self.sizes.extend(map(len, datas))
        joined = b"".join(datas)
        if not joined:
            return
        if self.primer is not None:
            self.dictionary = self.primer.for_leg(joined)
            self.primer = None
        codec = _codec(self.dictionary)
        self.parts.append(right_sized(codec.compress(joined)))
        self.ranks.append(0)
        self.raws.append(len(joined))
        if len(self.parts) >= MERGE_PARTS:
            self._merge(codec)

    def _merge(self, codec: _Codec) -> None:
        parts, ranks, raws = self.parts, self.ranks, self.raws
        while len(parts) >= MERGE_PARTS and ranks[-MERGE_PARTS] == ranks[-1]:
            raw = sum(raws[-MERGE_PARTS:])
            if raw > MERGE_UP_TO:
                return
            joined = b"".join(map(codec.decompress, parts[-MERGE_PARTS:]))
            rank = ranks[-1] + 1
            del parts[-MERGE_PARTS:], ranks[-MERGE_PARTS:], raws[-MERGE_PARTS:]
            parts.append(right_sized(codec.compress(joined)))
            ranks.append(rank)
            raws.append(raw)

    def body(self) -> bytes:
        """The whole leg, decompressed (each call: the record's builder calls it once, on
        its own thread)."""
        if not self.parts:
            return b""
        decompress = _codec(self.dictionary).decompress
        return b"".join(map(decompress, self.parts))

    def copy(self) -> Leg:
        twin = Leg()
        twin.primer, twin.dictionary, twin.parts = self.primer, self.dictionary, list(self.parts)
        twin.ranks, twin.raws = array("B", self.ranks), array("I", self.raws)
        twin.sizes = array("I", self.sizes)
        return twin


class _Tap:
    """Notes in a flat list (the hot path's), compacted into arrival times and legs."""

    __slots__ = ("__weakref__", "client", "notes", "times", "upstream")

    def __init__(self) -> None:
        self.notes: list[float | bytes] = []
        self.times = array("d")
        self.upstream = Leg()
        self.client: Leg | None = None
        """``None`` while every chunk went out as it came in."""

    def pending(self) -> int:
        """Notes not compacted yet."""
        return len(self.notes)

    def compact(self) -> None:
        notes = self.notes
        if notes:
            batch = notes[:]
            notes.clear()  # the same list: the stream callable extends it
            self._take(batch)

    def finish(self) -> tuple[array[float], Leg, Leg | None]:
        """Arrival times, the upstream leg, and the client leg (``None``: the same)."""
        self.compact()
        return self.times, self.upstream, self.client

    def _take(self, batch: list[float | bytes]) -> None:
        raise NotImplementedError


class StreamTap(_Tap):
    """The notes of a translating (or guarding) stream callable: ``time, chunk in, bytes
    out`` per call, extended in C through :attr:`note`."""

    __slots__ = ()

    @property
    def note(self) -> Note:
        return self.notes.extend

    def _take(self, batch: list[float | bytes]) -> None:
        self.times.extend(batch[0::3])  # type: ignore[arg-type]
        ins: list[bytes] = batch[1::3]  # type: ignore[assignment]
        outs: list[bytes] = batch[2::3]  # type: ignore[assignment]
        client = self.client
        if client is None and not all(map(operator.is_, ins, outs)):
            # The first changed chunk: until now the client got the upstream's pieces.
            client = self.client = self.upstream.copy()
        self.upstream.add(ins)
        if client is not None:
            client.add(outs)


class PassTap(_Tap):
    """What llmitm notes of a flow it relays untouched; :attr:`relay` is its stream callable
    (a plain function: mitmproxy calls it faster than an object's ``__call__``)."""

    __slots__ = ("relay",)

    def __init__(self) -> None:
        super().__init__()
        extend = self.notes.extend

        def relay(data: bytes) -> bytes:
            extend((now(), data))
            return data  # b"" at the end: mitmproxy sends nothing more for it

        self.relay: Callable[[bytes], bytes] = relay

    def _take(self, batch: list[float | bytes]) -> None:
        self.times.extend(batch[0::2])  # type: ignore[arg-type]
        self.upstream.add(batch[1::2])  # type: ignore[arg-type]


def pieces(times: array[float], t0: float, leg: Leg) -> Pieces:
    """The pieces of ``leg`` that hold bytes, arrived at ``times`` (one per piece, empty ones
    included): a stream callable's last call, and a translator holding bytes back, bring
    none. ``t0``: when the request was complete."""
    sizes, body = leg.sizes, leg.body()
    empty = sizes.count(0)
    if not empty:
        return Pieces.timed(times, t0, sizes, body)
    if empty <= 64:  # the usual case (a translator's silent events): delete in place
        times, sizes, at = array("d", times), array("q", sizes), 0
        for _ in range(empty):
            at = sizes.index(0, at)
            del sizes[at]
            del times[at]
        return Pieces.timed(times, t0, sizes, body)
    kept = array("d", itertools.compress(times, sizes))
    return Pieces.timed(kept, t0, array("q", filter(None, sizes)), body)
