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
from llmitm.replay.tap import MERGE_PARTS, PRIMER, Leg, Primer, StreamTap, pieces
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


def as_list(times: array[float], leg: Leg) -> list[tuple[int, bytes]]:
    """The recorded pieces, with offsets since the first call."""
    return list(pieces(times, times[0], leg))


def sent_pieces(times: array[float], datas: list[bytes]) -> list[tuple[int, bytes]]:
    """What each call brought or sent, at the offset of its call: what ``as_list`` must be."""
    offsets = [int((at - times[0]) * 1e6) for at in times]
    return [(t, d) for t, d in zip(offsets, datas, strict=True) if d]


def test_a_translated_stream_is_kept_whole() -> None:
    chunks = splits(RESPONSES_SSE)["sevens"]
    rewriter = StreamRewriter(StreamPipeline("responses-to-chat", context()))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks, frozenset({5, 40}))
    times, upstream, client = tap.finish()
    assert len(times) == len(chunks) + 1 and list(times) == sorted(times)
    assert as_list(times, upstream) == sent_pieces(times, [*chunks, b""])
    assert client is not None and as_list(times, client) == sent_pieces(times, sent)
    assert b"".join(sent).endswith(b"data: [DONE]\n\n")
    # Held compressed, one zstd frame per compaction (three here: two mid-stream, the end's).
    zstd_frame = b"\x28\xb5\x2f\xfd"
    assert len(upstream.parts) == 3 and all(p.startswith(zstd_frame) for p in upstream.parts)
    assert sum(map(len, upstream.parts)) < len(b"".join(chunks)) / 2


def test_a_guard_that_hands_every_chunk_on_keeps_one_leg() -> None:
    chunks = [b"data: %d\n\n" % i for i in range(100)]
    rewriter = StreamRewriter(Scripted([None] * len(chunks)))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks, frozenset({10, 50}))
    times, upstream, client = tap.finish()
    assert client is None and as_list(times, upstream) == sent_pieces(times, sent)


def test_a_stream_that_changes_a_chunk_after_a_compaction_keeps_both_legs() -> None:
    chunks = [b"data: %d\n\n" % i for i in range(100)]
    script: list[bytes | None] = [None] * len(chunks)
    script[70] = b"changed"
    rewriter = StreamRewriter(Scripted(script))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks, frozenset({30, 60, 80}))
    times, upstream, client = tap.finish()
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
    times, upstream, client = tap.finish()
    assert len(times) == len(calls) + 1
    assert as_list(times, upstream) == sent_pieces(times, [*chunks, b""])
    assert as_list(times, client or upstream) == sent_pieces(times, sent)


def test_a_relayed_stream_passes_each_piece_on_and_keeps_it() -> None:
    chunks = [b"piece %d;" % i for i in range(100)]
    tap, relayed = run(StreamRewriter(), chunks, frozenset({50}))
    assert relayed == [*chunks, b""]
    times, upstream, client = tap.finish()
    assert client is None and len(times) == len(chunks) + 1
    assert as_list(times, upstream) == sent_pieces(times, [*chunks, b""])


def test_empty_pieces_go_with_their_times_many_or_few() -> None:
    for empties in (1, 64, 65, 99):
        datas = [b"" if i < empties else b"d%d" % i for i in range(100)][::-1]
        leg = Leg()
        leg.add(datas[:30])
        leg.add(datas[30:])
        times = array("d", (1000.0 + i for i in range(100)))
        kept = pieces(times, 999.5, leg)
        assert list(kept) == [(500_000 + i * 1_000_000, d) for i, d in enumerate(datas) if d]
        assert list(times) == [1000.0 + i for i in range(100)]  # the caller's times untouched
        assert list(leg.sizes) == list(map(len, datas))  # and the leg's sizes


def events(stream: int, first: int, count: int) -> list[bytes]:
    """Responses text deltas of one stream, as an upstream writes them."""
    return [
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"sequence_number":%d,"item_id":"msg_%06d","output_index":0,"content_index":0,'
        b'"delta":" word%d","logprobs":[]}\n\n' % (number, stream, number)
        for number in range(first, first + count)
    ]


def compacted(leg: Leg, stream: int) -> int:
    """``leg`` given 96 events of ``stream`` in batches of eight: its compressed size."""
    for first in range(0, 96, 8):
        leg.add(events(stream, first, 8))
    return sum(map(len, leg.parts))


def test_legs_are_compressed_against_the_first_streams_bytes_and_come_back_whole() -> None:
    primer = Primer(size=2048, sample=1024)
    first, second = Leg(primer), Leg(primer)  # their first batches make the dictionary
    plain = compacted(first, 0)
    compacted(second, 1)
    assert first.dictionary is None
    assert second.dictionary is primer.dictionary is not None  # its batch completed it
    later = Leg(primer)
    primed = compacted(later, 7)
    assert later.dictionary is primer.dictionary
    assert primed < 0.75 * plain  # measured: ~0.55 of the size without
    for stream, leg in ((0, first), (1, second), (7, later)):
        assert leg.body() == b"".join(events(stream, 0, 96))


def test_a_client_leg_copied_from_the_upstreams_keeps_its_dictionary() -> None:
    primer = Primer(size=512, sample=512)
    Leg(primer).add(events(0, 0, 8))
    upstream = Leg(primer)
    upstream.add(events(1, 0, 8))
    client = upstream.copy()
    client.add([b"changed"])
    assert client.dictionary is upstream.dictionary is primer.dictionary
    assert client.body() == b"".join(events(1, 0, 8)) + b"changed"
    assert upstream.body() == b"".join(events(1, 0, 8))


def test_a_stream_taps_legs_use_the_processs_dictionary_once_there_is_one() -> None:
    stream = 0
    while PRIMER.dictionary is None:  # what the test process compacted so far may not do
        stream += 1
        Leg().add(events(stream, 0, 8))
    tap = StreamTap()
    for number, event in enumerate(events(99, 0, 8)):
        tap.note((float(number), event, event.upper()))
    _times, upstream, client = tap.finish()
    assert upstream.dictionary is PRIMER.dictionary
    assert client is not None and client.dictionary is PRIMER.dictionary
    assert upstream.body() == b"".join(events(99, 0, 8))
    assert client.body() == b"".join(events(99, 0, 8)).upper()


def long_leg(events_per_batch: int, batches: int) -> tuple[Leg, bytes]:
    primer = Primer(size=1024, sample=1024)
    Leg(primer).add(events(0, 0, 8))  # the dictionary, from another stream
    leg, sent = Leg(primer), []
    for batch in range(batches):
        datas = events(5, batch * events_per_batch, events_per_batch)
        leg.add(datas)
        sent += datas
    return leg, b"".join(sent)


def test_a_long_streams_leg_merges_its_frames_and_comes_back_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leg, sent = long_leg(8, 150)  # 1,200 events
    assert leg.body() == sent and list(leg.sizes) == [len(e) for e in events(5, 0, 1200)]
    # Eight of rank 0 make one of rank 1; eight of those (~100 KB) would pass MERGE_UP_TO.
    assert list(leg.ranks) == [1] * (150 // MERGE_PARTS) + [0] * (150 % MERGE_PARTS)
    assert list(leg.ranks) == sorted(leg.ranks, reverse=True)
    assert sum(leg.raws) == len(sent)
    monkeypatch.setattr(tap_module, "MERGE_PARTS", 10**9)
    unmerged, _ = long_leg(8, 150)
    assert len(unmerged.parts) == 150
    # Measured: ~0.4 of the size of eight-event frames.
    assert sum(map(len, leg.parts)) < 0.6 * sum(map(len, unmerged.parts))


def test_frames_holding_more_than_merge_up_to_stay_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tap_module, "MERGE_UP_TO", 20_000)
    leg, sent = long_leg(16, 24)  # ~3 KB a frame: eight of them are more than 20 KB
    assert len(leg.parts) == 24 and set(leg.ranks) == {0}
    assert leg.body() == sent


@pytest.mark.parametrize("merged", [True, False])
def test_a_legs_parts_hold_no_more_memory_than_their_bytes(
    merged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # zstandard's frames come in allocations sized for the input, five to ten times theirs.
    if not merged:
        monkeypatch.setattr(tap_module, "MERGE_PARTS", 10**9)
    batches = [events(3, first, 8) for first in range(0, 800, 8)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        leg = Leg(Primer())  # no dictionary: its frames are larger, the slack the same
        for batch in batches:
            leg.add(batch)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    parts = sum(map(len, leg.parts))
    assert held < 2 * parts + 8192, (held, parts)


def test_a_leg_is_read_back_on_another_thread() -> None:
    leg, sent = long_leg(8, 20)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(leg.body()))
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
        assert busy.pending() == 0 and len(busy.upstream.sizes) == 10
        assert quiet.pending() == 3 and len(quiet.upstream.sizes) == 0
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
    assert second.pending() == 0 and list(second.upstream.sizes) == [2]
