"""The recording tap: whatever the chunking, what it hands over at the flow's end is exactly
the pieces that came in and went out, each at its time."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st
from test_exchange import RESPONSES_SSE, context, splits

from llmitm.exchange.stream import StreamRewriter
from llmitm.exchange.tap import PassTap, StreamTap, pieces
from llmitm.translate.pipeline import StreamPipeline


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


def run(rewriter: StreamRewriter, chunks: list[bytes]) -> tuple[StreamTap, list[bytes]]:
    """Drive as mitmproxy does (the chunks, then ``b""``): the tap, and what each call sent."""
    tap = StreamTap()
    rewriter.note = tap.note
    return tap, [b"".join(rewriter(chunk)) for chunk in [*chunks, b""]]


def as_list(datas: list[bytes]) -> list[tuple[int, bytes]]:
    """The recorded pieces, as if the calls came 0, 1, 2 … seconds after the request."""
    times = array("d", range(len(datas)))
    return list(pieces(times, 0.0, datas, b"".join(datas)))


def sent_pieces(datas: list[bytes]) -> list[tuple[int, bytes]]:
    return [(i * 1_000_000, d) for i, d in enumerate(datas) if d]


def test_a_translated_stream_is_kept_whole() -> None:
    chunks = splits(RESPONSES_SSE)["sevens"]
    rewriter = StreamRewriter(StreamPipeline("responses-to-chat", context()))  # type: ignore[arg-type]
    tap, sent = run(rewriter, chunks)
    times, ins, outs = tap.finish()
    assert len(times) == len(chunks) + 1 and times == sorted(times)
    assert as_list(ins) == sent_pieces([*chunks, b""])
    assert outs is not None and as_list(outs) == sent_pieces(sent)
    assert b"".join(sent).endswith(b"data: [DONE]\n\n")


def test_a_guard_that_hands_every_chunk_on_keeps_one_leg() -> None:
    chunks = [b"data: %d\n\n" % i for i in range(100)]
    tap, sent = run(StreamRewriter(Scripted([None] * len(chunks))), chunks)  # type: ignore[arg-type]
    _, ins, outs = tap.finish()
    assert outs is None and as_list(ins) == sent_pieces(chunks) == sent_pieces(sent)


def test_a_stream_that_changes_one_chunk_keeps_both_legs() -> None:
    chunks = [b"data: %d\n\n" % i for i in range(100)]
    script: list[bytes | None] = [None] * len(chunks)
    script[70] = b"changed"
    tap, sent = run(StreamRewriter(Scripted(script)), chunks)  # type: ignore[arg-type]
    _, ins, outs = tap.finish()
    assert outs is not None and as_list(outs) == sent_pieces(sent)
    assert as_list(ins) == sent_pieces(chunks) and sent[70] == b"changed"


@given(
    st.lists(
        st.tuples(st.binary(max_size=6), st.one_of(st.none(), st.binary(max_size=6))),
        max_size=200,
    )
)
def test_any_stream_comes_back_piece_for_piece(calls: list[tuple[bytes, bytes | None]]) -> None:
    chunks = [data for data, _ in calls]
    tap, sent = run(StreamRewriter(Scripted([out for _, out in calls])), chunks)  # type: ignore[arg-type]
    times, ins, outs = tap.finish()
    assert len(times) == len(calls) + 1
    assert as_list(ins) == sent_pieces([*chunks, b""])
    assert as_list(outs if outs is not None else ins) == sent_pieces(sent)


def test_a_relayed_stream_passes_each_piece_on_and_keeps_it() -> None:
    tap = PassTap()
    chunks = [b"piece %d;" % i for i in range(100)]
    assert [tap(chunk) for chunk in [*chunks, b""]] == [*chunks, b""]
    times, ins, outs = tap.finish()
    assert outs is None and len(times) == len(chunks) + 1 and times == sorted(times)
    assert as_list(ins) == sent_pieces(chunks)


def test_empty_pieces_go_with_their_offsets_many_or_few() -> None:
    for empties in (1, 64, 65, 99):
        datas = [b"" if i < empties else b"d%d" % i for i in range(100)][::-1]
        times = array("d", (1000.0 + i for i in range(100)))
        kept = pieces(times, 999.5, datas, b"".join(datas))
        assert list(kept) == [(500_000 + i * 1_000_000, d) for i, d in enumerate(datas) if d]
        assert list(times) == [1000.0 + i for i in range(100)]  # the caller's times untouched
