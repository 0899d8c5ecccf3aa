"""Every Responses stream event type the openai SDK knows, decided in both directions.

The list of types is read from the installed SDK at test time (the union behind
``ResponseStreamEvent``), so a new SDK release with a type nobody decided about fails
:func:`test_every_sdk_event_type_is_decided`. For each type the table below says what each
side does with it, and the tests check that this is what happens:

- toward a chat client (``ResponsesToChatStream``): ``translated`` types change the chunks,
  ``dropped`` ones leave them exactly as they are without the event;
- through the Responses normaliser: every type passes, renumbered; ``scoped`` types get the
  ``item_id``/``output_index`` of their item filled in, ``unscoped`` ones (the spec gives
  them no item id) are left as sent, ``own`` ones are built by the normaliser itself and are
  covered by ``test_normalise.py``;
- from a chat upstream (``ChatToResponsesStream``): whether llmitm ever emits the type.

The openai SDK's stream helpers judge every produced stream.
"""

from __future__ import annotations

import copy
import itertools
import json
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseStreamEvent

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.normalise import ResponsesNormaliser
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.stream_to_chat import (
    DONE,
    DROPPED_EVENTS,
    TRANSLATED_EVENTS,
    ResponsesToChatStream,
)
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import REASONING_MODES
from llmitm.wire.objects import response_object
from tests.helpers.oracle import sdk_chat_stream, sdk_responses_stream

NOW = 1_700_000_000
ITEM_ID = "it_1"

# type → (toward chat, normaliser, emitted from a chat upstream)
DECISIONS: dict[str, tuple[str, str, bool]] = {
    "response.created": ("dropped", "own", True),
    "response.in_progress": ("dropped", "own", True),
    "response.queued": ("dropped", "own", False),
    "response.completed": ("translated", "own", True),
    "response.incomplete": ("translated", "own", True),
    "response.failed": ("translated", "own", True),
    "error": ("translated", "own", True),
    "response.output_item.added": ("translated", "own", True),
    "response.output_item.done": ("translated", "own", True),
    "response.content_part.added": ("dropped", "scoped", True),
    "response.content_part.done": ("dropped", "scoped", True),
    "response.output_text.delta": ("translated", "scoped", True),
    "response.output_text.done": ("translated", "scoped", True),
    "response.output_text.annotation.added": ("dropped", "scoped", False),
    "response.refusal.delta": ("translated", "scoped", True),
    "response.refusal.done": ("translated", "scoped", True),
    "response.reasoning_summary_part.added": ("dropped", "scoped", True),
    "response.reasoning_summary_part.done": ("dropped", "scoped", True),
    "response.reasoning_summary_text.delta": ("translated", "scoped", True),
    "response.reasoning_summary_text.done": ("translated", "scoped", True),
    "response.reasoning_text.delta": ("translated", "scoped", False),
    "response.reasoning_text.done": ("translated", "scoped", False),
    "response.function_call_arguments.delta": ("translated", "scoped", True),
    "response.function_call_arguments.done": ("translated", "scoped", True),
    "response.custom_tool_call_input.delta": ("translated", "scoped", True),
    "response.custom_tool_call_input.done": ("translated", "scoped", True),
    "response.audio.delta": ("dropped", "unscoped", False),
    "response.audio.done": ("dropped", "unscoped", False),
    "response.audio.transcript.delta": ("dropped", "unscoped", False),
    "response.audio.transcript.done": ("dropped", "unscoped", False),
    "response.code_interpreter_call_code.delta": ("dropped", "scoped", False),
    "response.code_interpreter_call_code.done": ("dropped", "scoped", False),
    "response.code_interpreter_call.completed": ("dropped", "scoped", False),
    "response.code_interpreter_call.in_progress": ("dropped", "scoped", False),
    "response.code_interpreter_call.interpreting": ("dropped", "scoped", False),
    "response.compaction.compacting": ("dropped", "scoped", False),
    "response.file_search_call.completed": ("dropped", "scoped", False),
    "response.file_search_call.in_progress": ("dropped", "scoped", False),
    "response.file_search_call.searching": ("dropped", "scoped", False),
    "response.web_search_call.completed": ("dropped", "scoped", False),
    "response.web_search_call.in_progress": ("dropped", "scoped", False),
    "response.web_search_call.searching": ("dropped", "scoped", False),
    "response.image_generation_call.completed": ("dropped", "scoped", False),
    "response.image_generation_call.generating": ("dropped", "scoped", False),
    "response.image_generation_call.in_progress": ("dropped", "scoped", False),
    "response.image_generation_call.partial_image": ("dropped", "scoped", False),
    "response.mcp_call_arguments.delta": ("dropped", "scoped", False),
    "response.mcp_call_arguments.done": ("dropped", "scoped", False),
    "response.mcp_call.completed": ("dropped", "scoped", False),
    "response.mcp_call.failed": ("dropped", "scoped", False),
    "response.mcp_call.in_progress": ("dropped", "scoped", False),
    "response.mcp_list_tools.completed": ("dropped", "scoped", False),
    "response.mcp_list_tools.failed": ("dropped", "scoped", False),
    "response.mcp_list_tools.in_progress": ("dropped", "scoped", False),
    "response.shell_call_command.added": ("dropped", "unscoped", False),
    "response.shell_call_command.delta": ("dropped", "unscoped", False),
    "response.shell_call_command.done": ("dropped", "unscoped", False),
    "response.shell_call_output_content.delta": ("dropped", "scoped", False),
    "response.shell_call_output_content.done": ("dropped", "scoped", False),
}


def sdk_event_models() -> dict[str, Any]:
    """Each event type of the installed SDK's ``ResponseStreamEvent`` union → its model."""
    union = typing.get_args(ResponseStreamEvent)[0]  # Annotated[Union[...], discriminator]
    models = {}
    for model in typing.get_args(union):
        (event_type,) = typing.get_args(model.model_fields["type"].annotation)
        models[event_type] = model
    return models


SDK_EVENTS = sdk_event_models()


def context(mode: str = "think-tags") -> TranslationContext:
    options = TranslateOptions(reasoning=mode, ids=CountingIds(), clock=fixed_clock(NOW))  # type: ignore[arg-type]
    return TranslationContext(options=options, model="m")


# -- building streams around one event ----------------------------------------------------------

# The output item an event belongs to, by the event type's prefix (longest match first).
_HOSTS: list[tuple[str, dict[str, Any]]] = [
    ("response.reasoning", {"type": "reasoning", "summary": []}),
    ("response.function_call", {"type": "function_call", "call_id": "c1", "name": "f"}),
    ("response.custom_tool_call", {"type": "custom_tool_call", "call_id": "c1", "name": "f"}),
    ("response.mcp_call", {"type": "mcp_call", "server_label": "s", "name": "t"}),
    ("response.mcp_list_tools", {"type": "mcp_list_tools", "server_label": "s", "tools": []}),
    (
        "response.web_search_call",
        {"type": "web_search_call", "status": "in_progress", "action": {"type": "search"}},
    ),
    ("response.file_search_call", {"type": "file_search_call", "status": "in_progress"}),
    (
        "response.code_interpreter_call",
        {"type": "code_interpreter_call", "status": "in_progress", "container_id": "c"},
    ),
    ("response.image_generation_call", {"type": "image_generation_call", "status": "in_progress"}),
    ("response.shell_call", {"type": "shell_call", "call_id": "c1", "status": "in_progress"}),
    ("response.compaction", {"type": "compaction", "encrypted_content": "e"}),
]
_MESSAGE = {"type": "message", "role": "assistant", "status": "in_progress", "content": []}

_FIELD_SAMPLES: dict[str, Any] = {
    "delta": "x",
    "text": "x",
    "refusal": "x",
    "arguments": "{}",
    "input": "x",
    "code": "x",
    "command": "ls",
    "message": "boom",
    "partial_image_b64": "AAAA",
    "logprobs": [],
    "output": [],
    "annotation": {
        "type": "url_citation",
        "start_index": 0,
        "end_index": 1,
        "title": "t",
        "url": "https://example.com/",
    },
}


def host_item(event_type: str) -> dict[str, Any]:
    for prefix, item in _HOSTS:
        if event_type.startswith(prefix):
            return {"id": ITEM_ID, **copy.deepcopy(item)}
    return {"id": ITEM_ID, **copy.deepcopy(_MESSAGE)}


def sample(event_type: str) -> dict[str, Any]:
    """An event of ``event_type`` with every field the SDK requires, for item 0."""
    event: dict[str, Any] = {"type": event_type, "sequence_number": 0}
    for name, field in SDK_EVENTS[event_type].model_fields.items():
        if name in event or not field.is_required():
            continue
        if name == "item_id":
            event[name] = ITEM_ID
        elif name == "output_index" or name.endswith("_index"):
            event[name] = 0
        elif name == "part":
            summary = event_type.startswith("response.reasoning_summary")
            event[name] = (
                {"type": "summary_text", "text": ""}
                if summary
                else {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            )
        elif event_type == "response.shell_call_output_content.delta" and name == "delta":
            event[name] = {"stdout": "x"}
        elif name == "response":
            event[name] = response("in_progress")
        else:
            event[name] = copy.deepcopy(_FIELD_SAMPLES[name])
    return event


def response(status: str, output: list[Any] | None = None) -> dict[str, Any]:
    body = response_object(response_id="resp_1", created_at=NOW, model="m", status=status)
    body["output"] = output or []
    return body


def around(event_type: str, event: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A conformant stream whose one item hosts ``event`` (left out when ``None``)."""
    item = host_item(event_type)
    done = {**item, "status": "completed"}
    inner: list[dict[str, Any]] = []
    if item["type"] == "message":
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        ids = {"item_id": ITEM_ID, "output_index": 0, "content_index": 0}
        inner = [
            {"type": "response.content_part.added", **ids, "part": part},
            {"type": "response.output_text.delta", **ids, "delta": "hi", "logprobs": []},
        ]
        done["content"] = [{**part, "text": "hi"}]
    events = [
        {"type": "response.created", "response": response("in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        *inner,
        *([event] if event is not None else []),
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {"type": "response.completed", "response": response("completed", [done])},
    ]
    for seq, each in enumerate(events):
        each["sequence_number"] = seq
    return events


def to_chat(events: list[dict[str, Any]], mode: str = "think-tags") -> list[Any]:
    stream = ResponsesToChatStream(context(mode))
    frames: list[Any] = []
    for event in copy.deepcopy(events):
        frames += stream.feed(event)
    return frames + stream.close()


def encode_chat(frames: list[Any]) -> bytes:
    return b"".join(
        b"data: [DONE]\n\n" if f == DONE else b"data: " + json.dumps(f).encode() + b"\n\n"
        for f in frames
    )


def encode_responses(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def normalise(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    normaliser = ResponsesNormaliser(context())
    out: list[dict[str, Any]] = []
    for event in copy.deepcopy(events):
        out += normaliser.feed(event)
    return out + normaliser.close()


def deltas(frames: list[Any]) -> list[dict[str, Any]]:
    return [
        f["choices"][0]["delta"]
        for f in frames
        if isinstance(f, dict) and f.get("choices") and "error" not in f
    ]


def joined(frames: list[Any], name: str) -> str:
    return "".join(d.get(name) or "" for d in deltas(frames))


def sdk_types(decided: Any) -> list[str]:
    """The types the installed SDK models whose (chat, normaliser) decision passes ``decided``."""
    return sorted(
        t for t, (chat, norm, _) in DECISIONS.items() if t in SDK_EVENTS and decided(chat, norm)
    )


# -- the decision table ---------------------------------------------------------------------------


@pytest.mark.parametrize("event_type", sorted(SDK_EVENTS))
def test_every_sdk_event_type_is_decided(event_type: str) -> None:
    """A type the installed SDK knows but this table does not is a decision still to make."""
    assert event_type in DECISIONS, f"decide what llmitm does with {event_type}"
    chat, _, _ = DECISIONS[event_type]
    # The translator's own lists agree with the table, and never overlap.
    assert (event_type in TRANSLATED_EVENTS) == (chat == "translated")
    assert (event_type in DROPPED_EVENTS) == (chat == "dropped")


def test_the_table_and_the_translator_list_the_same_types() -> None:
    """An older SDK may lack a type listed here; llmitm still decides it (servers send it)."""
    assert set(DECISIONS) == TRANSLATED_EVENTS | DROPPED_EVENTS
    assert not TRANSLATED_EVENTS & DROPPED_EVENTS


@pytest.mark.parametrize("event_type", sdk_types(lambda chat, _: chat == "dropped"))
def test_a_dropped_event_changes_nothing_for_a_chat_client(event_type: str) -> None:
    with_event = to_chat(around(event_type, sample(event_type)))
    assert with_event == to_chat(around(event_type, None))
    final, _ = sdk_chat_stream(encode_chat(with_event))
    assert final.choices[0].finish_reason in ("stop", "tool_calls")


@pytest.mark.parametrize("event_type", sdk_types(lambda _, norm: norm in ("scoped", "unscoped")))
def test_the_normaliser_passes_every_item_event(event_type: str) -> None:
    """Sent complete, the event comes out unchanged but for its place in the numbering."""
    source = around(event_type, sample(event_type))
    out = normalise(source)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    # The last of its type is the sampled one (a message host streams a part of its own).
    passed = [e for e in out if e["type"] == event_type][-1]
    expected = [e for e in source if e["type"] == event_type][-1]
    # The normaliser names a function call in its arguments' done event, as OpenAI does.
    named = {"name": "f"} if event_type == "response.function_call_arguments.done" else {}
    assert {**passed, "sequence_number": 0} == {**expected, **named, "sequence_number": 0}
    events, final = sdk_responses_stream(encode_responses(out))
    assert event_type in [e.type for e in events]
    assert final.id == "resp_1"


@pytest.mark.parametrize("event_type", sdk_types(lambda _, norm: norm in ("scoped", "unscoped")))
def test_the_normaliser_fills_ids_only_where_the_spec_has_them(event_type: str) -> None:
    """A llama.cpp-style event without ids: item events get their item's, the others none."""
    bare = sample(event_type)
    for key in ("item_id", "output_index", "sequence_number"):
        bare.pop(key, None)
    source = around(event_type, bare)
    source[-1]["response"]["output"] = []  # leave the output to the streamed items
    out = normalise(source)
    passed = [e for e in out if e["type"] == event_type][-1]
    if DECISIONS[event_type][1] == "scoped":
        assert (passed["item_id"], passed["output_index"]) == (ITEM_ID, 0)
    else:
        assert "item_id" not in passed
        assert "output_index" not in passed or "output_index" in SDK_EVENTS[event_type].model_fields
    events, final = sdk_responses_stream(encode_responses(out))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output[0].id == ITEM_ID


def test_chat_upstreams_produce_exactly_the_types_marked_emitted() -> None:
    """Across text, refusal, reasoning, function and custom calls, cuts and errors, the types
    the chat → Responses translator emits are the ones the table says it does."""

    def translation_context() -> TranslationContext:
        """What the request translator tells the stream translator: f and a custom tool."""
        request = {
            "model": "m",
            "input": "hi",
            "stream": True,
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}},
                {"type": "custom", "name": "apply_patch"},
            ],
        }
        options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(NOW))
        return responses_request_to_chat(request, options).context

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": NOW,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    def call(index: int, name: str, arguments: str) -> dict[str, Any]:
        function = {"name": name, "arguments": arguments}
        return {"tool_calls": [{"index": index, "id": f"call_{index}", "function": function}]}

    streams = [
        [
            chunk({"role": "assistant", "reasoning_content": "think"}),
            chunk({"content": "hi"}),
            chunk({"refusal": "no"}),
            chunk(call(0, "f", "{}")),
            chunk(call(1, "apply_patch", '{"input":"x"}')),
            chunk({}, "tool_calls"),
            b"data: [DONE]\n\n",
        ],
        [chunk({"content": "cut"}), chunk({}, "length"), b"data: [DONE]\n\n"],
        [chunk({"content": "broken"})],  # ends without a finish: failed
        [b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n'],
    ]
    emitted: set[str] = set()
    for chunks in streams:
        pipeline = StreamPipeline("chat-to-responses", translation_context())
        raw = pipeline.start() + b"".join(pipeline.feed(c) for c in chunks) + pipeline.close()
        events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
        emitted |= {e["type"] for e in events}
    assert emitted == {t for t, (_, _, from_chat) in DECISIONS.items() if from_chat}


# -- what the translated types do toward a chat client ---------------------------------------


def test_refusal_deltas_become_chat_refusal_deltas() -> None:
    events = around("response.refusal.delta", sample("response.refusal.delta"))
    frames = to_chat(events)
    assert joined(frames, "refusal") == "x"
    final, _ = sdk_chat_stream(encode_chat(frames))
    assert final.choices[0].message.refusal == "x"
    assert final.choices[0].message.content == "hi"


@pytest.mark.parametrize("mode", REASONING_MODES)
@pytest.mark.parametrize(
    "event_type", ["response.reasoning_summary_text.delta", "response.reasoning_text.delta"]
)
def test_reasoning_deltas_take_the_configured_rendering(event_type: str, mode: str) -> None:
    event = {**sample(event_type), "delta": "pondering"}
    frames = to_chat(around(event_type, event), mode)
    final, _ = sdk_chat_stream(encode_chat(frames))
    message = final.choices[0].message
    if mode == "drop":
        assert "pondering" not in json.dumps(frames)
    elif mode == "think-tags":
        assert message.content == "<think>\npondering\n</think>\n\n"
    else:
        assert joined(frames, mode) == "pondering"
        assert getattr(message, mode) == "pondering"


DONE_ONLY = {
    "response.output_text.done": ("message", "content", "text"),
    "response.refusal.done": ("message", "refusal", "refusal"),
    "response.reasoning_summary_text.done": ("reasoning", "reasoning_content", "text"),
    "response.reasoning_text.done": ("reasoning", "reasoning_content", "text"),
}


def done_only_stream(event_type: str, value: str, with_delta: bool) -> list[dict[str, Any]]:
    """An item whose text is in ``event_type`` (and a matching delta when ``with_delta``),
    never in its ``output_item.done``: some servers stream that way."""
    kind, _, field = DONE_ONLY[event_type]
    item = {"id": ITEM_ID, **(copy.deepcopy(_MESSAGE) if kind == "message" else {})}
    item.setdefault("type", "reasoning")
    item.setdefault("summary", [])
    ids = {"item_id": ITEM_ID, "output_index": 0}
    ids |= {"summary_index": 0} if "summary" in event_type else {"content_index": 0}
    delta_type = event_type.removesuffix(".done") + ".delta"
    events = [
        {"type": "response.created", "response": response("in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        *([{"type": delta_type, **ids, "delta": value, "logprobs": []}] if with_delta else []),
        {"type": event_type, **ids, field: value, "logprobs": []},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response("completed", [item])},
    ]
    for seq, each in enumerate(events):
        each["sequence_number"] = seq
    return events


@pytest.mark.parametrize("event_type", sorted(DONE_ONLY))
def test_a_done_event_carries_text_only_when_no_delta_did(event_type: str) -> None:
    _, chat_field, _ = DONE_ONLY[event_type]
    ctx_mode = "reasoning_content"
    only_done = to_chat(done_only_stream(event_type, "said once", False), ctx_mode)
    after_delta = to_chat(done_only_stream(event_type, "said once", True), ctx_mode)
    for frames in (only_done, after_delta):
        assert joined(frames, chat_field) == "said once"
        final, _ = sdk_chat_stream(encode_chat(frames))
        assert getattr(final.choices[0].message, chat_field) == "said once"


def test_summary_parts_sent_only_in_done_events_stay_separate() -> None:
    events = done_only_stream("response.reasoning_summary_text.done", "one", False)
    second = {**events[2], "summary_index": 1, "text": "two"}
    events.insert(3, second)
    frames = to_chat(events, "reasoning_content")
    assert joined(frames, "reasoning_content") == "one\n\ntwo"


def call_stream(kind: str, deltas_: list[str], done: dict[str, Any]) -> list[dict[str, Any]]:
    stem = {
        "function_call": "response.function_call_arguments",
        "custom_tool_call": "response.custom_tool_call_input",
    }[kind]
    item = {"id": ITEM_ID, "type": kind, "call_id": "c1", "name": "f", "status": "in_progress"}
    ids = {"item_id": ITEM_ID, "output_index": 0}
    events = [
        {"type": "response.created", "response": response("in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        *({"type": f"{stem}.delta", **ids, "delta": d} for d in deltas_),
        {"type": f"{stem}.done", **ids, **done},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response("completed", [item])},
    ]
    for seq, each in enumerate(events):
        each["sequence_number"] = seq
    return events


@pytest.mark.parametrize(
    ("kind", "deltas_", "done", "arguments"),
    [
        ("function_call", [], {"arguments": '{"a":1}'}, '{"a":1}'),
        ("function_call", ['{"a"', ":1}"], {"arguments": '{"a":1}'}, '{"a":1}'),
        ("custom_tool_call", [], {"input": 'say "hi"'}, '{"input":"say \\"hi\\""}'),
        ("custom_tool_call", ["say ", '"hi"'], {"input": 'say "hi"'}, '{"input":"say \\"hi\\""}'),
    ],
    ids=["function-done-only", "function-deltas", "custom-done-only", "custom-deltas"],
)
def test_call_arguments_are_sent_once_from_deltas_or_the_done_event(
    kind: str, deltas_: list[str], done: dict[str, Any], arguments: str
) -> None:
    """Custom tools are declared to a chat client as functions taking ``{"input": …}`` (as
    the request translator maps them), so their raw input arrives as those arguments."""
    frames = to_chat(call_stream(kind, deltas_, done))
    final, _ = sdk_chat_stream(encode_chat(frames))
    (call,) = final.choices[0].message.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == ("c1", "f", arguments)
    assert final.choices[0].finish_reason == "tool_calls"


def test_queued_before_created_starts_the_chat_stream_once() -> None:
    events = around("response.queued", None)
    queued = {"type": "response.queued", "response": response("queued"), "sequence_number": 0}
    frames = to_chat([queued, *events])
    roles = [d for d in deltas(frames) if d.get("role")]
    assert len(roles) == 1
    assert frames[0]["id"] == "chatcmpl-resp_1"
    final, _ = sdk_chat_stream(encode_chat(frames))
    assert final.choices[0].message.content == "hi"


# -- what the normaliser completes for an item the upstream leaves open -----------------------


def open_then_next(kind: str, inner: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Item 0 streams ``inner`` and is never closed; a message (item 1) follows."""
    item = host_item(kind) if kind != "message" else {"id": ITEM_ID, **copy.deepcopy(_MESSAGE)}
    message = {"id": "msg_2", **copy.deepcopy(_MESSAGE)}
    events = [
        {"type": "response.created", "response": response("in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        *inner,
        {"type": "response.output_item.added", "output_index": 1, "item": message},
        {"type": "response.output_item.done", "output_index": 1, "item": message},
        {"type": "response.completed", "response": response("completed")},
    ]
    for seq, each in enumerate(events):
        each["sequence_number"] = seq
    return events


@pytest.mark.parametrize(
    ("prefix", "stem", "field"),
    [
        ("response.custom_tool_call", "response.custom_tool_call_input", "input"),
        ("response.mcp_call", "response.mcp_call_arguments", "arguments"),
        ("response.function_call", "response.function_call_arguments", "arguments"),
    ],
)
def test_an_open_call_is_closed_with_what_streamed(prefix: str, stem: str, field: str) -> None:
    ids = {"item_id": ITEM_ID, "output_index": 0}
    inner = [{"type": f"{stem}.delta", **ids, "delta": d} for d in ('{"a"', ":1}")]
    out = normalise(open_then_next(prefix, inner))
    (done,) = [e for e in out if e["type"] == f"{stem}.done"]
    assert done[field] == '{"a":1}'
    item_done = next(e for e in out if e["type"] == "response.output_item.done")
    assert item_done["item"][field] == '{"a":1}'
    assert out[-1]["response"]["output"][0][field] == '{"a":1}'
    _, final = sdk_responses_stream(encode_responses(out))
    assert getattr(final.output[0], field) == '{"a":1}'


@pytest.mark.parametrize(
    ("stem", "field"),
    [
        ("response.custom_tool_call_input", "input"),
        ("response.mcp_call_arguments", "arguments"),
    ],
)
def test_input_only_in_the_done_event_gains_a_delta(stem: str, field: str) -> None:
    """As for function calls (LM Studio): done == concat(deltas) for streaming clients."""
    prefix = stem.removesuffix("_input").removesuffix("_arguments")
    events = around(prefix, {"type": f"{stem}.done", "item_id": ITEM_ID, field: "ls -l"})
    out = normalise(events)
    kinds = [e["type"] for e in out]
    assert kinds.index(f"{stem}.delta") == kinds.index(f"{stem}.done") - 1
    assert out[kinds.index(f"{stem}.delta")]["delta"] == "ls -l"
    sdk_responses_stream(encode_responses(out))


def test_an_open_message_keeps_its_annotations() -> None:
    ids = {"item_id": ITEM_ID, "output_index": 0, "content_index": 0}
    annotation = _FIELD_SAMPLES["annotation"]
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    inner = [
        {"type": "response.content_part.added", **ids, "part": part},
        {"type": "response.output_text.delta", **ids, "delta": "see", "logprobs": []},
        {"type": "response.output_text.annotation.added", **ids, "annotation": annotation},
    ]
    out = normalise(open_then_next("message", inner))
    (added,) = [e for e in out if e["type"] == "response.output_text.annotation.added"]
    assert added["annotation_index"] == 0  # filled: the upstream sent none
    (part_done,) = [e for e in out if e["type"] == "response.content_part.done"]
    assert part_done["part"]["annotations"] == [annotation]
    _, final = sdk_responses_stream(encode_responses(out))
    assert final.output[0].content[0].annotations[0].url == annotation["url"]
    assert final.output_text == "see"


# -- properties ------------------------------------------------------------------------------

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({cut % (len(text) + 1) for cut in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points) if b > a]


@PROPERTY
@given(
    event_type=st.sampled_from(sorted(DONE_ONLY)),
    text=st.text(min_size=1, max_size=40),
    cuts=st.lists(st.integers(0), max_size=5),
    streamed=st.booleans(),
)
def test_text_arrives_exactly_once_however_it_is_split(
    event_type: str, text: str, cuts: list[int], streamed: bool
) -> None:
    """Deltas in any split, or none at all: the chat client gets the done event's text once."""
    _, chat_field, _ = DONE_ONLY[event_type]
    events = done_only_stream(event_type, text, False)
    if streamed:
        delta = events[2]["type"].removesuffix(".done") + ".delta"
        ids = {key: events[2][key] for key in events[2] if key.endswith(("_id", "_index"))}
        pieces = [
            {"type": delta, **ids, "delta": piece, "logprobs": []} for piece in split(text, cuts)
        ]
        events[2:2] = pieces
    frames = to_chat(events, "reasoning_content")
    assert joined(frames, chat_field) == text
    final, _ = sdk_chat_stream(encode_chat(frames))
    assert getattr(final.choices[0].message, chat_field) == text


@PROPERTY
@given(text=st.text(max_size=40), cuts=st.lists(st.integers(0), max_size=5))
def test_custom_input_in_any_split_is_one_json_argument(text: str, cuts: list[int]) -> None:
    """The escaped fragments of a custom tool's input always add up to ``{"input": text}``."""
    frames = to_chat(call_stream("custom_tool_call", split(text, cuts), {"input": text}))
    final, _ = sdk_chat_stream(encode_chat(frames))
    (call,) = final.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"input": text}


@PROPERTY
@given(
    stem=st.sampled_from(["response.custom_tool_call_input", "response.mcp_call_arguments"]),
    text=st.text(min_size=1, max_size=40),
    cuts=st.lists(st.integers(0), max_size=5),
)
def test_an_open_call_closes_with_its_whole_input(stem: str, text: str, cuts: list[int]) -> None:
    prefix = stem.removesuffix("_input").removesuffix("_arguments")
    field = "input" if stem.endswith("_input") else "arguments"
    ids = {"item_id": ITEM_ID, "output_index": 0}
    inner = [{"type": f"{stem}.delta", **ids, "delta": piece} for piece in split(text, cuts)]
    out = normalise(open_then_next(prefix, inner))
    (done,) = [e for e in out if e["type"] == f"{stem}.done"]
    assert done[field] == text
    _, final = sdk_responses_stream(encode_responses(out))
    assert getattr(final.output[0], field) == text
