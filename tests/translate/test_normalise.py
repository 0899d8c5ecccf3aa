"""normalise-responses: a third-party Responses stream made conformant for strict consumers.

Every real Responses fixture goes through the pipeline; the output must satisfy the openai SDK
(``client.responses.stream``), the event-order invariants (checked here on the bytes, parsed
independently), a Codex-style consumer, and say what the source said (text, items, usage).
Synthetic streams cover what real servers get wrong in ways the fixtures do not show.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.normalise import ResponsesNormaliser
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.codex_parser import Completed, OutputItemDone, iter_sse, parse_codex_stream
from tests.helpers.oracle import sdk_responses_stream

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
NOW = 1_700_000_000
TERMINALS = ("response.completed", "response.incomplete", "response.failed")


def context() -> TranslationContext:
    return TranslationContext(TranslateOptions(ids=CountingIds(), clock=fixed_clock(NOW)))


def normalise_bytes(raw: bytes) -> bytes:
    pipeline = StreamPipeline("normalise-responses", context())
    return pipeline.start() + pipeline.feed(raw) + pipeline.close()


def normalise(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events through :class:`ResponsesNormaliser` (copies: it fills fields in place)."""
    normaliser = ResponsesNormaliser(context())
    out: list[dict[str, Any]] = []
    for event in json.loads(json.dumps(events)):
        out += normaliser.feed(event)
    return out + normaliser.close()


def encode(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def data_events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a body, by an SSE split independent of llmitm's decoder."""
    out = []
    for _name, data in iter_sse(raw):
        if data.strip() != "[DONE]":
            out.append(json.loads(data))
    return out


# -- the event-order invariants -------------------------------------------------------------


def assert_conformant(raw: bytes) -> list[dict[str, Any]]:
    """Check the event-order invariants on an encoded Responses stream; returns its events."""
    frames = iter_sse(raw)
    events = [json.loads(data) for _name, data in frames]
    # Framing: every event has an event line repeating its JSON type; no [DONE].
    assert [name for name, _ in frames] == [e["type"] for e in events]
    # 1: response.created first, in progress, empty output; seq 0, 1, 2, … without gaps.
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # 2: exactly one terminal event, the last.
    assert [e["type"] in TERMINALS for e in events].count(True) == 1
    assert events[-1]["type"] in TERMINALS
    response_ids = {e["response"]["id"] for e in events if "response" in e}
    assert len(response_ids) == 1
    items: dict[str, int] = {}
    added_items: dict[str, dict[str, Any]] = {}
    done: dict[int, dict[str, Any]] = {}
    parts: set[tuple[str, int]] = set()
    for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            # 4: output_index == number of items added before.
            assert event["output_index"] == len(items)
            items[event["item"]["id"]] = event["output_index"]
            added_items[event["item"]["id"]] = event["item"]
        elif kind == "response.output_item.done":
            item = event["item"]
            assert items[item["id"]] == event["output_index"]
            assert item["type"] == added_items[item["id"]]["type"]
            done[event["output_index"]] = item
        elif "item_id" in event:
            # 5: every delta/done names an added item, at that item's position.
            assert event["item_id"] in items, event
            assert event["output_index"] == items[event["item_id"]], event
            if kind == "response.content_part.added":
                parts.add((event["item_id"], event["content_index"]))
            if kind.startswith(("response.output_text.", "response.refusal.")):
                # 6: the content part exists before its text.
                assert (event["item_id"], event["content_index"]) in parts, event
            if kind == "response.output_text.delta":
                assert isinstance(event["logprobs"], list)  # 11
            if kind == "response.function_call_arguments.done":
                assert event.get("name"), event  # 8: .done carries name
            if kind.startswith("response.reasoning_summary_"):
                assert isinstance(event["summary_index"], int)  # 12
    # 10: the terminal output is the done items, in output_index order, ids identical
    # (the content may differ: OpenAI re-encrypts reasoning in its terminal snapshot).
    terminal = events[-1]["response"]
    assert [_identity(item) for item in terminal["output"]] == [
        _identity(done[index]) for index in sorted(done)
    ]
    return events


def _identity(item: dict[str, Any]) -> tuple[Any, ...]:
    return item["type"], item.get("id"), item.get("call_id")


# -- real fixtures ---------------------------------------------------------------------------


def _responses_fixtures() -> list[Any]:
    if not REAL.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{REAL} not present"))]
    params = []
    for path in sorted(REAL.glob("*.sse")):
        meta_path = path.with_name(path.stem + ".meta.json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if meta.get("api") == "responses":
            params.append(pytest.param(path.name, id=path.stem))
    return params


FIXTURES = _responses_fixtures()


def read_fixture(name: str) -> bytes:
    path = REAL / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path.read_bytes()


def _fails(events: list[dict[str, Any]]) -> bool:
    return any(e.get("type") in ("error", "response.failed") for e in events)


def test_fixture_list_is_not_empty() -> None:
    if not REAL.is_dir():
        pytest.skip(f"{REAL} not present")
    assert len(FIXTURES) >= 8


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_is_conformant(name: str) -> None:
    """The event-order invariants hold on the normalised output of every real Responses stream."""
    assert_conformant(normalise_bytes(read_fixture(name)))


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_is_accepted_by_the_sdk(name: str) -> None:
    """``client.responses.stream`` accepts the output; ``get_final_response()`` works for
    completed streams and its output is the stream's items; a failing stream raises the
    upstream's ``APIError``."""
    raw = read_fixture(name)
    source = data_events(raw)
    out = normalise_bytes(raw)
    if _fails(source):
        message = next(e["error"]["message"] for e in source if e["type"] == "error")
        with pytest.raises(openai.APIError, match=re.escape(message)):
            sdk_responses_stream(out)
        return
    events, final = sdk_responses_stream(out)
    assert final is not None and final.status == "completed"
    # The ids a client built its history from, by position.
    done = sorted(
        (e for e in events if e.type == "response.output_item.done"), key=lambda e: e.output_index
    )
    assert [item.id for item in final.output] == [e.item.id for e in done]
    text = "".join(e["delta"] for e in source if e["type"] == "response.output_text.delta")
    assert final.output_text == text


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_keeps_text_items_and_usage(name: str) -> None:
    """The same text deltas, the same items (upstream ids kept) and the same token counts —
    with both usage details objects present."""
    raw = read_fixture(name)
    source = data_events(raw)
    out = data_events(normalise_bytes(raw))

    def texts(events: list[dict[str, Any]]) -> list[str]:
        return [e["delta"] for e in events if e["type"] == "response.output_text.delta"]

    def added(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [
            (e["item"]["type"], e["item"]["id"])
            for e in events
            if e["type"] == "response.output_item.added"
        ]

    assert texts(out) == texts(source)
    assert added(out) == added(source)
    src_terminal = next(e for e in source if e["type"] in TERMINALS)
    terminal = out[-1]
    assert terminal["type"] == src_terminal["type"]
    assert terminal["response"]["id"] == src_terminal["response"]["id"]
    src_usage, usage = src_terminal["response"].get("usage"), terminal["response"]["usage"]
    if src_usage is None:
        assert usage is None
        return
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert usage[key] == src_usage[key]
    src_in = src_usage.get("input_tokens_details") or {}
    src_out = src_usage.get("output_tokens_details") or {}
    assert usage["input_tokens_details"]["cached_tokens"] == src_in.get("cached_tokens", 0)
    assert usage["output_tokens_details"]["reasoning_tokens"] == src_out.get("reasoning_tokens", 0)


@pytest.mark.parametrize("name", FIXTURES)
def test_checklist_42_codex_consumer_accepts_fixture(name: str) -> None:
    """A Codex-style consumer gets one OutputItemDone per item and Completed with the
    response id and usage (failing fixtures: the upstream's error code, not a generic one)."""
    raw = read_fixture(name)
    source = data_events(raw)
    out = normalise_bytes(raw)
    if _fails(source):
        with pytest.raises(Exception, match="quota") as raised:
            parse_codex_stream(out)
        assert raised.value.kind == "quota_exceeded"  # type: ignore[attr-defined]
        return
    codex = parse_codex_stream(out)
    done = [e for e in codex if isinstance(e, OutputItemDone)]
    src_added = [e for e in source if e["type"] == "response.output_item.added"]
    # One done per item (OpenRouter finishes its reasoning after the message: order of
    # completion is the upstream's).
    assert sorted(e.item["id"] for e in done) == sorted(e["item"]["id"] for e in src_added)
    completed = codex[-1]
    assert isinstance(completed, Completed)
    src_terminal = next(e for e in source if e["type"] == "response.completed")
    assert completed.response_id == src_terminal["response"]["id"]


def test_llamacpp_gains_sequence_numbers_indexes_and_logprobs() -> None:
    """llama.cpp sends no ``sequence_number``, ``output_index``, ``content_index`` or
    ``logprobs``, a minimal Response object and usage without ``output_tokens_details``:
    the output has all of them, and keeps llama.cpp's ids and text."""
    raw = read_fixture("llamacpp-gemma270m-responses-stream.sse")
    source = data_events(raw)
    assert not any("sequence_number" in e or "output_index" in e for e in source)
    assert not any("logprobs" in e for e in source if e["type"].endswith("output_text.delta"))
    events = data_events(normalise_bytes(raw))
    for event in events:
        assert isinstance(event["sequence_number"], int)
        if "item_id" in event or event["type"].startswith("response.output_item"):
            assert event["output_index"] == 0
        if event["type"].startswith(("response.output_text", "response.content_part")):
            assert event["content_index"] == 0
        if event["type"] in ("response.output_text.delta", "response.output_text.done"):
            assert event["logprobs"] == []
    created = events[0]["response"]
    assert created["id"] == "resp_3D7L8F5g9xkg6HUHggHRsVjQVVR0E9z9"
    for key, value in {
        "object": "response",
        "created_at": NOW,  # llama.cpp sent none: the injected clock
        "output": [],
        "tools": [],
        "parallel_tool_calls": True,
        "usage": None,
        "metadata": {},
    }.items():
        assert created[key] == value, key
    terminal = events[-1]["response"]
    usage = terminal["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (27, 40, 67)
    assert usage["input_tokens_details"]["cached_tokens"] == 22
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}  # llama.cpp sent none
    assert terminal["output"][0]["id"] == "msg_N28vVOEU5DBY1VuUppGvTXhEoO0LBCFG"
    assert terminal["completed_at"] == NOW


def test_openrouter_terminal_output_keeps_the_streamed_ids() -> None:
    """OpenRouter re-mints reasoning ids in its terminal snapshot (``rs_tmp_…``) and ends with a
    ``[DONE]`` Responses clients do not expect: the output's terminal items are the streamed
    ones (Codex pairs history by id) and no ``[DONE]`` is forwarded."""
    raw = read_fixture("pydantic-ai-openrouter-responses-dataonly-stream.sse")
    source = data_events(raw)
    src_done = {e["item"]["id"] for e in source if e["type"] == "response.output_item.done"}
    src_final = {item["id"] for item in source[-1]["response"]["output"]}
    assert src_done != src_final  # the quirk is really in the fixture
    out = normalise_bytes(raw)
    assert b"[DONE]" not in out
    terminal = data_events(out)[-1]["response"]
    assert [item["id"] for item in terminal["output"]] == [
        "rs_tmp_2kbe7x16sax",
        "msg_tmp_8cjof4f6zpw",
    ]
    # The upstream's own terminal message is kept, completed like the streamed parts.
    assert terminal["output"][1]["content"][0]["logprobs"] == []


def test_error_fixture_becomes_error_then_failed() -> None:
    """OpenAI's mid-stream ``error`` + ``response.failed``: one error event carrying the nested
    and the flat fields, then one ``response.failed`` with the upstream code."""
    events = data_events(normalise_bytes(read_fixture("vercel-ai-responses-error-stream.sse")))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    error = events[2]
    assert error["error"]["code"] == error["code"] == "insufficient_quota"
    assert error["error"]["type"] == "insufficient_quota"
    assert error["error"]["message"] == error["message"]
    failed = events[3]["response"]
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "insufficient_quota"


# -- synthetic upstreams ---------------------------------------------------------------------


def _created(response_id: str = "resp_up") -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": response_id, "status": "in_progress"}}


def _completed(output: list[Any] | None = None, **fields: Any) -> dict[str, Any]:
    response = {"id": "resp_up", "status": "completed", "output": output or [], **fields}
    return {"type": "response.completed", "response": response}


def _message_events(item_id: str | None, text: str) -> list[dict[str, Any]]:
    """A bare message, the way a minimal server streams it (no indexes, maybe no ids)."""
    ids = {"item_id": item_id} if item_id else {}
    item: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
    if item_id:
        item["id"] = item_id
    part = {"type": "output_text", "text": text}
    return [
        {"type": "response.output_item.added", "item": item},
        {"type": "response.content_part.added", **ids, "part": {"type": "output_text", "text": ""}},
        {"type": "response.output_text.delta", **ids, "delta": text},
        {"type": "response.output_text.done", **ids, "text": text},
        {"type": "response.content_part.done", **ids, "part": part},
        {"type": "response.output_item.done", "item": {**item, "content": [part]}},
    ]


def test_items_without_ids_get_one_id_each() -> None:
    """A server that sends no item ids at all: each item gets one minted id, used by its added,
    delta and done events alike, and the terminal output carries the same ids — never a
    second item for the id-less done event."""
    upstream = [
        _created(),
        *_message_events(None, "one"),
        *_message_events(None, "two"),
        _completed([{"type": "message", "content": []}]),
    ]
    events = normalise(upstream)
    raw = encode(events)
    assert_conformant(raw)
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert len(added) == len(set(added)) == 2
    _, final = sdk_responses_stream(raw)
    assert [item.id for item in final.output] == added
    assert final.output_text == "onetwo"


def test_upstream_output_indexes_are_renumbered_consistently() -> None:
    """An upstream counting ``output_index`` from 1 (or with gaps): added events and every
    event of the item are renumbered together, so the SDK finds each item at its position."""
    upstream: list[dict[str, Any]] = [_created()]
    for index, (item_id, text) in enumerate([("msg_a", "A"), ("msg_b", "B")], start=1):
        for event in _message_events(item_id, text):
            event["output_index"] = index * 2
            event.setdefault("content_index", 0)
            upstream.append(event)
    upstream.append(_completed())
    raw = encode(normalise(upstream))
    events = assert_conformant(raw)
    assert {e["output_index"] for e in events if e.get("item_id") == "msg_b"} == {1}
    _, final = sdk_responses_stream(raw)
    assert final.output_text == "AB"


def test_function_call_arguments_done_gains_the_name() -> None:
    """The SDK type requires ``name`` on ``function_call_arguments.done``; the live API
    omits it. It is filled from the item."""
    item = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_time"}
    upstream = [
        _created(),
        {"type": "response.output_item.added", "item": {**item, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": "{}"},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "arguments": "{}"},
        {"type": "response.output_item.done", "item": {**item, "arguments": "{}"}},
        _completed(),
    ]
    events = normalise(upstream)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["name"] == "get_time"
    _, final = sdk_responses_stream(encode(events))
    assert [(c.call_id, c.name, c.arguments) for c in final.output] == [
        ("call_1", "get_time", "{}")
    ]


def test_first_event_not_created_gets_a_synthesized_created() -> None:
    """A stream that starts with an item: ``response.created`` is synthesized (minted id,
    injected clock) so the SDK's first-event rule holds."""
    upstream = [*_message_events("msg_1", "hi"), _completed()]
    upstream[-1]["response"].pop("id")
    events = normalise(upstream)
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["id"] == "resp_0001"
    assert events[0]["response"]["created_at"] == NOW
    _, final = sdk_responses_stream(encode(events))
    assert final.output_text == "hi"


def test_partial_usage_becomes_null() -> None:
    """Usage without the three totals is unknown: ``null``, never a partial object."""
    events = normalise([_created(), _completed(usage={"input_tokens": 3})])
    assert events[-1]["response"]["usage"] is None


def test_incomplete_is_a_terminal_with_status_incomplete() -> None:
    """``response.incomplete`` passes as the one terminal; ``completed_at`` stays unset."""
    response = {"id": "resp_up", "incomplete_details": {"reason": "max_output_tokens"}}
    upstream = [
        _created(),
        *_message_events("msg_1", "trunc")[:3],
        {"type": "response.incomplete", "response": response},
    ]
    events = normalise(upstream)
    terminal = events[-1]
    assert terminal["type"] == "response.incomplete"
    assert terminal["response"]["status"] == "incomplete"
    assert terminal["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert terminal["response"]["completed_at"] is None
    events_seen, _ = sdk_responses_stream(encode(events), final=False)
    assert events_seen[-1].type == "response.incomplete"


def test_stream_without_terminal_ends_with_response_failed() -> None:
    """The upstream stops mid-item: ``response.failed`` with ``server_error``; the
    items finished so far are in its output."""
    upstream = [_created(), *_message_events("msg_1", "done"), *_message_events("msg_2", "ha")[:3]]
    events = normalise(upstream)
    terminal = events[-1]
    assert terminal["type"] == "response.failed"
    assert terminal["response"]["error"]["code"] == "server_error"
    assert [item["id"] for item in terminal["response"]["output"]] == ["msg_1"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_error_event_without_failed_ends_with_that_error() -> None:
    """An ``error`` event and then nothing: the closing ``response.failed`` carries the error's
    own code (context length here), not a generic one."""
    error = {"type": "error", "code": 400, "message": "request exceeds the available context size"}
    events = normalise([_created(), error])
    assert [e["type"] for e in events] == ["response.created", "error", "response.failed"]
    assert events[1]["code"] == "context_length_exceeded"
    assert events[2]["response"]["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param({"error": {"type": "server_error", "code": "overloaded", "message": "m"}},
                     id="nested"),
        pytest.param({"code": "overloaded", "message": "m", "param": None}, id="flat"),
    ],
)  # fmt: skip
def test_checklist_22_nested_and_flat_error_events_read_alike(error: dict[str, Any]) -> None:
    """The nested (live API) and flat (API reference) error events give the same error event
    out, with both spellings filled; the flat event's own ``type`` is not the error's type."""
    events = normalise([_created(), {"type": "error", **error}])
    out = events[1]
    assert out["code"] == out["error"]["code"] == "overloaded"
    assert out["message"] == out["error"]["message"] == "m"
    assert out["error"]["type"] == "server_error"
    assert events[2]["response"]["error"] == {"code": "overloaded", "message": "m"}


def test_fail_emits_error_and_response_failed_once() -> None:
    """``fail(ApiError)`` after some output: an ``error`` event, then ``response.failed``;
    nothing after, whatever is fed or closed later."""
    normaliser = ResponsesNormaliser(context())
    out: list[dict[str, Any]] = []
    for event in [_created(), *_message_events("msg_1", "x")[:3]]:
        out += normaliser.feed(event)
    out += normaliser.fail(ApiError(message="reset", code="upstream_reset", status=502))
    assert [e["type"] for e in out[-2:]] == ["error", "response.failed"]
    assert out[-1]["response"]["error"] == {"code": "upstream_reset", "message": "reset"}
    assert normaliser.finished and normaliser.error is not None
    assert normaliser.feed(_completed()) == []
    assert normaliser.close() == []
    assert normaliser.fail(ApiError(message="again")) == []
    assert [e["sequence_number"] for e in out] == list(range(len(out)))


def test_nothing_after_the_terminal_event() -> None:
    """Events after the terminal (and a second terminal) are not forwarded."""
    upstream = [_created(), _completed(), *_message_events("msg_late", "late"), _completed()]
    events = normalise(upstream)
    assert [e["type"] for e in events] == ["response.created", "response.completed"]


def test_event_type_with_a_line_break_is_not_forwarded() -> None:
    """An unknown event type is passed through (new OpenAI events must reach clients), but one
    whose type holds a line break would corrupt the SSE framing of everything after it."""
    upstream = [
        _created(),
        {"type": "response.future_event", "detail": 1},
        {"type": "x\ndata: {}", "detail": 2},
        *_message_events("msg_1", "ok"),
        _completed(),
    ]
    raw = encode(normalise(upstream))
    events = assert_conformant(raw)
    assert "response.future_event" in [e["type"] for e in events]
    _, final = sdk_responses_stream(raw)
    assert final.output_text == "ok"


def test_failed_without_its_own_error_keeps_the_error_event_code() -> None:
    """``error`` then a ``response.failed`` whose response has no ``error``: the failed
    response carries the error event's code (Codex decides on it whether to retry), not a
    generic ``server_error``."""
    error = {"code": "context_length_exceeded", "message": "Input too long."}
    upstream = [
        _created(),
        {"type": "error", "error": error},
        {"type": "response.failed", "response": {"id": "resp_up"}},
    ]
    events = normalise(upstream)
    assert [e["type"] for e in events] == ["response.created", "error", "response.failed"]
    assert events[-1]["response"]["error"] == error


def test_checklist_09_an_item_left_open_is_closed_when_the_next_one_starts() -> None:
    """OpenRouter sends the reasoning item's done events after the message that follows it.
    The normaliser closes the reasoning from what streamed when the message is added, drops the
    late events, and keeps what only they carried (encrypted_content) in the terminal output."""
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    text_part = {"type": "output_text", "text": "4", "annotations": [], "logprobs": []}
    late_reasoning = dict(
        reasoning,
        content=[{"type": "reasoning_text", "text": "2+2"}],
        encrypted_content="opaque",
    )
    upstream = [
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
        {"type": "response.output_item.added", "item": reasoning},
        {
            "type": "response.content_part.added",
            "item_id": "rs_1",
            "part": {"type": "reasoning_text", "text": ""},
        },
        {"type": "response.reasoning_text.delta", "item_id": "rs_1", "delta": "2+"},
        {"type": "response.reasoning_text.delta", "item_id": "rs_1", "delta": "2"},
        {"type": "response.output_item.added", "item": message},
        {"type": "response.content_part.added", "item_id": "msg_1", "part": dict(text_part)},
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "4"},
        {"type": "response.output_item.done", "item": dict(message, content=[text_part])},
        {"type": "response.reasoning_text.done", "item_id": "rs_1", "text": "2+2"},
        {"type": "response.output_item.done", "item": late_reasoning},
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}},
    ]
    events = normalise(upstream)
    done = [(e["output_index"], e["item"]["id"]) for e in events if e["type"].endswith("item.done")]
    assert done == [(0, "rs_1"), (1, "msg_1")]
    first_message_event = next(
        i for i, e in enumerate(events) if e.get("item", {}).get("id") == "msg_1"
    )
    reasoning_events = [i for i, e in enumerate(events) if e.get("item_id") == "rs_1"]
    assert max(reasoning_events) < first_message_event
    closed = next(e for e in events if e["type"] == "response.reasoning_text.done")
    assert closed["text"] == "2+2"
    terminal = events[-1]
    assert [item["id"] for item in terminal["response"]["output"]] == ["rs_1", "msg_1"]
    assert terminal["response"]["output"][0]["encrypted_content"] == "opaque"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_checklist_08_arguments_sent_only_in_done_get_a_delta() -> None:
    """LM Studio streams no argument deltas; clients that build arguments from deltas get one."""
    call = {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "f", "arguments": ""}
    upstream = [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "item": call},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "arguments": "{}"},
        {"type": "response.output_item.done", "item": dict(call, arguments="{}")},
        {"type": "response.completed", "response": {"id": "resp_1"}},
    ]
    events = normalise(upstream)
    kinds = [e["type"] for e in events if "arguments" in e["type"]]
    assert kinds == [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ]
    assert next(e for e in events if e["type"].endswith("arguments.delta"))["delta"] == "{}"
