"""One stream owner per flow: watchers and notes observe a :class:`StreamRewriter` (none
wraps it), and its outcome says what the stream was, translated or relayed as it is."""

from __future__ import annotations

import orjson
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from llmitm.addons.streams import flow_stream, stream_outcome
from llmitm.exchange.stream import StreamRewriter
from llmitm.replay.tap import StreamTap
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.sse import SSEDecoder
from tests.exchange.test_exchange import CHAT_SSE, context


def drive(rewriter: StreamRewriter, body: bytes, size: int = 7) -> bytes:
    """As mitmproxy does: the body in pieces, then ``b""``; what the client got."""
    out = [rewriter(body[at : at + size]) for at in range(0, len(body), size)]
    out.append(rewriter(b""))
    return b"".join(b"".join(parts) for parts in out)


def test_every_watcher_and_note_sees_every_chunk_and_a_rewatch_takes_its_place() -> None:
    rewriter = StreamRewriter(StreamPipeline("chat-to-responses", context()))
    first: list[bytes] = []
    second: list[bytes] = []
    later: list[bytes] = []
    number = rewriter.watch(first.append)
    assert rewriter.observe == first.append  # one watcher: called itself, no wrapper
    rewriter.watch(second.append)
    tap, other = StreamTap(), StreamTap()
    rewriter.add_note(tap.note)
    rewriter.add_note(other.note)
    sent = rewriter(CHAT_SSE[:40])
    rewriter.rewatch(number, later.append)
    sent += rewriter(CHAT_SSE[40:])
    sent += rewriter(b"")
    assert first == [CHAT_SSE[:40]] and later == [CHAT_SSE[40:], b""]
    assert second == [CHAT_SSE[:40], CHAT_SSE[40:], b""]
    for kept in (tap, other):
        times, upstream, client = kept.finish().unpack()
        assert len(times) == 3 and upstream[1] == CHAT_SSE
        assert client is not None and client[1] == b"".join(sent)


def test_the_outcome_of_a_translated_stream_names_its_response_and_usage() -> None:
    rewriter = StreamRewriter(StreamPipeline("chat-to-responses", context()))
    sent = drive(rewriter, CHAT_SSE)
    outcome = rewriter.outcome()
    events = [orjson.loads(data) for _, data in SSEDecoder().feed(sent)]
    completed = events[-1]
    assert completed["type"] == "response.completed"
    assert outcome.final_response == completed["response"]
    assert outcome.response_id == completed["response"]["id"]
    assert outcome.usage == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_a_guarded_stream_knows_its_usage_and_no_final_response_of_llmitms() -> None:
    rewriter = StreamRewriter(StreamGuard("chat"))
    assert drive(rewriter, CHAT_SSE) == CHAT_SSE  # byte for byte
    outcome = rewriter.outcome()
    assert outcome.final_response is None and outcome.response_id is None
    assert outcome.usage is not None and outcome.usage["prompt_tokens"] == 5


def sse_flow(stream: object) -> http.HTTPFlow:
    flow = tflow.tflow(req=tutils.treq(path="/v1/chat/completions"))
    flow.response = tutils.tresp(headers=http.Headers(content_type="text/event-stream"))
    flow.response.stream = stream  # type: ignore[assignment]
    return flow


def test_a_stream_relayed_as_it_is_gets_an_owner_only_when_observed() -> None:
    flow = sse_flow(True)
    assert stream_outcome(flow) is None  # mitmproxy relays it: nothing of llmitm's to ask
    owner = flow_stream(flow)
    assert isinstance(owner, StreamRewriter) and owner.relays_as_is
    assert flow.response.stream is owner and flow_stream(flow) is owner  # one per flow
    seen: list[bytes] = []
    owner.watch(seen.append)
    assert drive(owner, CHAT_SSE, size=11) == CHAT_SSE
    assert b"".join(seen) == CHAT_SSE
    assert stream_outcome(flow) == owner.outcome()
    assert owner.outcome().usage is None  # nothing parsed on the way through


def test_translation_chosen_after_a_watcher_attached_keeps_the_watcher() -> None:
    owner = flow_stream(sse_flow(True))
    assert owner is not None
    seen: list[bytes] = []
    owner.watch(seen.append)
    owner.translate_with(StreamPipeline("chat-to-responses", context()))
    sent = drive(owner, CHAT_SSE)
    assert not owner.relays_as_is and b"response.completed" in sent
    assert b"".join(seen) == CHAT_SSE


def test_a_body_that_is_not_streamed_or_streamed_by_someone_else_has_no_owner() -> None:
    assert flow_stream(sse_flow(False)) is None

    def theirs(data: bytes) -> bytes:
        return data

    flow = sse_flow(theirs)
    assert flow_stream(flow) is None and flow.response.stream is theirs


def test_an_unwatched_watcher_sees_no_more_chunks_and_the_others_keep_theirs() -> None:
    rewriter = StreamRewriter(StreamPipeline("chat-to-responses", context()))
    first: list[bytes] = []
    second: list[bytes] = []
    number = rewriter.watch(first.append)
    other = rewriter.watch(second.append)
    rewriter(CHAT_SSE[:40])
    rewriter.unwatch(number)
    assert rewriter.observe == second.append  # one left: called itself, no wrapper
    rewriter(CHAT_SSE[40:])
    rewriter.unwatch(other)
    assert rewriter.observe is None  # none left: the hot path calls nothing
    rewriter(b"")
    assert first == [CHAT_SSE[:40]]
    assert second == [CHAT_SSE[:40], CHAT_SSE[40:]]
