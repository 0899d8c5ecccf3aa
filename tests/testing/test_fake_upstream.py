"""The fake upstream (llmitm.testing.fake_upstream) against the real openai SDK, raw sockets and
as a subprocess: every scenario in both APIs, the fault injection and the control routes."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from llmitm.testing import fake_upstream as fu

ROOT = Path(__file__).resolve().parents[2]

REAL = ROOT.parent / "shared" / "fixtures" / "real"
USER = [{"role": "user", "content": "Say hi"}]
ANSWER = "Hello from the fake upstream."
STRICT_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
FLAT_TOOL = {"type": "function", **STRICT_TOOL["function"]}


@pytest.fixture(scope="module")
def fake() -> Iterator[fu.FakeUpstream]:
    with fu.serve_in_thread() as server:
        yield server


@pytest.fixture(scope="module")
def client(fake: fu.FakeUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.base_url + "/v1", api_key="x", max_retries=0)


def sse_events(raw: bytes) -> list[tuple[str | None, bytes]]:
    """(event name, data) per SSE frame of a whole body."""
    events = []
    for frame in raw.split(b"\n\n"):
        name, data = None, []
        for line in frame.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data.append(line[6:])
        if data:
            events.append((name, b"\n".join(data)))
    return events


def post(fake: fu.FakeUpstream, path: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return httpx2.post(fake.base_url + path, json=body, headers=headers, timeout=10)


def stream_json(fake: fu.FakeUpstream, path: str, body: dict[str, Any], **headers: str) -> list:
    """A streamed answer's data payloads, parsed ([DONE] kept as the string)."""
    response = post(fake, path, {**body, "stream": True}, **headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    return [
        d.decode() if d == b"[DONE]" else orjson.loads(d) for _, d in sse_events(response.content)
    ]


def raw_exchange(
    fake: fu.FakeUpstream, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> bytes:
    """Send one request on a raw socket and read until the server closes or ends the body."""
    data = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", fake.port), timeout=10) as sock:
        sock.sendall(head + data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


# --- pure helpers -----------------------------------------------------------------------------


def test_scenario_spec_grammar_and_fallbacks() -> None:
    scenario = fu.choose_scenario("Text;events=2000;garbage", {})
    assert scenario.name == "text"
    assert scenario.number("events") == 2000
    assert scenario.flag("garbage")
    assert scenario.number("missing") is None
    assert fu.choose_scenario("gpt-5", {}).name == "text"
    assert fu.choose_scenario("gpt-5", {"tools": [FLAT_TOOL]}).name == "tool-loop"
    assert fu.choose_scenario("text", {"tools": [STRICT_TOOL]}).name == "text"
    retry = fu.choose_scenario("text;status=429;retry_after=2", {})
    assert retry.options == {"status": "429", "retry_after": "2"}


def test_arguments_fill_every_required_property_from_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "cmd": {"type": "string"},
            "name": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "login": {"type": "boolean"},
            "items": {"type": "array"},
            "extra": {"type": "object"},
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "maybe": {"type": ["null", "string"]},
            "optional": {"type": "string"},
        },
        "required": ["cmd", "name", "count", "ratio", "login", "items", "extra", "mode", "maybe"],
    }
    assert json.loads(fu.example_arguments(schema)) == {
        "cmd": "echo llmitm-tool-ok",
        "name": "x",
        "count": 1,
        "ratio": 1,
        "login": True,
        "items": [],
        "extra": {},
        "mode": "fast",
        "maybe": "x",
    }
    assert fu.example_arguments({}) == "{}"
    arguments = '{"cmd":"echo llmitm-tool-ok"}'
    assert len(fu.fragments(arguments)) == 3
    assert "".join(fu.fragments(arguments)) == arguments
    assert "".join(fu.words("Tool result: a  b ")) == "Tool result: a  b "


# --- Chat Completions through the SDK ---------------------------------------------------------


def test_chat_create_stream_text_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="text", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.model == "text" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-fake")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens == len(orjson.dumps(USER)) // 4 + 1
    assert last.usage.prompt_tokens_details.cached_tokens == last.usage.prompt_tokens // 2


def test_chat_stream_sends_usage_only_when_asked(fake: fu.FakeUpstream) -> None:
    plain = stream_json(fake, "/v1/chat/completions", {"model": "text", "messages": USER})
    assert plain[-1] == "[DONE]"
    assert all("usage" not in c for c in plain[:-1])
    assert plain[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    asked = stream_json(
        fake,
        "/v1/chat/completions",
        {"model": "text", "messages": USER, "stream_options": {"include_usage": True}},
    )
    assert all(c["usage"] is None for c in asked[:-2])
    assert asked[-2]["choices"] == [] and asked[-2]["usage"]["total_tokens"] > 0


@pytest.mark.parametrize(
    ("scenario", "content", "refusal", "finish"),
    [
        ("text", ANSWER, None, "stop"),
        ("reasoning", ANSWER, None, "stop"),
        ("refusal", None, "I'm sorry, I can't help with that.", "stop"),
        ("length", "Hello from the", None, "length"),
        ("content-filter", "Hello from", None, "content_filter"),
    ],
)
def test_chat_stream_helper_and_plain_call_agree(
    client: openai.OpenAI, scenario: str, content: str | None, refusal: str | None, finish: str
) -> None:
    with client.chat.completions.stream(model=scenario, messages=USER) as stream:
        for _ in stream:
            pass
        try:
            streamed = stream.get_final_completion().choices[0]
        except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
            assert finish in ("length", "content_filter")  # the helper refuses to parse these
            assert exc.completion is not None
            streamed = exc.completion.choices[0]
    plain = client.chat.completions.create(model=scenario, messages=USER)
    for choice in (streamed, plain.choices[0]):
        assert (choice.message.content or None) == content
        assert choice.message.refusal == refusal
        assert choice.finish_reason == finish
    assert plain.object == "chat.completion" and plain.usage.total_tokens > 0


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("reasoning", "reasoning_content"),
        ("reasoning;reasoning_field=reasoning", "reasoning"),
    ],
)
def test_chat_reasoning_fields(fake: fu.FakeUpstream, spec: str, field: str) -> None:
    chunks = stream_json(fake, "/v1/chat/completions", {"model": spec, "messages": USER})[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    thought = "".join(d.get(field, "") for d in deltas)
    assert thought == "The user wants a short greeting.\n\nI will answer briefly."
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER
    first_text = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(field not in d for d in deltas[first_text:])
    plain = post(fake, "/v1/chat/completions", {"model": spec, "messages": USER}).json()
    message = plain["choices"][0]["message"]
    assert message[field] == thought and message["content"] == ANSWER
    assert plain["usage"]["completion_tokens_details"]["reasoning_tokens"] == 7


@pytest.mark.parametrize("spec", ["think", "reasoning;reasoning_field=think"])
def test_chat_think_tags_in_content(client: openai.OpenAI, spec: str) -> None:
    chunks = list(client.chat.completions.create(model=spec, messages=USER, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    thought = "The user wants a short greeting.\n\nI will answer briefly."
    assert content == f"<think>{thought}</think>\n\n{ANSWER}"
    plain = client.chat.completions.create(model=spec, messages=USER)
    assert plain.choices[0].message.content == content


def test_chat_tool_loop_both_turns(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(model="gpt-5", messages=USER, tools=[STRICT_TOOL]) as s:
        for _ in s:
            pass
        first = s.get_final_completion().choices[0]
    assert first.finish_reason == "tool_calls"
    (call,) = first.message.tool_calls
    assert call.id.startswith("call_fake_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "x", "days": 1}
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude={"parsed"})]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny"},
    ]
    second = client.chat.completions.create(model="gpt-5", messages=history, tools=[STRICT_TOOL])
    assert second.choices[0].message.content == "Tool result: Sunny"
    assert second.choices[0].finish_reason == "stop"


def test_chat_tool_call_arguments_stream_in_fragments(fake: fu.FakeUpstream) -> None:
    body = {"model": "tools-parallel", "messages": USER}
    chunks = stream_json(fake, "/v1/chat/completions", body)[:-1]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:-1]]
    assert [c["index"] for c in calls] == [0] * 4 + [1] * 4
    heads = [c for c in calls if "id" in c]
    assert [h["function"] for h in heads] == [{"name": "lookup", "arguments": ""}] * 2
    assert heads[0]["id"] != heads[1]["id"]
    args = "".join(c["function"]["arguments"] for c in calls if c["index"] == 0)
    assert json.loads(args) == {"query": "x"}
    assert chunks[0]["choices"][0]["delta"]["content"] is None
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_error_midstream(client: openai.OpenAI, fake: fu.FakeUpstream) -> None:
    seen = []
    with pytest.raises(openai.APIError, match="mid-stream"):
        for chunk in client.chat.completions.create(
            model="error-midstream", messages=USER, stream=True
        ):
            seen.append(chunk.choices[0].delta.content)
    assert seen == ["", "Hello", " from"]
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="error-midstream", messages=USER)
    chunks = stream_json(
        fake, "/v1/chat/completions", {"model": "error-midstream", "messages": USER}
    )
    assert chunks[-2] == {"error": fu.MIDSTREAM_ERROR} and chunks[-1] == "[DONE]"


# --- Responses through the SDK ----------------------------------------------------------------


def test_responses_create_stream_follows_the_lifecycle(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="reasoning", input="Say hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    done = [e.item for e in events if e.type == "response.output_item.done"]
    final = events[-1].response
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert [i.id for i in final.output] == [i.id for i in done]
    assert [p.text for p in final.output[0].summary] == [
        "The user wants a short greeting.",
        "I will answer briefly.",
    ]
    assert final.output_text == ANSWER
    assert final.usage.output_tokens_details.reasoning_tokens == 7
    assert final.usage.input_tokens_details.cached_tokens == final.usage.input_tokens // 2


@pytest.mark.parametrize(
    ("scenario", "types", "text"),
    [
        ("text", ["message"], ANSWER),
        ("reasoning", ["reasoning", "message"], ANSWER),
        ("tool-loop", ["function_call"], ""),
        ("tools-parallel", ["function_call", "function_call"], ""),
    ],
)
def test_responses_stream_helper_and_plain_call_agree(
    client: openai.OpenAI, scenario: str, types: list[str], text: str
) -> None:
    tools = [FLAT_TOOL]
    with client.responses.stream(model=scenario, input="Say hi", tools=tools) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_response()
    plain = client.responses.create(model=scenario, input="Say hi", tools=tools)
    for response in (streamed, plain):
        assert response.status == "completed" and response.object == "response"
        assert [item.type for item in response.output] == types
        assert response.output_text == text
        calls = [item for item in response.output if item.type == "function_call"]
        assert all(json.loads(c.arguments) == {"city": "x", "days": 1} for c in calls)
        assert len({c.call_id for c in calls}) == len(calls)
        assert (
            response.usage.total_tokens
            == response.usage.input_tokens + response.usage.output_tokens
        )


def test_responses_tool_loop_answers_the_tool_result(client: openai.OpenAI) -> None:
    first = client.responses.create(model="gpt-5", input="Weather?", tools=[FLAT_TOOL])
    (call,) = first.output
    history = [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": "{}"},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny in Paris"},
    ]
    with client.responses.stream(model="gpt-5", input=history, tools=[FLAT_TOOL]) as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == "Tool result: Sunny in Paris"


def test_codex_request_gets_an_exec_command_call(fake: fu.FakeUpstream) -> None:
    body = orjson.loads((REAL / "client-codex-0.171.0-exec-turn1.request.json").read_bytes())
    events = stream_json(fake, "/v1/responses", body)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["type"], i["name"]) for i in done] == [("function_call", "exec_command")]
    assert json.loads(done[0]["arguments"])["cmd"] == "echo llmitm-tool-ok"
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) >= 3
    assert events[-1]["response"]["store"] is False
    assert events[-1]["response"]["output"] == done


def test_codex_code_mode_exec_is_called_with_a_script_before_other_tools(
    client: openai.OpenAI,
) -> None:
    """Codex's default tools reach a chat upstream as ``functions__exec`` (one string
    ``input``) among plain functions: the fake calls it with a script running the command,
    then answers the script's output."""
    exec_tool = {
        "type": "function",
        "function": {
            "name": "functions__exec",
            "parameters": {
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"],
            },
        },
    }
    tools = [STRICT_TOOL, exec_tool]
    first = client.chat.completions.create(model="gpt-5", messages=USER, tools=tools)
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "functions__exec"
    script = json.loads(call.function.arguments)["input"]
    assert "tools.exec_command" in script and "echo llmitm-tool-ok" in script
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "llmitm-tool-ok"},
    ]
    second = client.chat.completions.create(model="gpt-5", messages=history, tools=tools)
    assert second.choices[0].message.content == "Tool result: llmitm-tool-ok"
    # Without it, the first function is called as before.
    other = client.chat.completions.create(model="gpt-5", messages=USER, tools=[STRICT_TOOL])
    assert other.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_responses_refusal(client: openai.OpenAI) -> None:
    with client.responses.stream(model="refusal", input="Say hi") as stream:
        kinds = [event.type for event in stream]
        response = stream.get_final_response()
    assert "response.refusal.delta" in kinds and "response.refusal.done" in kinds
    (part,) = response.output[0].content
    assert part.type == "refusal" and part.refusal == "I'm sorry, I can't help with that."


@pytest.mark.parametrize(
    ("scenario", "reason"), [("length", "max_output_tokens"), ("content-filter", "content_filter")]
)
def test_responses_incomplete(client: openai.OpenAI, scenario: str, reason: str) -> None:
    with client.responses.stream(model=scenario, input="Say hi") as stream:
        events = list(stream)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == reason
    plain = client.responses.create(model=scenario, input="Say hi")
    assert plain.status == "incomplete" and plain.incomplete_details.reason == reason


def test_responses_error_midstream(client: openai.OpenAI, fake: fu.FakeUpstream) -> None:
    with pytest.raises(openai.APIError, match="mid-stream"):
        for _ in client.responses.create(model="error-midstream", input="Say hi", stream=True):
            pass
    events = stream_json(fake, "/v1/responses", {"model": "error-midstream", "input": "Say hi"})
    assert [e["type"] for e in events[-4:]] == [
        "response.output_text.delta",
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    assert events[-2]["error"]["code"] == "server_error"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_responses_llamacpp_flavor(fake: fu.FakeUpstream) -> None:
    response = post(
        fake, "/v1/responses", {"model": "text;flavor=llamacpp", "input": "hi", "stream": True}
    )
    frames = sse_events(response.content)
    events = [orjson.loads(d) for _, d in frames]
    assert all(name == e["type"] for (name, _), e in zip(frames, events, strict=True))
    assert not any("sequence_number" in e or "output_index" in e for e in events)
    assert set(events[0]["response"]) == {"id", "object", "status"}
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ANSWER


def test_text_events_option_for_benchmarks(fake: fu.FakeUpstream) -> None:
    chunks = stream_json(
        fake, "/v1/chat/completions", {"model": "text;events=2000", "messages": USER}
    )
    words = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert len(words) == 2000 and all(w and len(w.split()) == 1 for w in words)
    events = stream_json(fake, "/v1/responses", {"model": "text;events=7", "input": "hi"})
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "Hello from the fake upstream. Hello from"


# --- faults -----------------------------------------------------------------------------------


def test_status_with_retry_after(client: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model="text;status=429;retry_after=2;retry_after_ms=2000", messages=USER, stream=True
        )
    headers = caught.value.response.headers
    assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "2000"
    assert headers["content-type"] == "application/json"
    assert caught.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.InternalServerError):
        client.responses.create(
            model="gpt-5", input="hi", extra_headers={"x-fake-scenario": "text;status=503"}
        )


def test_context_error_is_llamacpp_shaped(fake: fu.FakeUpstream) -> None:
    response = post(fake, "/v1/responses", {"model": "text;context_error", "input": "hi"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "exceed_context_size_error"


def test_disconnect_after_cuts_without_terminator(fake: fu.FakeUpstream) -> None:
    raw = raw_exchange(
        fake, {"model": "reasoning;disconnect_after=5", "messages": USER, "stream": True}
    )
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body.count(b"data: ") == 5
    assert not body.endswith(b"0\r\n\r\n") and b"[DONE]" not in body


def test_one_sse_event_per_chunk_and_garbage(fake: fu.FakeUpstream) -> None:
    raw = raw_exchange(fake, {"model": "text;garbage", "messages": USER, "stream": True})
    body = raw.partition(b"\r\n\r\n")[2]
    chunks = []
    while body:
        size, _, rest = body.partition(b"\r\n")
        length = int(size, 16)
        chunks.append(rest[:length])
        body = rest[length + 2 :]
    assert chunks[-1] == b""
    assert all(c.endswith(b"\n\n") and c.count(b"\n\n") == 1 for c in chunks[:-1])
    assert chunks[2] == fu.GARBAGE_FRAME
    with pytest.raises(UnicodeDecodeError):
        chunks[2].decode()
    assert chunks[-2] == b"data: [DONE]\n\n"
    content = "".join(
        orjson.loads(c[6:])["choices"][0]["delta"].get("content", "")
        for c in chunks[:-2]
        if c != fu.GARBAGE_FRAME
    )
    assert content == ANSWER


@pytest.mark.timing
def test_first_byte_and_event_delays(fake: fu.FakeUpstream) -> None:
    body = {
        "model": "text;first_byte_delay_ms=300;event_delay_ms=20",
        "messages": USER,
        "stream": True,
    }
    started = time.monotonic()
    with httpx2.stream("POST", fake.base_url + "/v1/chat/completions", json=body, timeout=10) as r:
        headers_at = time.monotonic() - started
        r.read()
    total = time.monotonic() - started
    # The head waits the delay, read in milliseconds (as seconds it would not pass).
    assert 0.29 <= headers_at < 10
    assert total - headers_at >= 0.1  # 8 frames, 7 gaps of 20 ms


# --- routes and control -----------------------------------------------------------------------


def test_requests_log_records_path_headers_and_body(fake: fu.FakeUpstream) -> None:
    httpx2.post(fake.base_url + "/_reset")
    body = {"model": "text", "input": "hi"}
    path = "/openai/responses?api-version=2025-04-01-preview"
    assert post(fake, path, body, **{"api-key": "secret", "X-Custom": "1"}).status_code == 200
    (record,) = httpx2.get(fake.base_url + "/_requests").json()
    assert record["method"] == "POST" and record["path"] == path and record["body"] == body
    assert record["headers"]["api-key"] == "secret" and record["headers"]["x-custom"] == "1"
    assert httpx2.get(fake.base_url + "/_stats").json() == {
        "in_flight": 0,
        "max_in_flight": 1,
        "requests": 1,
    }
    httpx2.post(fake.base_url + "/_reset")
    assert httpx2.get(fake.base_url + "/_requests").json() == []


def test_concurrency_is_tracked(fake: fu.FakeUpstream) -> None:
    httpx2.post(fake.base_url + "/_reset")
    body = {"model": "text;first_byte_delay_ms=300", "messages": USER}
    threads = [
        threading.Thread(target=post, args=(fake, "/v1/chat/completions", body)) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = httpx2.get(fake.base_url + "/_stats").json()
    assert stats == {"in_flight": 0, "max_in_flight": 3, "requests": 3}


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/api/v1/responses", "responses"),
        ("/openai/deployments/tools-parallel/chat/completions?api-version=2024-10-21", "chat"),
        ("/openai/v1/chat/completions", "chat"),
        ("/openai/v1/responses", "responses"),
    ],
)
def test_routes(fake: fu.FakeUpstream, path: str, api: str) -> None:
    body = {"messages": USER} if api == "chat" else {"model": "text", "input": "hi"}
    answer = post(fake, path, body).json()
    assert answer["object"] == ("chat.completion" if api == "chat" else "response")
    if "deployments" in path:  # no body model: the deployment names the scenario
        assert answer["model"] == "tools-parallel"
        assert len(answer["choices"][0]["message"]["tool_calls"]) == 2


def test_models_and_unknown_routes(fake: fu.FakeUpstream) -> None:
    models = httpx2.get(fake.base_url + "/v1/models").json()
    assert models["object"] == "list" and {"text", "tool-loop"} <= {m["id"] for m in models["data"]}
    missing = httpx2.get(fake.base_url + "/v1/responses/resp_1")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"


def test_keep_alive_and_chunked_request_refused(fake: fu.FakeUpstream) -> None:
    data = orjson.dumps({"model": "text", "messages": USER})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {len(data)}\r\n\r\n"
    ).encode() + data
    with socket.create_connection(("127.0.0.1", fake.port), timeout=10) as sock:
        reader = sock.makefile("rb")
        for _ in range(2):
            sock.sendall(request)
            assert reader.readline().startswith(b"HTTP/1.1 200")
            headers = {}
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                headers[name.lower()] = value.strip()
            answer = orjson.loads(reader.read(int(headers["content-length"])))
            assert answer["choices"][0]["message"]["content"] == ANSWER
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        assert reader.readline().startswith(b"HTTP/1.1 411")


def test_chat_only_server_404s_responses() -> None:
    with fu.serve_in_thread(apis={"chat"}) as chat_only:
        sdk = openai.OpenAI(base_url=chat_only.base_url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError) as caught:
            sdk.responses.create(model="text", input="hi", stream=True)
        assert caught.value.body["type"] == "invalid_request_error"
        assert sdk.chat.completions.create(model="text", messages=USER).choices
        assert [r["api"] for r in chat_only.requests] == ["responses", "chat"]


# --- ways to run it ---------------------------------------------------------------------------


async def test_in_process_async_context() -> None:
    async with fu.FakeUpstream(apis={"responses"}) as server:
        async with httpx2.AsyncClient(base_url=server.base_url) as http:
            body = {"model": "text", "input": "hi", "stream": True}
            streamed = await http.post("/v1/responses", json=body)
            chat = await http.post("/v1/chat/completions", json={"messages": USER})
        assert streamed.status_code == 200 and chat.status_code == 404
        assert [r["path"] for r in server.requests] == ["/v1/responses", "/v1/chat/completions"]
        cut = asyncio.create_task(
            http_hanging_stream(server.port, {"model": "text;event_delay_ms=5000", "input": "x"})
        )
        await asyncio.sleep(0.1)
    assert await asyncio.wait_for(cut, 5)  # stop() aborts a stream in flight


async def http_hanging_stream(port: int, body: dict[str, Any]) -> bool:
    """Start a slow stream; True once the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = orjson.dumps({**body, "stream": True})
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
        % (len(data), data)
    )
    await writer.drain()
    await reader.read()
    writer.close()
    return True


def test_subprocess_cli(tmp_path: Path) -> None:
    port_file, log = tmp_path / "port", tmp_path / "requests.jsonl"
    command = [
        sys.executable,
        "-m",
        "llmitm.testing.fake_upstream",
        "--port-file",
        str(port_file),
        "--apis",
        "chat",
        "--log",
        str(log),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        base_url = f"http://127.0.0.1:{int(port_file.read_text())}"
        sdk = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        stream = sdk.chat.completions.create(model="text", messages=USER, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == ANSWER
        with pytest.raises(openai.NotFoundError):
            sdk.responses.create(model="text", input="hi")
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert b"listening on" in out
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["path"] for line in lines] == ["/v1/chat/completions", "/v1/responses"]
    assert lines[0]["body"]["messages"] == USER
