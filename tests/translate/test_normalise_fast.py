"""The Responses normaliser's fast path: a conformant delta goes out as the bytes it came as.

The judge is the general path: the same events parsed and fed one by one through
:meth:`ResponsesNormaliser.feed` (which never uses a template), encoded as the pipeline encodes
them. Whatever the stream — generated conformant ones, the same with one event spelled or
numbered otherwise, every real captured stream — the pipeline's bytes must equal the judge's,
fed one event per chunk or split anywhere; and on a conformant stream the deltas must be the
very chunk objects that came in.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmitm.translate import normalise_fast
from llmitm.translate.context import ToolOrigin, TranslateOptions, TranslationContext
from llmitm.translate.normalise import ResponsesNormaliser
from llmitm.translate.normalise_fast import PLAIN, text_of
from llmitm.translate.pipeline import RestoringNormaliser, StreamPipeline
from llmitm.translate.responses_compat import CallRestorer
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.sse import SSEDecoder, encode_typed
from tests.helpers.oracle import sdk_responses_stream
from tests.helpers.realfixtures import REAL

Event = dict[str, Any]
DELTA_TYPES = (
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
)
RENAMED = {"apply_patch": ToolOrigin("custom", "apply_patch")}


def context(tools: bool = False) -> TranslationContext:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    return TranslationContext(options, model="m", tools=dict(RENAMED) if tools else {})


def frame(event: Event) -> bytes:
    return encode_typed(event["type"], orjson.dumps(event))


def general_path(body: bytes, tools: bool = False) -> bytes:
    """What the normaliser writes for ``body`` event by event, without any fast path."""
    normaliser = ResponsesNormaliser(context(tools))
    translator: ResponsesNormaliser | RestoringNormaliser = (
        RestoringNormaliser(normaliser) if tools else normaliser
    )
    decoder = SSEDecoder()
    out: list[Event] = []
    for _name, data in [*decoder.feed(body), *decoder.close()]:
        if data == b"[DONE]":
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            event = None
        if type(event) is not dict:
            preview = data[:80].decode("utf-8", "replace")
            message = f"The upstream sent a malformed stream event: {preview!r}"
            out += translator.fail(
                ApiError(message=message, type="server_error", code="server_error", status=502)
            )
            continue
        out += translator.feed(event)
    out += translator.close()
    return b"".join(frame(event) for event in out)


def pipeline_output(chunks: list[bytes], tools: bool = False, fold: bool = False) -> bytes:
    """What the pipeline writes for ``chunks``; with ``fold``, the deltas it holds are folded
    after every chunk (as the proxy's timer does now and then)."""
    pipeline = StreamPipeline("normalise-responses", context(tools))
    out = []
    for chunk in chunks:
        out.append(pipeline.feed(chunk))
        if fold:
            pipeline.fold()
    out.append(pipeline.close())
    assert pipeline.finished
    return b"".join(out)


def count_unparsed(pipeline: StreamPipeline) -> list[int]:
    """A counter of the chunks ``pipeline`` relays without parsing them (one number): those
    its armed relay takes, and those its translator's fast chunk does."""
    count = [0]
    fast_chunk = pipeline._fast_chunk
    assert fast_chunk is not None

    def counting(chunk: bytes) -> bytes | None:
        out = fast_chunk(chunk)
        count[0] += out is not None
        return out

    arm = pipeline._arm

    def arming() -> None:
        arm()
        relay = pipeline.relay
        if relay is not None:

            def counted(chunk: bytes) -> bool:
                taken = relay(chunk)
                count[0] += taken
                return taken

            pipeline.relay = counted

    pipeline._fast_chunk = counting
    pipeline._arm = arming  # type: ignore[method-assign]
    return count


def sse_events(body: bytes) -> list[Event]:
    return [orjson.loads(data) for _name, data in SSEDecoder().feed(body)]


def events_of(body: bytes) -> list[bytes]:
    return [block + b"\n\n" for block in body.split(b"\n\n") if block]


def pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    return [body[a:b] for a, b in itertools.pairwise([0, *points, len(body)])]


# --- generated conformant streams ------------------------------------------------------------

# Any text: quotes, backslashes, control characters, line separators, astral characters.
TEXTS = st.text(max_size=8)
OBFUSCATION = st.one_of(st.text("abcXYZ019", min_size=1, max_size=12), TEXTS)


@st.composite
def conformant_stream(draw: st.DrawFn, open_items: bool = True) -> list[Event]:
    """An OpenAI-shaped stream: items of every streaming kind, numbered from 0. With
    ``open_items``, some items are never closed by the upstream (then the stream is no
    longer conformant after them: the normaliser adds their done events)."""
    seq = itertools.count()
    seq_first = draw(st.booleans())  # OpenAI writes it second; others write it last
    obfuscated = draw(st.booleans())  # OpenAI pads every delta with an "obfuscation"

    def event(kind: str, **fields: Any) -> Event:
        if seq_first:
            return {"type": kind, "sequence_number": next(seq), **fields}
        return {"type": kind, **fields, "sequence_number": next(seq)}

    response = {"id": "resp_1", "object": "response", "created_at": 1, "status": "in_progress",
                "model": "m", "output": [], "usage": None}  # fmt: skip
    events = [
        event("response.created", response=response),
        event("response.in_progress", response=response),
    ]
    kinds = draw(st.lists(st.sampled_from(["summary", "reasoning", "text", "refusal", "call"])))
    for index, kind in enumerate(kinds):
        item_id = f"it_{index}"
        ids = {"item_id": item_id, "output_index": index}
        deltas = draw(st.lists(st.tuples(TEXTS, OBFUSCATION), max_size=6))

        def delta(kind: str, text: str, obfuscation: str, ids: Event = ids, **fields: Any) -> Event:
            extra = {"obfuscation": obfuscation} if obfuscated else {}
            return event(kind, **ids, **fields, delta=text, **extra)

        text = "".join(text for text, _ in deltas)
        if kind == "call":
            item: Event = {"id": item_id, "type": "function_call", "status": "in_progress",
                           "arguments": "", "call_id": f"call_{index}", "name": "f"}  # fmt: skip
            events.append(event("response.output_item.added", output_index=index, item=item))
            for piece, obfuscation in deltas:
                events.append(delta("response.function_call_arguments.delta", piece, obfuscation))
            events.append(
                event("response.function_call_arguments.done", **ids, arguments=text, name="f")
            )
            item = {**item, "status": "completed", "arguments": text}
        elif kind == "summary":
            item = {"id": item_id, "type": "reasoning", "summary": []}
            events.append(event("response.output_item.added", output_index=index, item=item))
            part = {"type": "summary_text", "text": ""}
            events.append(
                event("response.reasoning_summary_part.added", **ids, summary_index=0, part=part)
            )
            for piece, obfuscation in deltas:
                events.append(
                    delta(
                        "response.reasoning_summary_text.delta",
                        piece,
                        obfuscation,
                        summary_index=0,
                    )
                )
            item = {**item, "summary": [{"type": "summary_text", "text": text}]}
        else:
            part_type, stem, extra = {
                "reasoning": ("reasoning_text", "response.reasoning_text", {}),
                "text": ("output_text", "response.output_text", {"logprobs": []}),
                "refusal": ("refusal", "response.refusal", {}),
            }[kind]
            item_type = "reasoning" if kind == "reasoning" else "message"
            item = {"id": item_id, "type": item_type, "summary": []}
            if item_type == "message":
                item = {"id": item_id, "type": "message", "role": "assistant",
                        "status": "in_progress", "content": []}  # fmt: skip
            events.append(event("response.output_item.added", output_index=index, item=item))
            events.append(
                event(
                    "response.content_part.added",
                    **ids,
                    content_index=0,
                    part={"type": part_type, "text": ""},
                )
            )
            for piece, obfuscation in deltas:
                events.append(delta(f"{stem}.delta", piece, obfuscation, content_index=0, **extra))
        if not open_items or draw(st.booleans()):
            events.append(event("response.output_item.done", output_index=index, item=item))
        # else the upstream leaves the item open: the normaliser closes it from what
        # streamed when the next one starts
    done = {**response, "status": "completed", "output": []}
    events.append(event("response.completed", response=done))
    return events


def respelled(event: Event, how: str) -> bytes:
    """One event as a conformant-looking upstream might write it otherwise."""
    if how == "ascii escapes":
        return encode_typed(event["type"], json.dumps(event, separators=(",", ":")).encode())
    if how == "spaces":
        return encode_typed(event["type"], json.dumps(event).encode())
    if how == "out of step":
        return frame({**event, "sequence_number": event["sequence_number"] + 1})
    if how == "duplicate key":
        data = orjson.dumps(event)
        return encode_typed(event["type"], data[:-1] + b',"output_index":7}')
    if how == "nested key":
        return frame({**event, "logprobs": [{"delta": "x", "sequence_number": 0}]})
    if how == "no event line":
        return b"data: " + orjson.dumps(event) + b"\n\n"
    if how == "another event line":
        return b"event: other\ndata: " + orjson.dumps(event) + b"\n\n"
    if how == "wrong index":
        return frame({**event, "output_index": event.get("output_index", 0) + 1})
    if how == "no such item":
        return frame({**event, "item_id": "it_unknown"})
    if how == "not json":
        return encode_typed(event["type"], orjson.dumps(event)[:-1])
    raise AssertionError(how)


HOW = st.sampled_from(
    [
        "ascii escapes",
        "spaces",
        "out of step",
        "duplicate key",
        "nested key",
        "no event line",
        "another event line",
        "wrong index",
        "no such item",
        "not json",
    ]
)


def canonical(body: bytes) -> list[bytes]:
    """Each event of ``body`` with its keys sorted: equal when only key order differs."""
    return [orjson.dumps(event, option=orjson.OPT_SORT_KEYS) for event in sse_events(body)]


def assert_as_general(out: bytes, expected: bytes, upstream: bytes) -> None:
    """``out`` is what the general path wrote, but for events relayed as the upstream
    spelled them, which differ from the general path's in key order only."""
    assert canonical(out) == canonical(expected)
    frames, written = events_of(out), events_of(expected)
    assert len(frames) == len(written)
    sent = set(events_of(upstream))
    for mine, general in zip(frames, written, strict=True):
        assert mine == general or mine in sent


def _assert_same_as_general(body: bytes, cuts: list[int], tools: bool = False) -> None:
    one_by_one = pipeline_output(events_of(body), tools)
    assert_as_general(one_by_one, general_path(body, tools), body)
    assert pipeline_output(pieces(body, cuts), tools) == one_by_one
    assert pipeline_output([body], tools) == one_by_one  # every event in one read


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conformant_stream(), st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_a_conformant_stream_split_anywhere_is_what_the_general_path_writes(
    events: list[Event], cuts: list[int], tools: bool
) -> None:
    _assert_same_as_general(b"".join(frame(event) for event in events), cuts, tools)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conformant_stream(),
    st.data(),
    st.lists(st.integers(min_value=0), max_size=12),
    st.booleans(),
)
def test_a_delta_spelled_otherwise_gets_what_the_general_path_writes(
    events: list[Event], data: st.DataObject, cuts: list[int], tools: bool
) -> None:
    """A template learned from the item's first deltas must not fit a later one that the
    general path would write otherwise (or drop, or fail the stream on)."""
    deltas = [k for k, event in enumerate(events) if event["type"] in DELTA_TYPES]
    frames = [frame(event) for event in events]
    if deltas:
        for position in data.draw(st.lists(st.sampled_from(deltas), max_size=3)):
            frames[position] = respelled(events[position], data.draw(HOW))
    _assert_same_as_general(b"".join(frames), cuts, tools)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conformant_stream(open_items=False))
def test_the_deltas_of_a_conformant_stream_are_the_chunks_that_came_in(
    events: list[Event],
) -> None:
    pipeline = StreamPipeline("normalise-responses", context())
    unparsed = count_unparsed(pipeline)
    for event in events:
        chunk = frame(event)
        out = pipeline.feed(chunk)
        if event["type"] in DELTA_TYPES:
            assert out is chunk  # also the item's first delta, which the general path read
    pipeline.close()
    firsts = {event["item_id"] for event in events if event["type"] in DELTA_TYPES}
    deltas = sum(event["type"] in DELTA_TYPES for event in events)
    assert unparsed == [deltas - len(firsts)]  # all but each item's first went unparsed


def test_the_sdk_reads_the_relayed_deltas_as_the_text_streamed() -> None:
    """The fast path keeps each item's text for its done events and the terminal output."""
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress",
            "content": []}  # fmt: skip
    response = {"id": "resp_1", "object": "response", "created_at": 1, "status": "in_progress",
                "model": "m", "output": []}  # fmt: skip
    words = ["Hel", 'lo, "w', "örld\\", "\u2028!"]
    events = [
        {"type": "response.created", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **ids, "part": {"type": "output_text"}},
        *[
            {
                "type": "response.output_text.delta",
                **ids,
                "delta": w,
                "logprobs": [],
                "obfuscation": "abc",
            }
            for w in words
        ],
        # The next item starts: the normaliser closes this one from what streamed.
        {"type": "response.output_item.added", "output_index": 1, "item": {**item, "id": "m2"}},
        {
            "type": "response.output_item.done",
            "output_index": 1,
            "item": {**item, "id": "m2", "status": "completed"},
        },
        {"type": "response.completed", "response": {**response, "status": "completed"}},
    ]
    pipeline = StreamPipeline("normalise-responses", context())
    out = []
    for seq, event in enumerate(events):
        chunk = frame({**event, "sequence_number": seq})
        out.append(pipeline.feed(chunk))
        if seq > 3 and event["type"] == "response.output_text.delta":
            assert out[-1] is chunk
    sse = b"".join(out) + pipeline.close()
    _events, final = sdk_responses_stream(sse)
    assert final.output_text == "".join(words)
    closed = [e for e in sse_events(sse) if e["type"] == "response.output_text.done"]
    assert [e["text"] for e in closed] == ["".join(words)]  # made from the relayed deltas


def test_a_closed_item_takes_no_more_deltas_on_the_fast_path() -> None:
    """A late delta for an item closed when the next one started is dropped, as the general
    path drops it — even though it fits the item's template."""
    ids = {"item_id": "rs_1", "output_index": 0, "summary_index": 0}
    events = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": "rs_1", "type": "reasoning", "summary": []}},
        {"type": "response.reasoning_summary_part.added", **ids, "part": {"type": "summary_text"}},
        {"type": "response.reasoning_summary_text.delta", **ids, "delta": "a"},
        {"type": "response.reasoning_summary_text.delta", **ids, "delta": "b"},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}},
        {"type": "response.reasoning_summary_text.delta", **ids, "delta": "late"},
    ]  # fmt: skip
    body = b"".join(frame({**e, "sequence_number": k}) for k, e in enumerate(events))
    assert b"late" not in pipeline_output(events_of(body))
    _assert_same_as_general(body, [37, 512, 900])


def test_renamed_tools_are_still_restored_next_to_the_fast_path() -> None:
    """With calls to restore, the text deltas keep their bytes and the renamed call still
    becomes the client's custom tool call, numbered in step."""
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    call = {"id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": "",
            "call_id": "call_1", "name": "apply_patch"}  # fmt: skip
    call_ids = {"item_id": "fc_1", "output_index": 1}
    arguments = '{"input":"*** Begin Patch"}'
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "model": "m"}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}},
        {"type": "response.content_part.added", **ids, "part": {"type": "output_text"}},
        *[{"type": "response.output_text.delta", **ids, "delta": w, "logprobs": []}
          for w in ("a", "b", "c")],
        {"type": "response.output_item.added", "output_index": 1, "item": call},
        {"type": "response.function_call_arguments.delta", **call_ids, "delta": arguments[:9]},
        {"type": "response.function_call_arguments.delta", **call_ids, "delta": arguments[9:]},
        {"type": "response.function_call_arguments.done", **call_ids, "arguments": arguments},
        {"type": "response.output_item.done", "output_index": 1,
         "item": {**call, "status": "completed", "arguments": arguments}},
        *[{"type": "response.output_text.delta", **ids, "delta": w, "logprobs": []}
          for w in ("late",)],
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}},
    ]  # fmt: skip
    body = b"".join(frame({**e, "sequence_number": k}) for k, e in enumerate(events))
    _assert_same_as_general(body, [100, 333, 1200], tools=True)
    out = pipeline_output(events_of(body), tools=True)
    _events, final = sdk_responses_stream(out)
    assert [item.type for item in final.output] == ["message", "custom_tool_call"]
    assert final.output[1].input == "*** Begin Patch"  # type: ignore[union-attr]


def test_the_restorer_numbers_what_went_around_it() -> None:
    restorer = CallRestorer(context(tools=True))
    restorer.relayed_around()
    (event,) = restorer.events([{"type": "response.in_progress", "sequence_number": 0}])
    assert event["sequence_number"] == 1 and restorer.next_sequence == 2


# --- real captured streams -------------------------------------------------------------------


def _real_responses_streams() -> list[Any]:
    if not REAL.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{REAL} not present"))]
    paths = []
    for path in sorted(REAL.glob("*.sse")):
        body = path.read_bytes()
        if b"event: response." in body or b'"type":"response.' in body:
            paths.append(pytest.param(path.name, id=path.name.removesuffix(".sse")))
    return paths


@pytest.mark.parametrize("name", _real_responses_streams())
def test_a_real_stream_is_what_the_general_path_writes(name: str) -> None:
    body = (REAL / name).read_bytes()
    for cuts in ([], [1, 2, 3, 50, 51, 700, 4000], list(range(0, len(body), 97))):
        _assert_same_as_general(body, cuts)


class GeneralPath:
    """The judge fed chunk by chunk, to compare what each chunk brings out."""

    def __init__(self) -> None:
        self.decoder = SSEDecoder()
        self.normaliser = ResponsesNormaliser(context())

    def feed(self, chunk: bytes) -> bytes:
        out: list[Event] = []
        for _name, data in self.decoder.feed(chunk):
            if data != b"[DONE]":
                out += self.normaliser.feed(orjson.loads(data))
        return b"".join(frame(event) for event in out)


CONFORMANT_REAL = {
    "vercel-ai-azure-responses-text-stream",
    "vercel-ai-responses-reasoning-summary-function-call-stream",
}


@pytest.mark.parametrize("name", _real_responses_streams())
def test_a_real_streams_conformant_deltas_keep_their_bytes(name: str) -> None:
    """Chunk by chunk the pipeline writes what the general path writes; where that is the
    upstream's delta itself (OpenAI's and Azure's captured streams), it is relayed unparsed,
    as the very chunk object, from the second delta of each item on."""
    pipeline = StreamPipeline("normalise-responses", context())
    judge = GeneralPath()
    relayed = conformant = 0
    for chunk in events_of((REAL / name).read_bytes()):
        if chunk.startswith(b":"):
            continue  # a comment (OpenRouter's keep-alive)
        out, expected = pipeline.feed(chunk), judge.feed(chunk)
        assert_as_general(out, expected, chunk)
        if b".delta\n" in chunk.split(b"\n", 1)[0] + b"\n" and expected == chunk:
            conformant += 1
            relayed += out is chunk
    if name.removesuffix(".sse") in CONFORMANT_REAL:
        items = len(judge.normaliser._items)
        assert conformant > 0 and relayed >= conformant - items


def test_a_conformant_openai_stream_is_relayed_as_it_came_but_its_usage() -> None:
    """Azure's captured stream needs nothing but the usage detail OpenAI's newer streams
    carry: every other event is passed on as the very chunk object."""
    name = "vercel-ai-azure-responses-text-stream.sse"
    if not (REAL / name).exists():
        pytest.skip(f"{name} not present")
    chunks = events_of((REAL / name).read_bytes())
    pipeline = StreamPipeline("normalise-responses", context())
    outs = [pipeline.feed(chunk) for chunk in chunks]
    assert all(out is chunk for out, chunk in zip(outs[:-1], chunks, strict=False))
    terminal = sse_events(outs[-1])[0]
    assert terminal["type"] == "response.completed"
    assert terminal["response"]["usage"]["input_tokens_details"]["cache_write_tokens"] == 0
    assert pipeline.feed(b"".join(chunks[:-1])) == b""  # finished: nothing more goes out


@pytest.mark.parametrize(
    "text",
    [
        '","logprobs":[],"obfuscation":',  # the bytes after the delta, as text
        '"}',
        "\\",
        '\\"',
        "\u2028\x00\x1f",
        "é\U0001f600",
    ],
)
def test_a_delta_holding_the_bytes_around_it_is_read_whole(text: str) -> None:
    """The literal's end is found with the bytes that follow it; a text that spells those
    bytes (escaped, as JSON must) still ends where the literal does."""
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    events = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **ids, "part": {"type": "output_text"}},
        *[
            {
                "type": "response.output_text.delta",
                **ids,
                "delta": piece,
                "logprobs": [],
                "obfuscation": "x1",
            }
            for piece in ("a", text, text + "b")
        ],
        {"type": "response.output_item.added", "output_index": 1, "item": {**item, "id": "m2"}},
    ]
    body = b"".join(frame({**e, "sequence_number": k}) for k, e in enumerate(events))
    _assert_same_as_general(body, [5, 300, 700])
    pipeline = StreamPipeline("normalise-responses", context())
    unparsed = count_unparsed(pipeline)
    sse = b"".join(pipeline.feed(chunk) for chunk in events_of(body)) + pipeline.close()
    assert unparsed == [2]  # the deltas after the first
    out = sse_events(sse)
    (done,) = [e for e in out if e["type"] == "response.output_text.done"]
    assert done["text"] == "a" + text + text + "b"


def test_a_read_of_several_fitting_deltas_is_passed_on_as_it_came() -> None:
    """A busy proxy reads many events at once: those that fit the template cost no frame
    building, and a read of nothing else is the very object passed on."""
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    head = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **ids, "part": {"type": "output_text"}},
    ]
    deltas = [
        {"type": "response.output_text.delta", **ids, "delta": w, "logprobs": []}
        for w in ("a", "b", "c", "d", "e")
    ]
    frames = [frame({**e, "sequence_number": k}) for k, e in enumerate([*head, *deltas])]
    pipeline = StreamPipeline("normalise-responses", context())
    for chunk in frames[:4]:  # the first delta teaches the template
        pipeline.feed(chunk)
    read = b"".join(frames[4:6])
    assert pipeline.feed(read) is read
    mixed = b"".join(frames[6:]) + frame({**head[1], "sequence_number": 8})[:20]
    assert pipeline.feed(mixed) == b"".join(frames[6:])  # an event cut short waits
    assert pipeline.events_in == 8


@pytest.mark.parametrize(
    "fields",
    [
        ("delta", "sequence_number"),  # OpenRouter, and the fake upstream
        ("sequence_number", "delta", "obfuscation"),  # OpenAI and Azure
        ("delta", "obfuscation", "sequence_number"),  # OpenAI's keys sorted
        ("sequence_number", "delta"),
    ],
)
def test_the_layouts_upstreams_write_get_a_scanner(fields: tuple[str, ...]) -> None:
    """The few-C-calls check of a whole frame is there for each layout real servers use, and
    it keeps each relayed delta's text (the general path keeps nothing more)."""
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    values = {"obfuscation": "Zq9"}
    head = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **ids, "part": {"type": "output_text"}},
    ]
    frames = [frame({**e, "sequence_number": k}) for k, e in enumerate(head)]
    for k, text in enumerate(["a", " b", "é"], start=len(head)):
        event: Event = {"type": "response.output_text.delta", **ids}
        for name in fields:
            event[name] = {"delta": text, "sequence_number": k}.get(name, values.get(name))
        event["logprobs"] = []
        frames.append(frame(event))
    pipeline = StreamPipeline("normalise-responses", context())
    unparsed = count_unparsed(pipeline)
    out = [pipeline.feed(chunk) for chunk in frames]
    normaliser = pipeline._responses_norm
    assert isinstance(normaliser, ResponsesNormaliser) and normaliser.template is not None
    assert normaliser.template.scan is not None
    assert unparsed == [2] and out[-2:] == frames[-2:]
    # The first as the general path read it, the plain ASCII one as its bytes, the other read.
    assert normaliser.template.sink == ["a", b" b", "é"]
    assert text_of(normaliser.template.sink) == "a bé"


# --- plain literals kept as their bytes --------------------------------------------------------

# Characters that decide how a literal is kept: plain ASCII (kept as bytes), DEL (plain in
# orjson's spelling), quotes, backslashes and control characters (escaped), and non-ASCII
# text of every UTF-8 length, including U+2028 and an astral character.
TRICKY = st.text(
    st.one_of(
        st.sampled_from('ab Z9~"\\/\x00\x01\x08\t\n\x0b\x1f\x7f\u00e9\u2028\u4e2d\U0001f600'),
        st.characters(codec="utf-8"),
    ),
    max_size=6,
)
NOTHING_PLAIN = bytes((b + 1) % 256 for b in range(256))
"""A :data:`PLAIN` that leaves no byte as it is: every literal is read with orjson as it
comes, which is what the hot paths did for every delta before they kept plain bytes."""


OPEN_ITEM = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress",
             "content": []}  # fmt: skip
TEXT_IDS = {"item_id": "msg_1", "output_index": 0, "content_index": 0}


def _opening() -> list[bytes]:
    """A stream's first three frames, numbered 0–2: created, one message item added, its text
    part added (what the deltas of :data:`TEXT_IDS` then stream into)."""
    head = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "output_index": 0, "item": OPEN_ITEM},
        {"type": "response.content_part.added", **TEXT_IDS, "part": {"type": "output_text"}},
    ]
    return [frame({**event, "sequence_number": k}) for k, event in enumerate(head)]


def _text_stream(texts: list[str], layout: str, spelling: str) -> list[bytes]:
    """One message item whose text streams as ``texts`` and which the upstream leaves open (so
    the normaliser writes its done events from what it kept), in one of the layouts upstreams
    write, each delta's literal spelled by orjson or otherwise."""
    ids = TEXT_IDS
    frames = _opening()
    for k, text in enumerate(texts, start=len(frames)):
        marker = "\x00delta\x00"  # replaced by the literal as spelled
        event: Event = {"type": "response.output_text.delta"}
        if layout == "openai":
            event |= {"sequence_number": k, **ids, "delta": marker, "obfuscation": "Zq9"}
        elif layout == "number first":
            event |= {"sequence_number": k, **ids, "delta": marker}
        else:  # the fake upstream's and OpenRouter's: the number last
            event |= {**ids, "delta": marker, "logprobs": [], "sequence_number": k}
        data = orjson.dumps(event).replace(orjson.dumps(marker), _spelled(text, spelling))
        frames.append(encode_typed(event["type"], data))
    closing = {"type": "response.output_item.added", "output_index": 1,
               "item": {**OPEN_ITEM, "id": "msg_2"}}  # fmt: skip
    frames.append(frame({**closing, "sequence_number": len(frames)}))
    return frames


def _spelled(text: str, spelling: str) -> bytes:
    if spelling == "orjson":
        return orjson.dumps(text)
    if spelling == "ascii escapes":
        return json.dumps(text).encode()
    if spelling == "escaped slash":
        return orjson.dumps(text).replace(b"/", b"\\/")
    if spelling == "raw control":  # not JSON: a control character unescaped
        return orjson.dumps(text).replace(b"\\n", b"\n").replace(b"\\u0001", b"\x01")
    if spelling == "latin-1":  # not UTF-8
        return b'"' + orjson.dumps(text)[1:-1].decode().encode("latin-1", "replace") + b'"'
    raise AssertionError(spelling)


SPELLINGS = st.sampled_from(["orjson", "ascii escapes", "escaped slash", "raw control", "latin-1"])
LAYOUTS = st.sampled_from(["openai", "number first", "number last"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TRICKY, min_size=1, max_size=8), LAYOUTS, st.lists(SPELLINGS, max_size=8))
def test_plain_literals_kept_as_bytes_give_what_reading_each_gave(
    texts: list[str], layout: str, spellings: list[str]
) -> None:
    """Whatever the deltas hold and however they are spelled, keeping plain literals as bytes
    changes nothing the client gets: every chunk's output and the done events the normaliser
    writes from what it kept are those of reading every literal as it comes."""
    spelling = [spellings[k % len(spellings)] if spellings else "orjson" for k in range(8)]
    frames = _text_stream(texts, layout, spelling[0])
    for k in range(len(texts)):
        frames[3 + k] = _text_stream(texts, layout, spelling[k])[3 + k]
    kept = [pipeline_output_by_chunk(frames), pipeline_output([b"".join(frames)])]
    with plain_table(NOTHING_PLAIN):
        read = [pipeline_output_by_chunk(frames), pipeline_output([b"".join(frames)])]
    assert kept == read
    if all(s == "orjson" for s in spelling[: len(texts)]):
        done = [e for e in sse_events(kept[1]) if e["type"] == "response.output_text.done"]
        assert [e["text"] for e in done] == ["".join(texts)]
        assert b"".join(kept[0]) == kept[1]


def pipeline_output_by_chunk(chunks: list[bytes]) -> list[bytes]:
    pipeline = StreamPipeline("normalise-responses", context())
    out = [pipeline.feed(chunk) for chunk in chunks]
    out.append(pipeline.close())
    return out


@contextmanager
def plain_table(table: bytes) -> Iterator[None]:
    """:data:`PLAIN` as ``table`` for the templates learned inside the ``with`` block."""
    original = normalise_fast.PLAIN
    normalise_fast.PLAIN = table
    try:
        yield
    finally:
        normalise_fast.PLAIN = original


def test_plain_literals_are_kept_as_bytes_and_the_rest_as_text() -> None:
    """What the relay keeps: a plain literal's bytes, any other literal's text; the item's
    text is theirs joined."""
    texts = ["Hel", "lo", ' "w', "örld", "\\", "\x7f", "~", "\n", "!"]
    frames = _text_stream(texts, "number last", "orjson")
    pipeline = StreamPipeline("normalise-responses", context())
    outs = [pipeline.feed(chunk) for chunk in frames[:-1]]
    assert all(out is chunk for out, chunk in zip(outs[4:], frames[4:-1], strict=True))
    normaliser = pipeline._responses_norm
    assert isinstance(normaliser, ResponsesNormaliser) and normaliser.template is not None
    sink = normaliser.template.sink
    assert sink == ["Hel", b"lo", ' "w', "örld", "\\", b"\x7f", b"~", "\n", b"!"]
    assert text_of(sink) == "".join(texts)
    assert [bytes([b]) for b in range(256) if PLAIN[b] == b] == [
        bytes([b]) for b in range(0x20, 0x80) if b not in b'"\\'
    ]


# --- numbered endings kept by the process -------------------------------------------------------


def _numbered_stream(texts: list[str], layout: str, step: int | None = None) -> list[bytes]:
    """A message item streaming ``texts`` with the number in the frame's fixed end (the fake
    upstream's and OpenRouter's layout, or OpenAI's with an obfuscation value); the delta at
    ``step`` numbered one ahead of its place."""
    frames = _opening()
    for n, text in enumerate(texts):
        number = len(frames) + (n == step)
        if layout == "openai":
            event = {"type": "response.output_text.delta", "content_index": 0, "delta": text,
                     "item_id": "msg_1", "logprobs": [], "obfuscation": "Zq9",
                     "output_index": 0, "sequence_number": number}  # fmt: skip
        else:
            event = {"type": "response.output_text.delta", **TEXT_IDS, "delta": text,
                     "logprobs": [], "sequence_number": number}  # fmt: skip
        frames.append(frame(event))
    return frames


@pytest.mark.parametrize("layout", ["number last", "openai"])
def test_numbered_endings_are_kept_once_for_the_streams_of_a_layout(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's numbered frame ends are the process's, each ``ending % n`` at index ``n``
    up to the bound (beyond it a frame's end is formatted for it); the next stream of the
    layout relays its deltas from them, and a number out of step is still not relayed."""
    monkeypatch.setattr(normalise_fast, "_ENDINGS", {})
    monkeypatch.setattr(normalise_fast, "ENDINGS_NUMBERS", 9)
    texts = [f"w{k}" for k in range(12)]  # numbered 3..14: beyond the bound of 9
    for _stream in range(2):
        frames = _numbered_stream(texts, layout)
        pipeline = StreamPipeline("normalise-responses", context())
        outs = [pipeline.feed(chunk) for chunk in frames]
        assert all(out is chunk for out, chunk in zip(outs[3:], frames[3:], strict=True))
        ((ending, endings),) = normalise_fast._ENDINGS.items()
        assert endings == [ending % n for n in range(9)]
    stepped = _numbered_stream(texts, layout, step=4)
    body = b"".join(stepped)
    out = pipeline_output(stepped)
    assert_as_general(out, general_path(body), body)
    assert events_of(out)[7] != stepped[7]  # renumbered, not relayed as it came
    assert pipeline_output([body]) == out


def test_only_the_last_layouts_endings_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(normalise_fast, "_ENDINGS", {})
    monkeypatch.setattr(normalise_fast, "ENDINGS_KEPT", 1)
    for layout in ("number last", "openai"):
        pipeline_output(_numbered_stream(["a", "b", "c"], layout))
    ((ending, endings),) = normalise_fast._ENDINGS.items()
    assert b'"obfuscation"' not in ending and len(endings) == 6  # numbers 0..5
    assert ending.startswith(b'","output_index":0,"sequence_number":%d}')


# --- what a long stream holds -----------------------------------------------------------------


@contextmanager
def folding_from(parts: int) -> Iterator[None]:
    kept = normalise_fast.FOLD_FROM
    normalise_fast.FOLD_FROM = parts
    try:
        yield
    finally:
        normalise_fast.FOLD_FROM = kept


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conformant_stream(), st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_folding_what_a_stream_holds_between_any_chunks_changes_nothing(
    events: list[Event], cuts: list[int], tools: bool
) -> None:
    body = b"".join(frame(event) for event in events)
    plain = pipeline_output(events_of(body), tools)
    with folding_from(2):  # fold whatever is held, after every chunk
        assert pipeline_output(events_of(body), tools, fold=True) == plain
        assert pipeline_output(pieces(body, cuts), tools, fold=True) == plain


@pytest.mark.parametrize("layout", ["openai", "number last"])
def test_a_long_answer_is_held_in_few_objects_once_folded(layout: str) -> None:
    texts = [f"w{k}— " if k % 5 else f"“{k}” " for k in range(1000)]
    frames = _text_stream(texts, layout, "orjson")
    pipeline = StreamPipeline("normalise-responses", context())
    assert pipeline.holds_deltas
    out = []
    for k, chunk in enumerate(frames, start=1):
        out.append(pipeline.feed(chunk))
        if k % 50 == 0:
            pipeline.fold()
            item = pipeline.translator._items["msg_1"]  # type: ignore[union-attr]
            # ~50 deltas since the last fold, each an object: now the text and nothing else.
            assert [type(part) for part in item.texts[0]] == [bytearray]
    out.append(pipeline.close())
    assert b"".join(out) == pipeline_output(frames)  # the same bytes as without folding
    done = [e for e in sse_events(b"".join(out)) if e["type"] == "response.output_text.done"]
    assert done[0]["text"] == "".join(texts)
