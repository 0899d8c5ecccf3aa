"""The Response an emulated state stores for a native server's stream: the one its client got.

A ``compatible`` Responses endpoint's stream is normalised and its state kept by llmitm. The
normaliser already holds the stream's terminal Response, so the state writer takes it from
there instead of keeping every chunk and parsing them again at the end; only a stream no
translator reads (guarded, or relayed as it is) still has its bytes kept.
"""

from __future__ import annotations

import orjson
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from llmitm.addons import responses_writer
from llmitm.addons.responses_writer import final_response
from llmitm.exchange.stream import StreamRewriter
from llmitm.translate.context import ToolOrigin, TranslateOptions, TranslationContext
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.sse import SSEDecoder, encode_typed
from tests.helpers.realfixtures import real_or_skip

# llama.cpp's shape: no sequence numbers, output indexes or logprobs, a minimal Response.
LLAMA_EVENTS = [
    {"type": "response.created", "response": {"id": "resp_l", "object": "response",
                                              "status": "in_progress"}},
    {"type": "response.output_item.added",
     "item": {"id": "msg_l", "type": "message", "role": "assistant", "content": []}},
    {"type": "response.content_part.added", "item_id": "msg_l",
     "part": {"type": "output_text", "text": ""}},
    {"type": "response.output_text.delta", "item_id": "msg_l", "delta": "Hel"},
    {"type": "response.output_text.delta", "item_id": "msg_l", "delta": "lo"},
    {"type": "response.completed", "response": {
        "id": "resp_l", "object": "response", "status": "completed", "model": "gemma",
        "output": [{"id": "msg_l", "type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello"}]}],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}},
]  # fmt: skip
LLAMA_SSE = b"".join(encode_typed(e["type"], orjson.dumps(e)) for e in LLAMA_EVENTS)


def context(tools: bool = False) -> TranslationContext:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    renamed = {"apply_patch": ToolOrigin("custom", "apply_patch")} if tools else {}
    return TranslationContext(options, model="m", tools=renamed)


def streamed_flow(rewriter: StreamRewriter, body: bytes) -> tuple[http.HTTPFlow, bytes]:
    """A flow whose response ``rewriter`` streamed ``body`` through (in 9-byte reads)."""
    flow = tflow.tflow(req=tutils.treq(path="/v1/responses", method=b"POST"))
    flow.response = tutils.tresp(headers=http.Headers(content_type="text/event-stream"))
    flow.response.stream = rewriter  # type: ignore[assignment]
    sent = [rewriter(body[at : at + 9]) for at in range(0, len(body), 9)]
    sent.append(rewriter(b""))
    flow.response.raw_content = None  # streamed: mitmproxy keeps no body
    return flow, b"".join(b"".join(parts) for parts in sent)


def terminal_of(sse: bytes) -> dict[str, object]:
    events = [orjson.loads(data) for _name, data in SSEDecoder().feed(sse)]
    assert events[-1]["type"] == "response.completed"
    return events[-1]["response"]  # type: ignore[no-any-return]


def test_a_normalised_native_stream_stores_the_response_its_client_got() -> None:
    pipeline = StreamPipeline("normalise-responses", context())
    assert pipeline.knows_final_response
    flow, sent = streamed_flow(StreamRewriter(pipeline), LLAMA_SSE)
    stored = final_response(flow, native=True)
    client_got = terminal_of(sent)
    assert stored == client_got
    # The normalised Response, not the server's raw one: completed with what llama.cpp left out.
    assert stored is not None and stored != LLAMA_EVENTS[-1]["response"]
    assert stored["id"] == "resp_l" and stored["model"] == "gemma"
    usage = stored["usage"]
    assert isinstance(usage, dict) and "output_tokens_details" in usage
    assert stored["output"][0]["content"][0]["text"] == "Hello"  # type: ignore[index]


def test_a_real_llamacpp_stream_stores_its_normalised_terminal_response() -> None:
    body = (real_or_skip() / "llamacpp-gemma270m-responses-stream.sse").read_bytes()
    flow, sent = streamed_flow(
        StreamRewriter(StreamPipeline("normalise-responses", context())), body
    )
    assert final_response(flow, native=True) == terminal_of(sent)


def test_streams_whose_translator_holds_no_client_response_say_so() -> None:
    """The state writer then keeps their bytes, as before: a guarded stream, one relayed as
    it is, and a normalised one whose events another step rewrites after the normaliser."""
    assert not StreamGuard("responses").knows_final_response
    assert not StreamRewriter().pipeline.knows_final_response
    summarising = TranslationContext(
        TranslateOptions(ids=CountingIds(), clock=fixed_clock(1), reasoning_summary=True)
    )
    assert not StreamPipeline("normalise-responses", summarising).knows_final_response
    assert not StreamPipeline("normalise-responses", context(tools=True)).knows_final_response
    assert not StreamPipeline("responses-to-chat", context()).knows_final_response
    assert StreamPipeline("chat-to-responses", context()).knows_final_response


def test_a_guarded_native_stream_is_stored_from_its_kept_bytes() -> None:
    rewriter = StreamRewriter(StreamGuard("responses"))
    kept: list[bytes] = []
    rewriter.watch(kept.append)
    flow, sent = streamed_flow(rewriter, LLAMA_SSE)
    assert sent == LLAMA_SSE
    responses_writer._KEPT[flow] = kept
    assert final_response(flow, native=True) == LLAMA_EVENTS[-1]["response"]  # the raw one
