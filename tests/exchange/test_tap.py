"""The recording tap: whatever the chunking, and wherever it was compacted while the stream
flowed, what it hands over at the flow's end is exactly the pieces that came in and went
out, each at its time; and the compactor compacts the taps of live streams off the hot path."""

from __future__ import annotations

import asyncio
import gc
import threading
import tracemalloc
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.addons.record.compactor import TapCompactor
from llmitm.exchange.stream import StreamRewriter
from llmitm.replay import tap as tap_module
from llmitm.replay.tap import MERGE_PARTS, PRIMER, Frames, Kept, Primer, StreamTap, pieces
from llmitm.translate.pipeline import StreamPipeline
from tests.exchange.test_exchange import RESPONSES_SSE, context, splits


class Scripted:
    """A pipeline that answers each fed chunk with a scripted value: ``None`` hands the
    chunk itself on (as a guard does), bytes replace it."""

    def __init__(self, script: list[bytes | None]) -> None:
        self.script = iter(script)

    def start(self) -> bytes:
        return b""

    def feed(self, data: bytes) -> bytes:
        out = next(self.script)
        return data if out is None else out

    def close(self) -> bytes:
        return b""


def run(
    rewriter: StreamRewriter, chunks: list[bytes], compact_at: frozenset[int] = frozenset()
) -> tuple[StreamTap, list[bytes]]:
    """Drive as mitmproxy does (the chunks, then ``b""``), compacting after the calls in
    ``compact_at``: the tap, and what each call sent."""
    tap = StreamTap()
    rewriter.add_note(tap.note)
    sent = []
    for number, chunk in enumerate([*chunks, b""]):
        sent.append(b"".join(rewriter(chunk)))
        if number in compact_at:
            tap.compact()
    return tap, sent


Direction = tuple[array[int], bytes]


def as_list(times: array[float], direction: Direction) -> list[tuple[int, bytes]]:
    """The recorded pieces, with offsets since the first call."""
    return list(pieces(times, times[0], *direction))


def finish(tap: StreamTap) -> Kept:
    return tap.finish().unpack()


def sent_pieces(times: array[float], datas: list[bytes]) -> list[tuple[int, bytes]]:
    """What each call brought or sent, at the offset of its call: what ``as_list`` must be."""
    offsets = [int((at - times[0]) * 1e6) for at in times]
    return [(t, d) for t, d in zip(offsets, datas, strict=True) if d]


def test_a_translated_stream_is_kept_whole() -> None:
    chunks = splits(RESPONSES_SSE)["sevens"]
    rewriter = StreamRewriter(StreamPipeline("responses-to-chat", context()))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks, frozenset({5, 40}))
    frames = tap.finish()
    times, upstream, client = frames.unpack()
    assert len(times) == len(chunks) + 1 and list(times) == sorted(times)
    assert as_list(times, upstream) == sent_pieces(times, [*chunks, b""])
    assert client is not None and as_list(times, client) == sent_pieces(times, sent)
    assert b"".join(sent).endswith(b"data: [DONE]\n\n")
    # Held compressed, one zstd frame per compaction (three here: two mid-stream, the end's),
    # both directions in each, with their pieces' times and sizes.
    zstd_frame = b"\x28\xb5\x2f\xfd"
    assert len(frames.parts) == 3 and all(p.startswith(zstd_frame) for p in frames.parts)
    assert frames.nbytes() < len(b"".join(chunks) + b"".join(sent)) / 2


def test_a_guard_that_hands_every_chunk_on_keeps_one_leg() -> None:
    chunks = [b"data: %d\n\n" % i for i in range(100)]
    rewriter = StreamRewriter(Scripted([None] * len(chunks)))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks, frozenset({10, 50}))
    times, upstream, client = finish(tap)
    assert client is None and as_list(times, upstream) == sent_pieces(times, sent)


def test_a_stream_that_changes_a_chunk_after_a_compaction_keeps_both_legs() -> None:
    chunks = [b"data: %d\n\n" % i for i in range(100)]
    script: list[bytes | None] = [None] * len(chunks)
    script[70] = b"changed"
    rewriter = StreamRewriter(Scripted(script))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks, frozenset({30, 60, 80}))
    times, upstream, client = finish(tap)
    assert client is not None and as_list(times, client) == sent_pieces(times, sent)
    assert as_list(times, upstream) == sent_pieces(times, [*chunks, b""])
    assert sent[70] == b"changed"


@given(
    st.lists(
        st.tuples(st.binary(max_size=6), st.one_of(st.none(), st.binary(max_size=6))),
        max_size=120,
    ),
    st.frozensets(st.integers(min_value=0, max_value=120)),
)
def test_any_stream_comes_back_piece_for_piece(
    calls: list[tuple[bytes, bytes | None]], compact_at: frozenset[int]
) -> None:
    chunks = [data for data, _ in calls]
    rewriter = StreamRewriter(Scripted([out for _, out in calls]))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks, compact_at)
    times, upstream, client = finish(tap)
    assert len(times) == len(calls) + 1
    assert as_list(times, upstream) == sent_pieces(times, [*chunks, b""])
    assert as_list(times, client or upstream) == sent_pieces(times, sent)


def test_a_relayed_stream_passes_each_piece_on_and_keeps_it() -> None:
    chunks = [b"piece %d;" % i for i in range(100)]
    tap, relayed = run(StreamRewriter(), chunks, frozenset({50}))
    assert relayed == [*chunks, b""]
    times, upstream, client = finish(tap)
    assert client is None and len(times) == len(chunks) + 1
    assert as_list(times, upstream) == sent_pieces(times, [*chunks, b""])


def test_empty_pieces_go_with_their_times_many_or_few() -> None:
    for empties in (1, 64, 65, 99):
        datas = [b"" if i < empties else b"d%d" % i for i in range(100)][::-1]
        times = array("d", (1000.0 + i for i in range(100)))
        sizes = array("I", map(len, datas))
        kept = pieces(times, 999.5, sizes, b"".join(datas))
        assert list(kept) == [(500_000 + i * 1_000_000, d) for i, d in enumerate(datas) if d]
        assert list(times) == [1000.0 + i for i in range(100)]  # the caller's times untouched
        assert list(sizes) == list(map(len, datas))  # and sizes


def events(stream: int, first: int, count: int) -> list[bytes]:
    """Responses text deltas of one stream, as an upstream writes them."""
    return [
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"sequence_number":%d,"item_id":"msg_%06d","output_index":0,"content_index":0,'
        b'"delta":" word%d","logprobs":[]}\n\n' % (number, stream, number)
        for number in range(first, first + count)
    ]


def arrivals(first: int, count: int) -> list[float]:
    """Arrival times of pieces ``first`` on, one every 20 ms and a bit, as a model writes."""
    return [1_796_000_000.0 + number * 0.0203 for number in range(first, first + count)]


def add_events(frames: Frames, stream: int, first: int, count: int) -> list[bytes]:
    datas = events(stream, first, count)
    frames.add(arrivals(first, count), datas, None)
    return datas


def compacted(frames: Frames, stream: int) -> int:
    """``frames`` given 96 events of ``stream`` in batches of eight: its compressed size."""
    for first in range(0, 96, 8):
        add_events(frames, stream, first, 8)
    return frames.nbytes()


def test_frames_are_compressed_against_the_first_streams_bytes_and_come_back_whole() -> None:
    primer = Primer(size=2048, sample=1024)
    first, second = Frames(primer), Frames(primer)  # their first batches make the dictionary
    plain = compacted(first, 0)
    compacted(second, 1)
    assert first.dictionary is None
    assert second.dictionary is primer.dictionary is not None  # its batch completed it
    later = Frames(primer)
    primed = compacted(later, 7)
    assert later.dictionary is primer.dictionary
    assert primed < 0.75 * plain  # measured: ~0.6 of the size without
    for stream, frames in ((0, first), (1, second), (7, later)):
        times, (sizes, body), client = frames.unpack()
        assert body == b"".join(events(stream, 0, 96)) and client is None
        assert list(sizes) == list(map(len, events(stream, 0, 96)))
        assert times.tolist() == pytest.approx(arrivals(0, 96), rel=0, abs=1e-6)


def test_the_primer_takes_both_directions_of_a_first_batch() -> None:
    primer = Primer(size=2048, sample=1024)
    Frames(primer).add(arrivals(0, 8), events(0, 0, 8), [b"out " * 300])
    assert primer.dictionary is not None
    assert b"out out" in primer.dictionary.as_bytes()


def test_a_stream_taps_frames_use_the_processs_dictionary_once_there_is_one() -> None:
    stream = 0
    while PRIMER.dictionary is None:  # what the test process compacted so far may not do
        stream += 1
        add_events(Frames(), stream, 0, 8)
    tap = StreamTap()
    for number, event in enumerate(events(99, 0, 8)):
        tap.note((float(number), event, event.upper()))
    frames = tap.finish()
    assert frames.dictionary is PRIMER.dictionary
    _times, (_, upstream), client = frames.unpack()
    assert upstream == b"".join(events(99, 0, 8))
    assert client is not None and client[1] == b"".join(events(99, 0, 8)).upper()


def long_frames(events_per_batch: int, batches: int) -> tuple[Frames, bytes]:
    primer = Primer(size=1024, sample=1024)
    add_events(Frames(primer), 0, 0, 8)  # the dictionary, from another stream
    frames, sent = Frames(primer), []
    for batch in range(batches):
        sent += add_events(frames, 5, batch * events_per_batch, events_per_batch)
    return frames, b"".join(sent)


def test_a_long_streams_frames_merge_and_come_back_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frames, sent = long_frames(8, 150)  # 1,200 events
    times, (sizes, body), client = frames.unpack()
    assert body == sent and list(sizes) == [len(e) for e in events(5, 0, 1200)]
    assert times.tolist() == pytest.approx(arrivals(0, 1200), rel=0, abs=1e-6)
    assert client is None
    # Eight of rank 0 make one of rank 1; eight of those (~100 KB) would pass MERGE_UP_TO.
    assert list(frames.ranks) == [1] * (150 // MERGE_PARTS) + [0] * (150 % MERGE_PARTS)
    assert sum(frames.counts) == 1200
    assert sum(frames.raws) == len(sent) + 12 * 1200  # each piece's time and size with it
    monkeypatch.setattr(tap_module, "MERGE_PARTS", 10**9)
    unmerged, _ = long_frames(8, 150)
    assert len(unmerged.parts) == 150
    # Measured: ~0.4 of the size of eight-event frames.
    assert frames.nbytes() < 0.6 * unmerged.nbytes()


def test_merged_frames_keep_each_direction_whether_or_not_the_client_got_the_same() -> None:
    frames, ins, outs = Frames(Primer()), [], []
    for batch in range(MERGE_PARTS * 2 + 3):
        datas = events(2, batch * 4, 4)
        changed = [data.replace(b"word", b"WORD") for data in datas] if batch % 3 == 1 else None
        frames.add(arrivals(batch * 4, 4), datas, changed)
        ins += datas
        outs += changed or datas
    assert set(frames.ranks) == {0, 1}
    times, (up_sizes, up_body), client = frames.unpack()
    assert client is not None
    client_sizes, client_body = client
    assert up_body == b"".join(ins) and list(up_sizes) == list(map(len, ins))
    assert client_body == b"".join(outs) and list(client_sizes) == list(map(len, outs))
    assert len(times) == len(ins)


def test_frames_holding_more_than_merge_up_to_stay_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tap_module, "MERGE_UP_TO", 20_000)
    frames, sent = long_frames(16, 24)  # ~3 KB a frame: eight of them are more than 20 KB
    assert len(frames.parts) == 24 and set(frames.ranks) == {0}
    assert frames.unpack().upstream[1] == sent


@pytest.mark.parametrize("merged", [True, False])
def test_frames_hold_no_more_memory_than_their_bytes(
    merged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # zstandard's frames come in allocations sized for the input, five to ten times theirs.
    if not merged:
        monkeypatch.setattr(tap_module, "MERGE_PARTS", 10**9)
    batches = [(arrivals(first, 8), events(3, first, 8)) for first in range(0, 800, 8)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        frames = Frames(Primer())  # no dictionary: its frames are larger, the slack the same
        for times, datas in batches:
            frames.add(times, datas, None)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 * frames.nbytes() + 8192, (held, frames.nbytes())


def test_frames_are_read_back_on_another_thread() -> None:
    frames, sent = long_frames(8, 20)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(frames.unpack().upstream[1]))
    reader.start()
    reader.join()
    assert read == [sent]


def test_the_compactor_compacts_busy_taps_and_forgets_ended_ones() -> None:
    async def scenario() -> None:
        compactor = TapCompactor(every=0.001, at_least=6)
        busy, quiet = StreamTap(), StreamTap()
        compactor.add(busy)
        compactor.add(quiet)
        for i in range(10):
            busy.note((float(i), b"in%d" % i, b"out%d" % i))
        quiet.note((0.0, b"in", b"out"))
        await asyncio.sleep(0.05)
        assert busy.pending() == 0 and sum(busy.frames.counts) == 10
        assert quiet.pending() == 3 and not quiet.frames.parts
        compactor.discard(quiet)
        del busy
        gc.collect()
        assert len(compactor.live) == 0
        await asyncio.sleep(0.01)
        assert compactor._timer is None  # nothing live: no timer either

    asyncio.run(scenario())


def test_the_compactor_starts_again_on_a_new_loop() -> None:
    compactor = TapCompactor(every=0.001, at_least=3)

    async def one_run() -> StreamTap:
        tap = StreamTap()
        compactor.add(tap)
        tap.note((0.0, b"in", b"out"))
        await asyncio.sleep(0.02)
        return tap

    first = asyncio.run(one_run())  # ends with the first tap live: its timer dies with its loop
    assert first.pending() == 0
    second = asyncio.run(one_run())
    assert second.pending() == 0 and list(second.finish().unpack().upstream[0]) == [2]
