"""StreamPipeline robustness for the two Responses-upstream directions.

Whatever the upstream does — malformed JSON, non-JSON or non-UTF-8 bytes, a body cut inside
an event, a ``[DONE]`` without a terminal, a proxy-side failure — the client's stream must end
with exactly one well-formed terminal in its own protocol (chat: an error chunk and
``data: [DONE]``; Responses: ``error`` + ``response.failed``), never a silent clean end, and
nothing may follow that terminal. Output is read with parsers independent of llmitm's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.codex_parser import iter_sse
from tests.helpers.oracle import sdk_chat_stream, sdk_responses_stream

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
DIRECTIONS = ("responses-to-chat", "normalise-responses")
TERMINALS = ("response.completed", "response.incomplete", "response.failed")


def context() -> TranslationContext:
    options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1_700_000_000))
    return TranslationContext(options=options, include_usage=True)


def frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def upstream_events() -> list[dict[str, Any]]:
    """A small conformant Responses stream: one message "Hello" in two deltas."""
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress"}
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    usage = {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }
    response = {"id": "resp_1", "object": "response", "created_at": 1_750_000_000, "model": "m"}
    done_item = {**msg, "status": "completed", "content": [part]}
    events = [
        {"type": "response.created", "response": {**response, "status": "in_progress"}},
        {"type": "response.in_progress", "response": {**response, "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**msg, "content": []}},
        {"type": "response.content_part.added", **ids, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **ids, "delta": "Hel", "logprobs": []},
        {"type": "response.output_text.delta", **ids, "delta": "lo", "logprobs": []},
        {"type": "response.output_text.done", **ids, "text": "Hello", "logprobs": []},
        {"type": "response.content_part.done", **ids, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [done_item], "usage": usage},
        },
    ]
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def upstream_bytes(events: list[dict[str, Any]] | None = None) -> bytes:
    return b"".join(frame(e) for e in events or upstream_events())


HEAD = upstream_bytes(upstream_events()[:5])  # up to and including the delta "Hel"
TAIL = upstream_bytes(upstream_events()[5:])


def run(direction: str, *chunks: bytes, close: bool = True) -> bytes:
    pipeline = StreamPipeline(direction, context())  # type: ignore[arg-type]
    out = pipeline.start() + b"".join(pipeline.feed(chunk) for chunk in chunks)
    return out + pipeline.close() if close else out


# -- independent readers of the output --------------------------------------------------------


def chat_payloads(raw: bytes) -> list[Any]:
    """Each ``data:`` payload of a chat body: a dict, or ``"[DONE]"``."""
    out: list[Any] = []
    for name, data in iter_sse(raw):
        assert name is None, "chat frames carry no event line"
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def responses_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for name, data in iter_sse(raw):
        event = json.loads(data)
        assert name == event["type"]
        events.append(event)
    return events


def assert_chat_error_end(raw: bytes, code: str = "server_error") -> dict[str, Any]:
    """The chat body ends with one error chunk then one ``[DONE]``, nothing else after; no
    chunk claims a finish; the SDK raises ``APIError``. Returns the error object."""
    raw.decode("utf-8")  # the client's stream stays valid UTF-8
    payloads = chat_payloads(raw)
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
    errors = [p for p in payloads if isinstance(p, dict) and "error" in p]
    assert errors == [payloads[-2]]
    error = errors[0]["error"]
    assert error["code"] == code
    for chunk in payloads[:-2]:
        assert all(choice["finish_reason"] is None for choice in chunk["choices"])
    with pytest.raises(openai.APIError, match=_first_words(error["message"])):
        sdk_chat_stream(raw)
    return error


def assert_responses_failed_end(raw: bytes, code: str = "server_error") -> dict[str, Any]:
    """The Responses body ends with ``response.failed`` (the only terminal, carrying ``code``),
    sequence numbers stay gapless. When an ``error`` event precedes it (a malformed event, a
    proxy-side failure) the SDK raises ``APIError`` with its message; a bare cut ends in
    ``response.failed`` alone and the SDK refuses a final response. Returns the failed
    response."""
    events = responses_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.failed"
    assert sum(e["type"] in TERMINALS for e in events) == 1
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == code
    if events[-2]["type"] == "error":
        assert events[-2]["code"] == events[-2]["error"]["code"] == code
        with pytest.raises(openai.APIError, match=_first_words(failed["error"]["message"])):
            sdk_responses_stream(raw)
    else:
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            sdk_responses_stream(raw)
    return failed


def assert_error_event_precedes_failed(raw: bytes) -> None:
    assert [e["type"] for e in responses_events(raw)[-2:]] == ["error", "response.failed"]


def assert_error_end(direction: str, raw: bytes, code: str = "server_error") -> str:
    """Either protocol's error end; returns the error message."""
    if direction == "responses-to-chat":
        return assert_chat_error_end(raw, code)["message"]
    return assert_responses_failed_end(raw, code)["error"]["message"]


def _first_words(message: str) -> str:
    return re.escape(message[:30])


def chat_content(raw: bytes) -> str:
    return "".join(
        (choice["delta"].get("content") or "")
        for p in chat_payloads(raw)
        if isinstance(p, dict) and "choices" in p
        for choice in p["choices"]
    )


def responses_text(raw: bytes) -> str:
    return "".join(
        e["delta"] for e in responses_events(raw) if e["type"] == "response.output_text.delta"
    )


def text_of(direction: str, raw: bytes) -> str:
    return chat_content(raw) if direction == "responses-to-chat" else responses_text(raw)


# -- the reference: a clean stream ends cleanly ----------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_clean_stream_ends_cleanly(direction: str) -> None:
    """The baseline every other test departs from: the whole stream gives a clean end."""
    raw = run(direction, upstream_bytes())
    if direction == "responses-to-chat":
        final, _ = sdk_chat_stream(raw, stream_options={"include_usage": True})
        assert final.choices[0].message.content == "Hello"
        assert final.usage.total_tokens == 7
    else:
        _, final = sdk_responses_stream(raw)
        assert final.output_text == "Hello"


# -- malformed events --------------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_malformed_json_mid_stream_ends_with_an_error(direction: str) -> None:
    """Malformed JSON after some text: what came before is delivered, then the protocol's error
    end naming the malformed event; the valid events after it are not translated."""
    bad = b'data: {"type": "response.output_text.delta", "delta": "x"\n\n'
    raw = run(direction, HEAD + bad + TAIL)
    message = assert_error_end(direction, raw)
    assert "malformed" in message and "response.output_text.delta" in message
    if direction == "normalise-responses":
        assert_error_event_precedes_failed(raw)
    assert text_of(direction, raw) == "Hel"


@pytest.mark.parametrize("payload", [b"[1, 2]", b'"text"', b"42", b"null", b"true"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_json_that_is_not_an_object_ends_with_an_error(direction: str, payload: bytes) -> None:
    """Valid JSON that is not an event object is as malformed as broken JSON."""
    raw = run(direction, HEAD + b"data: " + payload + b"\n\n" + TAIL)
    assert "malformed" in assert_error_end(direction, raw)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_non_utf8_bytes_inside_an_event_end_with_an_error(direction: str) -> None:
    """Invalid UTF-8 inside an event's data: an error end, and the error message quoting the
    bad event is itself valid UTF-8."""
    bad = b'data: {"type":"response.output_text.delta","delta":"\xff\xfe\xc3"}\n\n'
    raw = run(direction, HEAD + bad + TAIL)
    assert "malformed" in assert_error_end(direction, raw)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_garbage_lines_that_are_not_events_are_ignored(direction: str) -> None:
    """Lines with no ``data:`` field (binary noise, unknown fields, comments, ``id:`` and
    ``retry:``) are not events under the SSE rules: the stream goes on and completes."""
    noise = b"\xff\xfe\xfd\x00garbage\n\n: keep-alive \xff\n\nid: 7\nretry: 10\n\nbogus: x\n\n"
    raw = run(direction, HEAD + noise + TAIL)
    assert text_of(direction, raw) == "Hello"
    if direction == "responses-to-chat":
        final, _ = sdk_chat_stream(raw)
        assert final.choices[0].finish_reason == "stop"
    else:
        _, final = sdk_responses_stream(raw)
        assert final.status == "completed"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_non_utf8_event_name_does_not_raise(direction: str) -> None:
    """A non-UTF-8 ``event:`` name must not raise out of ``feed`` (the proxy would lose the
    chunk): the JSON ``type`` is what counts, so the event still translates."""
    odd = b'event: \xff\xfe\ndata: {"type":"response.in_progress","response":{"id":"resp_1"}}\n\n'
    raw = run(direction, HEAD + odd + TAIL)
    assert text_of(direction, raw) == "Hello"


# -- upstream cuts -----------------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_upstream_closing_mid_event_ends_with_an_error(direction: str) -> None:
    """The upstream closes in the middle of an event's JSON: ``close()`` ends the stream with
    the error end, and the text delivered before the cut stays."""
    partial = b'event: response.output_text.delta\ndata: {"type":"response.output_text.de'
    raw = run(direction, HEAD, partial)
    assert "malformed" in assert_error_end(direction, raw)
    assert text_of(direction, raw) == "Hel"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_upstream_closing_between_events_ends_with_an_error(direction: str) -> None:
    """A cut on an event boundary (no partial frame) is still a stream without its terminal."""
    message = assert_error_end(direction, run(direction, HEAD))
    assert "terminal" in message


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_terminal_event_without_final_blank_line_still_completes(direction: str) -> None:
    """A body whose last event lacks the closing blank line: ``close()`` flushes it, and the
    stream completes normally."""
    raw = run(direction, upstream_bytes().removesuffix(b"\n\n"))
    if direction == "responses-to-chat":
        assert chat_payloads(raw)[-1] == "[DONE]"
        final, _ = sdk_chat_stream(raw)
        assert final.choices[0].finish_reason == "stop"
    else:
        _, final = sdk_responses_stream(raw)
        assert final.status == "completed"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_cut_point_gives_one_well_formed_ending(direction: str) -> None:
    """Cut the upstream body at every byte: the client always gets exactly one terminal, last;
    it is a clean completion exactly when the terminal event's JSON arrived whole."""
    body = upstream_bytes()
    terminal_end = body.rindex(b"}") + 1  # the end of response.completed's JSON
    for cut in range(len(body) + 1):
        raw = run(direction, body[:cut])
        clean = cut >= terminal_end
        if direction == "responses-to-chat":
            payloads = chat_payloads(raw)
            assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1, cut
            has_error = any(isinstance(p, dict) and "error" in p for p in payloads)
            assert has_error is not clean, cut
        else:
            events = responses_events(raw)
            assert [e["sequence_number"] for e in events] == list(range(len(events))), cut
            assert sum(e["type"] in TERMINALS for e in events) == 1, cut
            expected = "response.completed" if clean else "response.failed"
            assert events[-1]["type"] == expected, cut


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_done_marker_without_terminal_is_not_a_clean_end(direction: str) -> None:
    """``data: [DONE]`` before any terminal event (a Responses upstream has no business ending
    that way) does not pass for completion."""
    raw = run(direction, HEAD + b"data: [DONE]\n\n")
    assert "terminal" in assert_error_end(direction, raw)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_empty_upstream_body(direction: str) -> None:
    """An upstream that sends nothing at all: a complete, failed stream in the client's
    protocol (chat: role, error, ``[DONE]``; Responses: created, error, failed)."""
    raw = run(direction)
    if direction == "responses-to-chat":
        payloads = chat_payloads(raw)
        assert len(payloads) == 3
        assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
        assert_chat_error_end(raw)
    else:
        events = responses_events(raw)
        assert [e["type"] for e in events] == ["response.created", "error", "response.failed"]
        assert events[1]["error"]["code"] == "server_error"
        assert events[2]["response"]["error"]["code"] == "server_error"


# -- chunking ----------------------------------------------------------------------------------


def _reference_stream() -> bytes:
    path = REAL / "vercel-ai-responses-reasoning-summary-function-call-stream.sse"
    return path.read_bytes() if path.exists() else upstream_bytes()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_empty_chunks_change_nothing(direction: str) -> None:
    """An empty chunk mid-stream yields nothing and does not end the stream."""
    pipeline = StreamPipeline(direction, context())  # type: ignore[arg-type]
    first = pipeline.feed(HEAD)
    assert pipeline.feed(b"") == b""
    assert not pipeline.finished
    rest = pipeline.feed(TAIL) + pipeline.close()
    assert text_of(direction, first + rest) == "Hello"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_byte_by_byte_equals_whole(direction: str) -> None:
    """Chunk boundaries anywhere (inside UTF-8 characters, between CR and LF) give the same
    client bytes as one whole chunk — a real stream, fed one byte at a time, and with CRLF."""
    body = _reference_stream()
    for variant in (body, body.replace(b"\n", b"\r\n")):
        whole = run(direction, variant)
        assert run(direction, *(variant[i : i + 1] for i in range(len(variant)))) == whole
        assert whole == run(direction, body)


# -- proxy-side failure and the end of the stream ----------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_fail_after_some_output(direction: str) -> None:
    """``fail(ApiError)`` after some output (the upstream connection broke): the client's
    stream ends with that error, code included; later feeds and close add nothing."""
    pipeline = StreamPipeline(direction, context())  # type: ignore[arg-type]
    out = pipeline.feed(HEAD)
    error = ApiError(message="Upstream connection reset", code="upstream_reset", status=502)
    out += pipeline.fail(error)
    assert pipeline.finished
    assert pipeline.feed(TAIL) == b""
    assert pipeline.close() == b""
    assert pipeline.fail(error) == b""
    assert assert_error_end(direction, out, "upstream_reset") == "Upstream connection reset"
    if direction == "normalise-responses":
        assert_error_event_precedes_failed(out)
    assert text_of(direction, out) == "Hel"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_nothing_after_the_terminal_event(direction: str) -> None:
    """Events after the terminal — in the same chunk, in later chunks, a partial frame at
    close — produce no bytes; the terminal stays last."""
    extra = upstream_bytes(upstream_events()[2:6])
    pipeline = StreamPipeline(direction, context())  # type: ignore[arg-type]
    out = pipeline.feed(upstream_bytes() + extra)
    assert pipeline.finished
    assert pipeline.feed(extra) == b""
    assert pipeline.feed(b'data: {"type":"response.failed"') == b""
    assert pipeline.close() == b""
    if direction == "responses-to-chat":
        payloads = chat_payloads(out)
        assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
        assert chat_content(out) == "Hello"
    else:
        events = responses_events(out)
        assert events[-1]["type"] == "response.completed"
        assert sum(e["type"] in TERMINALS for e in events) == 1
        assert responses_text(out) == "Hello"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_malformed_event_after_an_upstream_error_keeps_the_first_error(direction: str) -> None:
    """Upstream ``error`` + ``response.failed`` then garbage: one error end, with the
    upstream's error (the garbage is after the terminal)."""
    error = {
        "type": "error",
        "sequence_number": 5,
        "error": {"type": "invalid_request_error", "code": "bad_thing", "message": "Bad thing."},
    }
    failed = {"type": "response.failed", "sequence_number": 6, "response": {"id": "resp_1"}}
    raw = run(direction, HEAD + frame(error) + frame(failed) + b"data: {oops\n\n")
    assert assert_error_end(direction, raw, "bad_thing") == "Bad thing."
    if direction == "normalise-responses":
        assert_error_event_precedes_failed(raw)
