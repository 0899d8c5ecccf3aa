"""What recording keeps of a stream while it flows, and the pieces it makes of it at the end.

The hot path is one C call per chunk: a stream callable hands ``(time, chunk in, bytes out)``
to ``list.extend`` (:class:`StreamTap`) or ``(time, chunk)`` (:class:`PassTap`, whose
``relay`` is the stream callable of a flow relayed untouched). Each Python-level step per
chunk costs a busy proxy about four times what it costs in a tight loop, because it runs
between mitmproxy's own work and finds its code and data out of cache: with the flow's end
left out, three appends and a length test per chunk measured 1.08× the proxy CPU of not
recording, one extend 1.06× (``scripts/bench_proxy.py``, 64 streams).

Every so often, off the hot path, the recorder's compactor calls :meth:`compact`: the notes
so far become one compressed frame (zstd, level 1) holding their times, their sizes and their
bytes in both directions, and the chunks are let go. What a recorded stream holds while it
flows and until its record is built is most of what recording costs in memory per stream.
Notes held until the flow's end instead were thousands of small objects per stream, which
the garbage collector walked, the allocator could not reuse, and the end's passes found out
of cache: ~3% of a busy proxy's CPU. Times and sizes went into arrays beside each direction's
frames until the frames took them: held raw, they were as much memory as the compressed bytes
(16 bytes an event, and seven arrays a stream), and one frame for both directions costs less
to make than two. Against the arrays, the tap of a 100-event translated stream held 3.4 KiB
instead of 4.9, of a 1,000-event one 19 instead of 29 (tracemalloc, chat chunks in and
Responses deltas out, compacted eight at a time), and compacting cost no more.

A frame of eight events starts with nothing to refer back to, while every event of a stream,
and of every other stream from the same upstream, repeats the same JSON around its few new
bytes. So frames are compressed against a dictionary (:class:`Primer`): the first
:data:`PRIMER_BYTES` the process compacts, taken once, in memory only. Against it a stream's
compressed bytes came to ~60% of their size without (64 translated streams through
``scripts/bench_big_request.py``'s fake upstream), and each frame compressed faster. A
stream's frames keep the dictionary they were made with, so what the builder decompresses
never depends on the process's state.

A stream's own ids, model and words repeat within it, not in the dictionary, so its older
frames are merged into longer ones as it grows (:class:`Frames`): a 1,216-event chat stream
held 21 bytes an event against 48 with eight-event frames alone, for ~0.45 µs of compaction
more per event. Merging decompresses, and ``zstandard``'s codecs keep their contexts from
call to call: a small frame decompresses in ~2 µs, against ~12 µs with the standard
library's ``compression.zstd`` (its backport here), which makes a new context for every
frame — the record builder too decompresses every frame of a stream.

Sans-IO: no mitmproxy, no store, no clock but the chunks' arrival times.
"""

from __future__ import annotations

import itertools
import operator
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from time import time as now
from typing import NamedTuple

import zstandard

from llmitm.exchange.stream import Note
from llmitm.replay.model import Pieces
from llmitm.wire.sized import right_sized

PRIMER_BYTES = 16384
"""Bytes the dictionary is made of: the start of the first batches compacted, up to
:data:`PRIMER_SAMPLE` of each, so that several streams, and both directions, are in it."""
PRIMER_SAMPLE = 4096
MERGE_PARTS = 8
"""Frames of one rank merged into one frame of the next rank."""
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

    def for_stream(self, ins: list[bytes], outs: list[bytes] | None) -> Dictionary | None:
        """The dictionary for a stream whose first batch is ``ins`` in and ``outs`` out;
        ``None`` until there is one (the stream's frames then use none)."""
        if self.dictionary is None:
            sample = self.sample
            self._gathered += b"".join(ins)[:sample]
            if outs is not None:
                self._gathered += b"".join(outs)[:sample]
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


class Kept(NamedTuple):
    """What a tap kept, whole: each piece's arrival time, and each direction's piece sizes
    and bytes (``client`` ``None``: every piece went out as it came in)."""

    times: array[float]
    upstream: tuple[array[int], bytes]
    client: tuple[array[int], bytes] | None


class Frames:
    """A stream's notes compacted: compressed frames, all against the same dictionary, each
    holding a batch's (or merged batches') arrival times, piece sizes and bytes of both
    directions. A frame's sections, in order: arrival times (``q``, µs since the stream's
    first piece), upstream sizes (``I``: a piece is one chunk, far below 4 GiB), client
    sizes, upstream bytes, client bytes; a frame whose client got every piece as it came in
    has no client sections. Native byte order: frames never leave the process.

    A compaction adds a frame of rank 0; :data:`MERGE_PARTS` frames of one rank at the end
    are merged into one frame of the next rank (up to :data:`MERGE_UP_TO` bytes of content),
    so a long stream holds a few frames a rank, each compressed across a long span of the
    stream, whose ids, model and words repeat within it and not in the dictionary."""

    __slots__ = ("base", "counts", "dictionary", "parts", "primer", "ranks", "raws", "split")

    def __init__(self, primer: Primer = PRIMER) -> None:
        self.base = 0.0
        """The first piece's arrival time; the frames hold the others' in µs since it."""
        self.primer: Primer | None = primer
        """Asked for the dictionary at the first frame; ``None`` once it was."""
        self.dictionary: Dictionary | None = None
        self.parts: list[bytes] = []
        self.counts = array("I")
        """Each frame's pieces."""
        self.ranks = array("B")
        """Each frame's rank: how many merges made it."""
        self.raws = array("I")
        """Each frame's bytes before compression."""
        self.split = array("B")
        """Whether each frame has client sections (1) or its client got the upstream's."""

    def add(self, times: list[float], ins: list[bytes], outs: list[bytes] | None) -> None:
        """A batch of pieces: their arrival times, the bytes that came in, and those that
        went out (``None``: the same)."""
        if self.primer is not None:
            self.dictionary = self.primer.for_stream(ins, outs)
            self.primer = None
            self.base = times[0]
        base = self.base
        # Whole µs since the first piece, not the times themselves: eight bytes of a float's
        # noise each made a frame half as dear again to compress, and barely compressed.
        offsets = array("q", [round((at - base) * 1e6) for at in times])
        sections = [offsets.tobytes(), array("I", map(len, ins)).tobytes()]
        if outs is not None:
            sections.append(array("I", map(len, outs)).tobytes())
            sections += ins
            sections += outs
        else:
            sections += ins
        content = b"".join(sections)
        codec = _codec(self.dictionary)
        self.parts.append(right_sized(codec.compress(content)))
        self.counts.append(len(times))
        self.ranks.append(0)
        self.raws.append(len(content))
        self.split.append(outs is not None)
        if len(self.parts) >= MERGE_PARTS:
            self._merge(codec)

    def _merge(self, codec: _Codec) -> None:
        parts, ranks, raws = self.parts, self.ranks, self.raws
        while len(parts) >= MERGE_PARTS and ranks[-MERGE_PARTS] == ranks[-1]:
            raw = sum(raws[-MERGE_PARTS:])
            if raw > MERGE_UP_TO:
                return
            merged = [
                _Sections.of(codec.decompress(part), count, split)
                for part, count, split in zip(
                    parts[-MERGE_PARTS:],
                    self.counts[-MERGE_PARTS:],
                    self.split[-MERGE_PARTS:],
                    strict=True,
                )
            ]
            content, split = _Sections.join(merged)
            count, rank = sum(self.counts[-MERGE_PARTS:]), ranks[-1] + 1
            for column in (parts, ranks, raws, self.counts, self.split):
                del column[-MERGE_PARTS:]
            parts.append(right_sized(codec.compress(content)))
            ranks.append(rank)
            raws.append(len(content))
            self.counts.append(count)
            self.split.append(split)

    def unpack(self) -> Kept:
        """Every piece, decompressed (each call: the record's builder calls it once, on its
        own thread)."""
        decompress = _codec(self.dictionary).decompress
        sections = [
            _Sections.of(decompress(part), count, split)
            for part, count, split in zip(self.parts, self.counts, self.split, strict=True)
        ]
        split = any(self.split)
        offsets, up_sizes, client_sizes = array("q"), array("I"), array("I")
        for frame in sections:
            offsets.frombytes(frame.times)
            up_sizes.frombytes(frame.up_sizes)
            if split:
                client_sizes.frombytes(frame.client_sizes)
        base = self.base
        times = array("d", [base + offset / 1e6 for offset in offsets])
        upstream = (up_sizes, b"".join(frame.up for frame in sections))
        if not split:
            return Kept(times, upstream, None)
        return Kept(times, upstream, (client_sizes, b"".join(f.client for f in sections)))

    def nbytes(self) -> int:
        """Compressed bytes held."""
        return sum(map(len, self.parts))


@dataclass(slots=True)
class _Sections:
    """One frame's content, cut into its sections (the columns as views, not copies); the
    client's are the upstream's where the frame has none (``split`` false)."""

    times: memoryview
    up_sizes: memoryview
    client_sizes: memoryview
    up: bytes
    client: bytes
    split: bool

    @classmethod
    def of(cls, content: bytes, count: int, split: bool) -> _Sections:
        view = memoryview(content)
        at = 8 * count
        times, up_sizes = view[:at], view[at : at + 4 * count]
        at += 4 * count
        if not split:
            up = content[at:]
            return cls(times, up_sizes, up_sizes, up, up, split)
        client_sizes = view[at : at + 4 * count]
        at += 4 * count
        up_end = at + sum(up_sizes.cast("I"))
        return cls(times, up_sizes, client_sizes, content[at:up_end], content[up_end:], split)

    @staticmethod
    def join(frames: list[_Sections]) -> tuple[bytes, bool]:
        """One frame's content made of ``frames``, and whether it has client sections."""
        split = any(frame.split for frame in frames)
        sections: list[bytes | memoryview] = [frame.times for frame in frames]
        sections += [frame.up_sizes for frame in frames]
        if split:
            sections += [frame.client_sizes for frame in frames]
        sections += [frame.up for frame in frames]
        if split:
            sections += [frame.client for frame in frames]
        return b"".join(sections), split


class _Tap:
    """Notes in a flat list (the hot path's), compacted into frames."""

    __slots__ = ("__weakref__", "frames", "notes")

    def __init__(self) -> None:
        self.notes: list[float | bytes] = []
        self.frames = Frames()

    def pending(self) -> int:
        """Notes not compacted yet."""
        return len(self.notes)

    def compact(self) -> None:
        notes = self.notes
        if notes:
            batch = notes[:]
            notes.clear()  # the same list: the stream callable extends it
            self._take(batch)

    def finish(self) -> Frames:
        """Every note compacted: the frames (:meth:`Frames.unpack` reads them)."""
        self.compact()
        return self.frames

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
        ins: list[bytes] = batch[1::3]  # type: ignore[assignment]
        outs: list[bytes] = batch[2::3]  # type: ignore[assignment]
        same = all(map(operator.is_, ins, outs))
        self.frames.add(batch[0::3], ins, None if same else outs)  # type: ignore[arg-type]


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
        self.frames.add(batch[0::2], batch[1::2], None)  # type: ignore[arg-type]


def pieces(times: array[float], t0: float, sizes: array[int], body: bytes) -> Pieces:
    """The pieces of a direction that hold bytes, arrived at ``times`` (one per piece, empty
    ones included): a stream callable's last call, and a translator holding bytes back, bring
    none. ``t0``: when the request was complete."""
    empty = sizes.count(0)
    if not empty:
        return Pieces.timed(times, t0, sizes, body)
    if empty <= 64:  # the usual case (a translator's silent events): delete in place
        times, sizes, at = array("d", times), array("I", sizes), 0
        for _ in range(empty):
            at = sizes.index(0, at)
            del sizes[at]
            del times[at]
        return Pieces.timed(times, t0, sizes, body)
    kept = array("d", itertools.compress(times, sizes))
    return Pieces.timed(kept, t0, array("I", filter(None, sizes)), body)
