"""Property tests of the stream pipelines (hypothesis).

(a) Chunking never matters: any split of a real capture's bytes gives byte-identical output,
    in every direction that applies to it.
(b) chat → Responses → chat keeps text, reasoning, refusal, tool calls (ids, names, arguments),
    usage and the finish reason, as the openai SDK's chat stream helper accumulates them.
(c) Responses → chat → Responses keeps text, reasoning, function and custom tool calls (with
    namespaces), usage and the status, as the SDK's Responses stream helper sees them.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmitm.translate.context import ToolOrigin, TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import Direction
from tests.helpers.codex_parser import iter_sse, sse_json_events
from tests.helpers.oracle import sdk_chat_stream, sdk_responses_stream
from tests.translate.test_stream_to_responses import assert_conformant

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
NOW = 1_700_000_000

FAST = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def context(**fields: Any) -> TranslationContext:
    reasoning = fields.pop("reasoning", "reasoning_content")
    options = TranslateOptions(reasoning=reasoning, ids=CountingIds(), clock=fixed_clock(NOW))
    return TranslationContext(options, **fields)


def run(direction: Direction, chunks: list[bytes], ctx: TranslationContext | None = None) -> bytes:
    pipeline = StreamPipeline(direction, ctx or context(model="client-model", include_usage=True))
    out = [pipeline.start()]
    out += [pipeline.feed(piece) for piece in chunks]
    out.append(pipeline.close())
    assert pipeline.finished
    return b"".join(out)


# =============================================================================================
# (a) any split of any real stream, every direction
# =============================================================================================


def _fixture_cases() -> list[Any]:
    if not REAL.is_dir():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"{REAL} not present"))]
    cases = []
    for path in sorted(REAL.glob("*.sse")):
        api = json.loads(path.with_name(path.stem + ".meta.json").read_text())["api"]
        directions = (
            ["chat-to-responses"] if api == "chat" else ["responses-to-chat", "normalise-responses"]
        )
        for direction in directions:
            cases.append(pytest.param(path.name, direction, id=f"{path.stem}:{direction}"))
    return cases


@functools.cache
def _body(name: str) -> bytes:
    return (REAL / name).read_bytes()


@functools.cache
def _reference(name: str, direction: Direction) -> bytes:
    return run(direction, [_body(name)])


def _pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(body) + 1) for cut in cuts})
    bounds = [0, *points, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("name", "direction"), _fixture_cases())
@FAST
@given(data=st.data())
def test_any_split_of_a_real_stream_gives_identical_bytes(
    name: str, direction: Direction, data: st.DataObject
) -> None:
    """(a) However the upstream bytes are chunked (cuts anywhere, biased to line ends; LF,
    CRLF or CR line ends), the client gets exactly the same bytes (fixed ids and clock)."""
    body = _body(name)
    # JSON escapes line breaks inside strings, so every raw LF here is framing.
    body = body.replace(b"\n", data.draw(st.sampled_from([b"\n", b"\r\n", b"\r"]), label="eol"))
    line_ends = [i for i, byte in enumerate(body) if byte in b"\r\n"]
    near_line_end = st.sampled_from(line_ends).flatmap(
        lambda at: st.integers(at - 1, at + 2).map(lambda cut: max(cut, 0))
    )
    cuts = data.draw(st.lists(st.integers(0, len(body)) | near_line_end, max_size=30), label="cuts")
    assert run(direction, _pieces(body, cuts)) == _reference(name, direction)


@pytest.mark.parametrize(("name", "direction"), _fixture_cases())
def test_byte_at_a_time_gives_identical_bytes(name: str, direction: Direction) -> None:
    """(a) The extreme split: one byte per chunk."""
    body = _body(name)
    assert run(direction, [body[i : i + 1] for i in range(len(body))]) == _reference(
        name, direction
    )


def _normalise_cases() -> list[Any]:
    """Every real Responses capture, including OpenRouter's (reasoning closed after the
    message that follows it) and LM Studio's (arguments only in the done event)."""
    cases = [case for case in _fixture_cases() if case.values[1] == "normalise-responses"]
    return cases or _fixture_cases()


@pytest.mark.parametrize(("name", "direction"), _normalise_cases())
def test_normalised_real_responses_streams_are_conformant(name: str, direction: Direction) -> None:
    """The normaliser's output for every real Responses capture passes the same conformance checker
    as the chat→Responses translator's."""
    assert_conformant(sse_json_events(_reference(name, direction)))


# =============================================================================================
# (b) chat → Responses → chat
# =============================================================================================

_piece = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_name = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_-]{0,20}", fullmatch=True)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _piece,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_piece, inner, max_size=3),
    max_leaves=6,
)
_arguments = st.dictionaries(_piece, _json_value, max_size=4).map(json.dumps) | st.builds(
    lambda d: json.dumps(d, ensure_ascii=False), st.dictionaries(_piece, _json_value, max_size=3)
)
_count = st.integers(0, 10**6)


@st.composite
def _split(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` in one or more non-empty pieces."""
    cuts = draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=4, unique=True))
    bounds = [0, *sorted(c for c in cuts if c < len(text)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if text[a:b]]


@st.composite
def _usage(draw: st.DrawFn) -> dict[str, int] | None:
    if draw(st.booleans()):
        return None
    prompt, completion = draw(_count), draw(_count)
    return {
        "prompt": prompt,
        "completion": completion,
        "total": draw(st.just(prompt + completion) | _count),
        "cached": draw(st.integers(0, prompt)),
        "reasoning": draw(st.integers(0, completion)),
    }


@st.composite
def chat_streams(draw: st.DrawFn) -> dict[str, Any]:
    """A chat completion stream as its meaning plus the chunks that carry it."""
    reasoning = draw(st.lists(_piece, max_size=3))
    content = draw(st.lists(_piece, max_size=4))
    assume(not "".join(content).lstrip().startswith("<think>"))
    refusal = draw(st.lists(_piece, max_size=2)) if draw(st.integers(0, 4)) == 0 else []
    calls = []
    for index in range(draw(st.integers(0, 3))):
        arguments = draw(_arguments)
        call_id = f"call_{index}_{draw(st.from_regex(r'[A-Za-z0-9]{1,10}', fullmatch=True))}"
        calls.append((call_id, draw(_name), arguments, draw(_split(arguments))))
    finish = draw(st.sampled_from(["tool_calls", "length"] if calls else ["stop", "length"]))
    usage = draw(_usage())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": NOW,
            "model": "upstream",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": piece}) for piece in reasoning]
    chunks += [chunk({"content": piece}) for piece in content]
    chunks += [chunk({"refusal": piece}) for piece in refusal]
    for index, (call_id, name, _, pieces) in enumerate(calls):
        first = {"index": index, "id": call_id, "type": "function"}
        chunks.append(
            chunk({"tool_calls": [first | {"function": {"name": name, "arguments": ""}}]})
        )
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in pieces
        ]
    chunks.append(chunk({}, finish))
    if usage is not None:
        chunks.append(
            {
                "id": "chatcmpl-x",
                "object": "chat.completion.chunk",
                "created": NOW,
                "model": "upstream",
                "choices": [],
                "usage": {
                    "prompt_tokens": usage["prompt"],
                    "completion_tokens": usage["completion"],
                    "total_tokens": usage["total"],
                    "prompt_tokens_details": {"cached_tokens": usage["cached"]},
                    "completion_tokens_details": {"reasoning_tokens": usage["reasoning"]},
                },
            }
        )
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    text = "".join(content)
    refused = "".join(refusal)
    return {
        "body": body + b"data: [DONE]\n\n",
        # Whitespace-only content is held back (a <think> might follow): it never opens a
        # message of its own, but joins the message a refusal opens.
        "text": text if text.strip() or refused else "",
        "reasoning": "".join(reasoning),
        "refusal": refused,
        "calls": [(call_id, name, arguments) for call_id, name, arguments, _ in calls],
        "finish": finish,
        "usage": usage,
    }


def _sdk_chat_final(chat: bytes) -> Any:
    """The SDK chat stream helper's final completion; for finish_reason length it raises
    LengthFinishReasonError carrying the accumulated completion, which is what we compare."""
    try:
        completion, _ = sdk_chat_stream(chat)
    except openai.LengthFinishReasonError as error:
        completion = error.completion
    return completion


def _chat_usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    return {
        "prompt": usage.prompt_tokens,
        "completion": usage.completion_tokens,
        "total": usage.total_tokens,
        "cached": usage.prompt_tokens_details.cached_tokens,
        "reasoning": usage.completion_tokens_details.reasoning_tokens,
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=chat_streams(), cuts=st.lists(st.integers(0), max_size=6))
def test_chat_to_responses_to_chat_keeps_the_meaning(
    stream: dict[str, Any], cuts: list[int]
) -> None:
    """(b) A chat stream translated to Responses and back, as the SDK's chat stream helper
    accumulates it, says the same: text, reasoning, refusal, tool calls, usage, finish."""
    responses = run("chat-to-responses", _pieces(stream["body"], cuts), context(model="m"))
    assert_conformant(sse_json_events(responses))
    chat = run("responses-to-chat", _pieces(responses, cuts), context(include_usage=True))
    completion = _sdk_chat_final(chat)
    [choice] = completion.choices
    message = choice.message
    assert (message.content or "") == stream["text"]
    assert (getattr(message, "reasoning_content", None) or "") == stream["reasoning"]
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    assert calls == stream["calls"]
    assert choice.finish_reason == stream["finish"]
    assert _chat_usage(completion.usage) == stream["usage"]
    if stream["refusal"]:
        assert message.refusal == stream["refusal"]
    else:
        assert not message.refusal


# =============================================================================================
# (c) Responses → chat → Responses
# =============================================================================================


class _ResponsesBuilder:
    """Builds a conformant Responses event stream, item by item."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.output: list[dict[str, Any]] = []
        self.response = {
            "id": "resp_up",
            "object": "response",
            "created_at": NOW,
            "status": "in_progress",
            "completed_at": None,
            "error": None,
            "incomplete_details": None,
            "model": "upstream",
            "output": [],
            "usage": None,
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "metadata": {},
        }
        self.emit("response.created", response=dict(self.response))
        self.emit("response.in_progress", response=dict(self.response))

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "sequence_number": len(self.events), **fields})

    def _ids(self, item_id: str) -> dict[str, Any]:
        return {"item_id": item_id, "output_index": len(self.output)}

    def _added(self, item: dict[str, Any]) -> None:
        self.emit("response.output_item.added", output_index=len(self.output), item=item)

    def _done(self, item: dict[str, Any]) -> None:
        self.emit("response.output_item.done", output_index=len(self.output), item=item)
        self.output.append(item)

    def reasoning(self, parts: list[list[str]]) -> None:
        item_id = f"rs_{len(self.output)}"
        ids = self._ids(item_id)
        self._added({"id": item_id, "type": "reasoning", "summary": []})
        summary = []
        for k, pieces in enumerate(parts):
            self.emit(
                "response.reasoning_summary_part.added",
                **ids,
                summary_index=k,
                part={"type": "summary_text", "text": ""},
            )
            for piece in pieces:
                self.emit(
                    "response.reasoning_summary_text.delta", **ids, summary_index=k, delta=piece
                )
            whole = "".join(pieces)
            self.emit("response.reasoning_summary_text.done", **ids, summary_index=k, text=whole)
            part = {"type": "summary_text", "text": whole}
            self.emit("response.reasoning_summary_part.done", **ids, summary_index=k, part=part)
            summary.append(part)
        self._done({"id": item_id, "type": "reasoning", "summary": summary})

    def message(self, pieces: list[str]) -> None:
        item_id = f"msg_{len(self.output)}"
        ids = self._ids(item_id) | {"content_index": 0}
        base = {"id": item_id, "type": "message", "role": "assistant"}
        self._added(base | {"status": "in_progress", "content": []})
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.emit("response.content_part.added", **ids, part=empty)
        for piece in pieces:
            self.emit("response.output_text.delta", **ids, delta=piece, logprobs=[])
        whole = "".join(pieces)
        self.emit("response.output_text.done", **ids, text=whole, logprobs=[])
        part = empty | {"text": whole}
        self.emit("response.content_part.done", **ids, part=part)
        self._done(base | {"status": "completed", "content": [part]})

    def function_call(
        self, call_id: str, name: str, pieces: list[str], namespace: str | None
    ) -> None:
        item_id = f"fc_{len(self.output)}"
        ids = self._ids(item_id)
        base = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
        if namespace is not None:
            base["namespace"] = namespace
        self._added(base | {"status": "in_progress", "arguments": ""})
        for piece in pieces:
            self.emit("response.function_call_arguments.delta", **ids, delta=piece)
        whole = "".join(pieces)
        self.emit("response.function_call_arguments.done", **ids, name=name, arguments=whole)
        self._done(base | {"status": "completed", "arguments": whole})

    def custom_call(self, call_id: str, name: str, pieces: list[str]) -> None:
        item_id = f"ctc_{len(self.output)}"
        ids = self._ids(item_id)
        base = {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": name}
        self._added(base | {"status": "in_progress", "input": ""})
        for piece in pieces:
            self.emit("response.custom_tool_call_input.delta", **ids, delta=piece)
        whole = "".join(pieces)
        self.emit("response.custom_tool_call_input.done", **ids, input=whole)
        self._done(base | {"status": "completed", "input": whole})

    def finish(self, status: str, usage: dict[str, int] | None) -> bytes:
        response = dict(self.response, status=status, output=self.output)
        if status == "completed":
            response["completed_at"] = NOW
        else:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        if usage is not None:
            response["usage"] = {
                "input_tokens": usage["prompt"],
                "input_tokens_details": {"cached_tokens": usage["cached"]},
                "output_tokens": usage["completion"],
                "output_tokens_details": {"reasoning_tokens": usage["reasoning"]},
                "total_tokens": usage["total"],
            }
        self.emit(f"response.{status}", response=response)
        assert_conformant(self.events)  # the generator itself must be spec-exact
        return b"".join(
            f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in self.events
        )


@st.composite
def responses_streams(draw: st.DrawFn) -> dict[str, Any]:
    builder = _ResponsesBuilder()
    summary = draw(st.lists(st.lists(_piece, min_size=1, max_size=3), max_size=3))
    if summary:
        builder.reasoning(summary)
    text = draw(st.lists(_piece, max_size=4))
    assume(not "".join(text).lstrip().startswith("<think>"))
    if text:
        builder.message(text)
    calls: list[tuple[str, str, str | None, str, str]] = []  # call_id, name, ns, kind, payload
    names: set[str] = set()
    for index in range(draw(st.integers(0, 3))):
        call_id = f"call_{index}_{draw(st.from_regex(r'[A-Za-z0-9]{1,10}', fullmatch=True))}"
        name = draw(_name.filter(lambda n: "__" not in n and n not in names))
        names.add(name)  # tool names are unique within a request
        kind = draw(st.sampled_from(["function", "namespaced", "custom"]))
        if kind == "custom":
            tool_input = draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
            builder.custom_call(call_id, name, draw(_split(tool_input)) if tool_input else [])
            calls.append((call_id, name, None, "custom", tool_input))
        else:
            namespace = (
                draw(_name.filter(lambda n: "__" not in n)) if kind == "namespaced" else None
            )
            arguments = draw(_arguments)
            builder.function_call(call_id, name, draw(_split(arguments)), namespace)
            calls.append((call_id, name, namespace, "function", arguments))
    status = draw(st.sampled_from(["completed", "incomplete"]))
    usage = draw(_usage())
    joined = "".join(text)
    return {
        "body": builder.finish(status, usage),
        "text": joined if joined.strip() else "",
        "reasoning": "\n\n".join("".join(part) for part in summary),
        "calls": calls,
        "status": status,
        "usage": usage,
    }


def _tools_for(calls: list[tuple[str, str, str | None, str, str]]) -> dict[str, ToolOrigin]:
    """What request mapping would have recorded for these tools (chat name → origin)."""
    tools = {}
    for _, name, namespace, kind, _ in calls:
        if kind == "custom":
            tools[name] = ToolOrigin("custom", name)
        elif namespace is not None:
            tools[f"{namespace}__{name}"] = ToolOrigin("function", name, namespace=namespace)
    return tools


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=responses_streams(), cuts=st.lists(st.integers(0), max_size=6))
def test_responses_to_chat_to_responses_keeps_the_meaning(
    stream: dict[str, Any], cuts: list[int]
) -> None:
    """(c) A Responses stream translated to chat and back, as the SDK's Responses stream helper
    sees it, says the same: text, reasoning, function calls (namespaces restored), custom tool
    inputs, usage and status."""
    chat = run(
        "responses-to-chat",
        _pieces(stream["body"], cuts),
        context(model="m", include_usage=True),
    )
    assert any(data == "[DONE]" for _, data in iter_sse(chat))
    back = run(
        "chat-to-responses",
        _pieces(chat, cuts),
        context(model="m", tools=_tools_for(stream["calls"])),
    )
    events = sse_json_events(back)
    assert_conformant(events)
    completed = stream["status"] == "completed"
    sdk_events, response = sdk_responses_stream(back, final=completed)
    if response is None:
        response = sdk_events[-1].response
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.status == stream["status"]
    assert response.output_text == stream["text"]
    reasoning = [
        s.text for item in response.output if item.type == "reasoning" for s in item.summary
    ]
    assert "".join(reasoning) == stream["reasoning"]
    calls = []
    for item in response.output:
        if item.type == "function_call":
            calls.append((item.call_id, item.name, item.namespace, "function", item.arguments))
        elif item.type == "custom_tool_call":
            calls.append((item.call_id, item.name, None, "custom", item.input))
    assert calls == stream["calls"]
    usage = response.usage
    got_usage = None
    if usage is not None:
        got_usage = {
            "prompt": usage.input_tokens,
            "completion": usage.output_tokens,
            "total": usage.total_tokens,
            "cached": usage.input_tokens_details.cached_tokens,
            "reasoning": usage.output_tokens_details.reasoning_tokens,
        }
    assert got_usage == stream["usage"]
