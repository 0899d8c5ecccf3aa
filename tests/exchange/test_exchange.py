"""One proxied create call, sans-IO: the upstream request body per plan, the client's view of
non-streamed and error bodies, and the per-flow stream callable mitmproxy drives."""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import Iterable
from typing import Any

import brotli
import httpx2 as httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from llmitm.exchange.request import client_model, parse_body, prepare_request
from llmitm.exchange.response import stream_pipeline, translate_body
from llmitm.exchange.stream import StreamRewriter, decoder_for
from llmitm.routing.config import Endpoint
from llmitm.routing.plan import Plan, plan_for_endpoint
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from tests.helpers.oracle import sdk_chat_raw_chunks, sdk_chat_stream, sdk_responses_stream

NOW = 1_750_000_000


def endpoint(*apis: str, kind: str = "openai", **keys: Any) -> Endpoint:
    return Endpoint(
        name="e",
        kind=kind,  # type: ignore[arg-type]
        base_url="https://up.example/v1",
        apis=frozenset(apis),  # type: ignore[arg-type]
        **keys,
    )


CHAT_ONLY = endpoint("chat", kind="compatible")
RESPONSES_ONLY = endpoint("responses")
BOTH = endpoint("chat", "responses")


def options(**keys: Any) -> TranslateOptions:
    return TranslateOptions(ids=CountingIds(), clock=fixed_clock(NOW), **keys)


def context(model: str | None = "gpt-5", **keys: Any) -> TranslationContext:
    return TranslationContext(options=options(), model=model, **keys)


def plan(ep: Endpoint, client_api: str, model: str = "gpt-5") -> Plan:
    return plan_for_endpoint(ep, client_api, model)  # type: ignore[arg-type]


# --- parse_body / client_model --------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [None, b"", b"{not json", b"[1, 2]", b'"a string"', b"42", b"\xff\xfe"],
    ids=["none", "empty", "broken", "array", "string", "number", "binary"],
)
def test_parse_body_refuses_what_is_not_a_json_object(content: bytes | None) -> None:
    with pytest.raises(TranslationError) as info:
        parse_body(content)
    error = info.value
    assert error.status == 400
    assert error.code == "invalid_json"
    body = error.to_body()["error"]
    assert body["type"] == "invalid_request_error"
    assert body["code"] == "invalid_json"
    assert body["message"]


def test_parse_body_returns_the_object() -> None:
    assert parse_body(b'{"model": "m", "stream": true}') == {"model": "m", "stream": True}


@pytest.mark.parametrize("body", [{}, {"model": ""}, {"model": None}, {"model": 5}])
def test_client_model_is_required(body: dict[str, Any]) -> None:
    with pytest.raises(TranslationError) as info:
        client_model(body, None)
    error = info.value
    assert (error.status, error.code, error.param) == (400, "missing_required_parameter", "model")


def test_client_model_falls_back_to_the_azure_deployment_in_the_path() -> None:
    assert client_model({}, "gpt4o-prod") == "gpt4o-prod"
    assert client_model({"model": "gpt-4o"}, "gpt4o-prod") == "gpt-4o"


# --- prepare_request ------------------------------------------------------------------------


def test_same_api_with_the_same_model_forwards_the_exact_bytes() -> None:
    content = b'{ "stream" : true,\n  "model":"gpt-5", "input": "h\\u00e9", "x_extra": [1.50] }'
    body = parse_body(content)
    prepared = prepare_request(content, body, "gpt-5", plan(BOTH, "responses"), options())
    assert prepared.content is content
    assert prepared.stream is True
    assert prepared.context.model == "gpt-5"
    assert prepared.warnings == []


def test_same_api_with_an_alias_rewrites_only_the_model() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "vendor_field": {"keep": True},
    }
    content = orjson.dumps(body)
    aliased = plan(CHAT_ONLY, "chat", model="qwen3:8b")
    prepared = prepare_request(content, body, "gpt-4o", aliased, options())
    assert orjson.loads(prepared.content) == {**body, "model": "qwen3:8b"}
    assert prepared.stream is False
    assert prepared.context.model == "gpt-4o"  # the client's name, for what comes back
    assert body["model"] == "gpt-4o"  # the parsed body is not mutated


def test_same_api_on_azure_sends_the_deployment() -> None:
    azure = endpoint("chat", "responses", kind="azure", deployments={"gpt-5": "gpt5-prod"})
    body = {"model": "gpt-5", "input": "hi"}
    prepared = prepare_request(
        orjson.dumps(body), body, "gpt-5", plan(azure, "responses"), options()
    )
    assert orjson.loads(prepared.content) == {"model": "gpt5-prod", "input": "hi"}


def test_responses_client_to_a_chat_endpoint() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "be brief",
        "input": [{"role": "user", "content": "hi"}],
        "max_output_tokens": 50,
        "stream": True,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    }
    aliased = plan(CHAT_ONLY, "responses", model="qwen3:8b")
    prepared = prepare_request(orjson.dumps(body), body, "gpt-5", aliased, options())
    sent = orjson.loads(prepared.content)
    assert sent["model"] == "qwen3:8b"
    assert sent["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert sent["max_completion_tokens"] == 50
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}  # usage for response.completed
    assert sent["tools"][0]["function"]["name"] == "f"
    assert "input" not in sent and "instructions" not in sent
    assert prepared.stream is True
    assert prepared.context.model == "gpt-5"
    assert prepared.context.echo["instructions"] == "be brief"


def test_chat_client_to_a_responses_endpoint() -> None:
    body = {
        "model": "gpt-5",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    azure = endpoint("responses", kind="azure", deployments={"gpt-5": "gpt5-prod"})
    prepared = prepare_request(orjson.dumps(body), body, "gpt-5", plan(azure, "chat"), options())
    sent = orjson.loads(prepared.content)
    assert sent["model"] == "gpt5-prod"
    assert sent["instructions"] == "sys"
    assert sent["input"] == [{"type": "message", "role": "user", "content": "hi"}]
    assert sent["stream"] is True
    assert sent["store"] is False
    assert "messages" not in sent
    assert prepared.context.model == "gpt-5"
    assert prepared.context.include_usage is True


def test_translation_warnings_and_strict_refusals() -> None:
    body = {"model": "gpt-5", "input": "hi", "tools": [{"type": "web_search"}]}
    content = orjson.dumps(body)
    prepared = prepare_request(content, body, "gpt-5", plan(CHAT_ONLY, "responses"), options())
    assert "tools" not in orjson.loads(prepared.content)
    assert any("web_search" in warning for warning in prepared.warnings)
    with pytest.raises(TranslationError) as info:
        prepare_request(content, body, "gpt-5", plan(CHAT_ONLY, "responses"), options(strict=True))
    assert (info.value.status, info.value.param) == (400, "tools")


# --- translate_body: errors -----------------------------------------------------------------


ERROR_BODIES = {
    "openai": b'{"error":{"message":"Slow down","type":"requests","param":null,"code":"x"}}',
    "llamacpp": b'{"error":{"code":429,"message":"busy","type":"unavailable_error"}}',
    "flat": b'{"object":"error","message":"busy","type":"BadRequestError","code":429}',
    "string": b'{"error":"model not found"}',
    "detail": b'{"detail":[{"msg":"field required"},{"msg":"bad type"}]}',
    "html": b"<html><body><h1>429 Too Many Requests</h1></body></html>",
    "empty": b"",
    "array": b'["weird"]',
}


def assert_openai_error(content: bytes) -> dict[str, Any]:
    body = orjson.loads(content)
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["code"] is None or isinstance(error["code"], str)
    return error


@pytest.mark.parametrize("shape", list(ERROR_BODIES))
@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
@pytest.mark.parametrize(
    ("ep", "client_api"),
    [(CHAT_ONLY, "responses"), (RESPONSES_ONLY, "chat"), (BOTH, "chat"), (BOTH, "responses")],
    ids=["responses-over-chat", "chat-over-responses", "chat-passthrough", "responses-passthrough"],
)
def test_error_bodies_of_any_shape_become_openai_errors_with_the_status_kept(
    shape: str, status: int, ep: Endpoint, client_api: str
) -> None:
    the_plan = plan(ep, client_api)
    result = translate_body(status, ERROR_BODIES[shape], the_plan, context())
    assert result is not None
    new_status, content = result
    assert new_status == status
    error = assert_openai_error(content)
    assert error["message"] != "null"
    if shape == "empty":
        assert f"HTTP {status}" in error["message"]


def test_error_message_survives_the_translation() -> None:
    result = translate_body(429, ERROR_BODIES["llamacpp"], plan(CHAT_ONLY, "responses"), context())
    assert result is not None
    error = assert_openai_error(result[1])
    assert error["message"] == "busy"
    assert error["code"] == "rate_limit_exceeded"  # llama.cpp's integer code read as a 429


def test_an_azure_content_filter_gets_each_clients_code() -> None:
    content = orjson.dumps(
        {
            "error": {
                "message": "The response was filtered",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {"code": "ResponsibleAIPolicyViolation"},
            }
        }
    )
    chat = translate_body(400, content, plan(RESPONSES_ONLY, "chat"), context())
    responses = translate_body(400, content, plan(CHAT_ONLY, "responses"), context())
    assert chat is not None and responses is not None
    assert assert_openai_error(chat[1])["code"] == "content_filter"
    assert assert_openai_error(responses[1])["code"] == "invalid_prompt"


@pytest.mark.parametrize("client_api", ["chat", "responses"])
def test_the_sdk_raises_its_typed_error_for_the_translated_body(client_api: str) -> None:
    ep = CHAT_ONLY if client_api == "responses" else RESPONSES_ONLY
    result = translate_body(429, ERROR_BODIES["html"], plan(ep, client_api), context())
    assert result is not None
    status, content = result

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=content, headers={"content-type": "application/json"})

    client = openai.OpenAI(
        api_key="k",
        base_url="http://llmitm.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        max_retries=0,
    )
    with pytest.raises(openai.RateLimitError) as info:
        if client_api == "chat":
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        else:
            client.responses.create(model="m", input="x")
    assert info.value.status_code == 429
    assert info.value.code == "rate_limit_exceeded"
    assert "429 Too Many Requests" in info.value.message


# --- translate_body: successful bodies ------------------------------------------------------


CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": NOW,
    "model": "qwen3:8b",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there, ça va €"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
}

RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": NOW,
    "status": "completed",
    "model": "gpt5-prod",
    "output": [
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hi €", "annotations": []}],
        }
    ],
    "usage": {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    },
    "error": None,
    "incomplete_details": None,
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}


def test_non_streamed_chat_completion_becomes_a_response() -> None:
    result = translate_body(
        200, orjson.dumps(CHAT_COMPLETION), plan(CHAT_ONLY, "responses"), context()
    )
    assert result is not None
    status, content = result
    assert status == 200
    response = Response.model_validate(orjson.loads(content))
    assert response.status == "completed"
    assert response.model == "gpt-5"  # the client's model, not the upstream's alias
    assert response.output_text == "Hello there, ça va €"
    assert response.usage is not None and response.usage.total_tokens == 9


def test_non_streamed_response_becomes_a_chat_completion() -> None:
    result = translate_body(200, orjson.dumps(RESPONSE), plan(RESPONSES_ONLY, "chat"), context())
    assert result is not None
    status, content = result
    assert status == 200
    completion = ChatCompletion.model_validate(orjson.loads(content))
    assert completion.model == "gpt-5"
    assert completion.choices[0].message.content == "Hi €"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens == 5


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        ({"code": "rate_limit_exceeded", "message": "Too many"}, 429, "rate_limit_exceeded"),
        ({"code": "server_error", "message": "Oops"}, 500, "server_error"),
        (None, 500, "server_error"),
    ],
)
def test_a_failed_response_is_an_http_error_for_chat_clients(
    error: dict[str, Any] | None, status: int, code: str
) -> None:
    failed = {**RESPONSE, "status": "failed", "output": [], "error": error}
    result = translate_body(200, orjson.dumps(failed), plan(RESPONSES_ONLY, "chat"), context())
    assert result is not None
    assert result[0] == status
    assert assert_openai_error(result[1])["code"] == code


def test_a_failed_response_stays_a_response_for_responses_clients() -> None:
    failed = {**RESPONSE, "status": "failed", "output": [], "error": {"code": "x", "message": "m"}}
    assert translate_body(200, orjson.dumps(failed), plan(BOTH, "responses"), context()) is None


@pytest.mark.parametrize("content", [b"<html>ok</html>", b"", None, b"[1]", b'"text"'])
@pytest.mark.parametrize("client_api", ["chat", "responses"])
def test_non_json_upstream_success_is_a_502(content: bytes | None, client_api: str) -> None:
    ep = RESPONSES_ONLY if client_api == "chat" else CHAT_ONLY
    result = translate_body(200, content, plan(ep, client_api), context())
    assert result is not None
    status, body = result
    assert status == 502
    assert assert_openai_error(body)["code"] == "bad_upstream_response"


def test_passthrough_success_bodies_stand_as_they_are() -> None:
    assert translate_body(200, b"whatever", plan(BOTH, "chat"), context()) is None
    assert translate_body(201, orjson.dumps(RESPONSE), plan(BOTH, "responses"), context()) is None


# --- stream_pipeline ------------------------------------------------------------------------


def test_stream_pipeline_per_plan() -> None:
    guard = stream_pipeline(plan(BOTH, "chat"), context())
    assert isinstance(guard, StreamGuard) and guard.api == "chat"
    pipeline = stream_pipeline(plan(CHAT_ONLY, "responses"), context())
    assert pipeline is not None and pipeline.direction == "chat-to-responses"
    pipeline = stream_pipeline(plan(RESPONSES_ONLY, "chat"), context())
    assert pipeline is not None and pipeline.direction == "responses-to-chat"
    odd = endpoint("responses", non_conformant=frozenset({"responses"}))
    pipeline = stream_pipeline(plan(odd, "responses"), context())
    assert pipeline is not None and pipeline.direction == "normalise-responses"


# --- StreamRewriter -------------------------------------------------------------------------


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "qwen3:8b",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        **extra,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


CHAT_SSE = b"".join(
    [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Héllo"}),
        chat_chunk({"content": " wörld €"}),
        chat_chunk({"content": " 🎉!"}),
        chat_chunk({}, "stop"),
        b"data: "
        + orjson.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": NOW,
                "model": "qwen3:8b",
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
            }
        )
        + b"\n\n",
        b"data: [DONE]\n\n",
    ]
)
CHAT_TEXT = "Héllo wörld € 🎉!"


def responses_sse(text_parts: list[str]) -> bytes:
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": NOW,
        "model": "gpt5-prod",
        "status": "in_progress",
        "output": [],
    }
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress"}
    text = "".join(text_parts)
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    done_item = {**item, "status": "completed", "content": [part]}
    usage = {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
        {"type": "response.content_part.added", **ids, "part": {**part, "text": ""}},
        *(
            {"type": "response.output_text.delta", **ids, "delta": delta, "logprobs": []}
            for delta in text_parts
        ),
        {"type": "response.output_text.done", **ids, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **ids, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [done_item], "usage": usage},
        },
    ]
    frames = []
    for number, event in enumerate(events):
        event = {**event, "sequence_number": number}
        frames.append(
            b"event: " + event["type"].encode() + b"\r\ndata: " + orjson.dumps(event) + b"\r\n\r\n"
        )
    return b"".join(frames)


RESPONSES_SSE = responses_sse(["Hé", "llo €", " 🎉"])


def rewriter(direction: str, decode: Any = None) -> StreamRewriter:
    pipeline = StreamPipeline(direction, context())  # type: ignore[arg-type]
    return StreamRewriter(pipeline, decode)


def drive(rewriter_: StreamRewriter, pieces: Iterable[bytes]) -> tuple[bytes, list[list[bytes]]]:
    """Feed pieces then the final b"" as mitmproxy does; check every return value."""
    returned = [rewriter_(piece) for piece in pieces]
    returned.append(rewriter_(b""))
    for value in returned:
        assert isinstance(value, list)
        assert all(isinstance(item, bytes) and item for item in value)  # never b""
    return b"".join(b"".join(value) for value in returned), returned


def splits(data: bytes) -> dict[str, list[bytes]]:
    """Adversarial chunkings: every byte, inside UTF-8 characters, between \\r and \\n."""
    cuts: dict[str, list[bytes]] = {
        "whole": [data],
        "bytes": [data[i : i + 1] for i in range(len(data))],
        "sevens": [data[i : i + 7] for i in range(0, len(data), 7)],
    }
    inside_utf8 = [i for i, byte in enumerate(data) if 0x80 <= byte < 0xC0]
    between_cr_lf = [i + 1 for i in range(len(data) - 1) if data[i : i + 2] == b"\r\n"]
    blank_lines = [i + 1 for i in range(len(data) - 1) if data[i : i + 2] == b"\n\n"]
    for name, points in (
        ("utf8", inside_utf8),
        ("crlf", between_cr_lf),
        ("blank", blank_lines),
    ):
        if points:
            edges = [0, *points, len(data)]
            cuts[name] = [data[a:b] for a, b in itertools.pairwise(edges) if b > a]
    return cuts


@pytest.mark.parametrize(
    ("direction", "upstream"),
    [("chat-to-responses", CHAT_SSE), ("responses-to-chat", RESPONSES_SSE)],
)
def test_any_chunking_gives_the_same_output(direction: str, upstream: bytes) -> None:
    reference, _ = drive(rewriter(direction), [upstream])
    variants = splits(upstream)
    assert {"bytes", "utf8"} <= set(variants)
    for name, pieces in variants.items():
        assert b"".join(pieces) == upstream
        output, returned = drive(rewriter(direction), pieces)
        assert output == reference, name
        # Mid-stream calls that complete nothing return [], never [b""].
        if name == "bytes":
            assert [] in returned


def test_chat_upstream_reaches_a_responses_client_as_the_sdk_expects() -> None:
    output, _ = drive(rewriter("chat-to-responses"), splits(CHAT_SSE)["sevens"])
    events, final = sdk_responses_stream(output)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert final.output_text == CHAT_TEXT
    assert final.model == "gpt-5"
    assert final.usage is not None and final.usage.total_tokens == 9


def test_responses_upstream_reaches_a_chat_client_as_the_sdk_expects() -> None:
    output, _ = drive(rewriter("responses-to-chat"), splits(RESPONSES_SSE)["crlf"])
    assert output.endswith(b"data: [DONE]\n\n")
    final, chunks = sdk_chat_stream(output)
    assert final.choices[0].message.content == "Hé" + "llo €" + " 🎉"
    assert final.choices[0].finish_reason == "stop"
    assert {chunk.model for chunk in chunks} == {"gpt-5"}


def test_the_end_call_terminates_the_clients_stream() -> None:
    # Upstream cut before the finish: only the b"" call can end the client's stream.
    cut = CHAT_SSE[: CHAT_SSE.index(b'"finish_reason":"stop"')]
    cut = cut[: cut.rindex(b"\n\n") + 2]
    the_rewriter = rewriter("chat-to-responses")
    body = b"".join(b"".join(the_rewriter(piece)) for piece in [cut])
    assert b"response.failed" not in body
    end = the_rewriter(b"")
    assert len(end) == 1
    assert b"event: response.failed" in end[0]
    with pytest.raises(openai.APIError):
        sdk_responses_stream(body + end[0])

    chat_rewriter = rewriter("responses-to-chat")
    half = RESPONSES_SSE[: RESPONSES_SSE.index(b"event: response.output_text.done")]
    body = b"".join(chat_rewriter(half))
    end = chat_rewriter(b"")
    assert end and end[-1].endswith(b"data: [DONE]\n\n")
    with pytest.raises(openai.APIError):
        sdk_chat_raw_chunks(body + b"".join(end))


def test_the_responses_head_is_sent_before_the_upstream_answers() -> None:
    the_rewriter = rewriter("chat-to-responses")
    first = the_rewriter(CHAT_SSE[:3])  # not even one event yet
    assert len(first) == 1
    assert first[0].startswith(b"event: response.created\n")
    assert b"event: response.in_progress\n" in first[0]


class FailingPipeline(StreamPipeline):
    """A pipeline whose feed raises on its ``fail_at``-th call (an llmitm bug)."""

    def __init__(self, direction: str, fail_at: int) -> None:
        super().__init__(direction, context())  # type: ignore[arg-type]
        self.calls = 0
        self.fail_at = fail_at

    def feed(self, chunk: bytes) -> bytes:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("translator bug")
        return super().feed(chunk)


@pytest.mark.parametrize("fail_at", [1, 3])
def test_an_exception_ends_a_responses_clients_stream_with_an_error(
    fail_at: int, caplog: pytest.LogCaptureFixture
) -> None:
    the_rewriter = StreamRewriter(FailingPipeline("chat-to-responses", fail_at))
    pieces = splits(CHAT_SSE)["blank"]
    returned = [the_rewriter(piece) for piece in pieces[:fail_at]]
    body = b"".join(b"".join(value) for value in returned)
    assert body.endswith(b"\n\n")
    assert b"event: error\n" in body
    assert b"event: response.failed\n" in body
    # Everything after the failure is swallowed, the end call included.
    assert [the_rewriter(piece) for piece in pieces[fail_at:]] == [[]] * len(pieces[fail_at:])
    assert the_rewriter(b"") == []
    frames = [frame for frame in body.split(b"\n\n") if frame]
    types = [orjson.loads(frame.split(b"data: ", 1)[1])["type"] for frame in frames]
    assert types[0] == "response.created"
    assert types[-2:] == ["error", "response.failed"]
    numbers = [orjson.loads(frame.split(b"data: ", 1)[1])["sequence_number"] for frame in frames]
    assert numbers == list(range(len(numbers)))
    with pytest.raises(openai.APIError, match="llmitm failed to translate"):
        sdk_responses_stream(body)
    assert sum("stream translation failed" in r.message for r in caplog.records) == 1


def test_an_exception_ends_a_chat_clients_stream_with_an_error() -> None:
    the_rewriter = StreamRewriter(FailingPipeline("responses-to-chat", 3))
    pieces = splits(RESPONSES_SSE)["crlf"]
    body = b"".join(b"".join(the_rewriter(piece)) for piece in pieces)
    assert the_rewriter(b"") == []
    assert body.endswith(b"data: [DONE]\n\n")
    assert body.count(b"data: [DONE]") == 1
    with pytest.raises(openai.APIError, match="llmitm failed to translate"):
        sdk_chat_raw_chunks(body)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
    ],
)
def test_encoded_upstream_chunks_are_decoded(encoding: str, compress: Any) -> None:
    reference, _ = drive(rewriter("chat-to-responses"), [CHAT_SSE])
    packed = compress(CHAT_SSE)
    pieces = [packed[i : i + 5] for i in range(0, len(packed), 5)]
    output, _ = drive(rewriter("chat-to-responses", decoder_for(encoding)), pieces)
    assert output == reference


def test_gzip_upstream_through_the_sdk() -> None:
    packed = gzip.compress(CHAT_SSE)
    pieces = [packed[:1], packed[1:10], packed[10:]]
    output, _ = drive(rewriter("chat-to-responses", decoder_for("gzip")), pieces)
    _events, final = sdk_responses_stream(output)
    assert final.output_text == CHAT_TEXT


def test_a_body_that_is_not_what_its_encoding_says_ends_the_stream_cleanly() -> None:
    output, returned = drive(rewriter("chat-to-responses", decoder_for("gzip")), [CHAT_SSE])
    assert returned[-1] == []  # already ended at the first chunk
    frames = [frame for frame in output.split(b"\n\n") if frame]
    events = [orjson.loads(frame.split(b"data: ", 1)[1]) for frame in frames]
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert [event["sequence_number"] for event in events] == [0, 1, 2, 3]


@pytest.mark.parametrize("encoding", [None, "", "identity", " Identity "])
def test_identity_needs_no_decoder(encoding: str | None) -> None:
    assert decoder_for(encoding) is None


def test_unknown_encoding_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported content-encoding"):
        decoder_for("compress")


@pytest.mark.parametrize(("api", "upstream"), [("chat", CHAT_SSE), ("responses", RESPONSES_SSE)])
def test_a_passthrough_stream_is_relayed_byte_for_byte(api: str, upstream: bytes) -> None:
    the_plan = plan(BOTH, api)
    for name, pieces in splits(upstream).items():
        the_rewriter = StreamRewriter(stream_pipeline(the_plan, context()))
        output, returned = drive(the_rewriter, pieces)
        assert output == upstream, name
        assert returned[-1] == []  # the upstream ended properly: nothing to add


def cut_at_event(upstream: bytes) -> bytes:
    """The upstream up to the end of the event around its middle (a clean event boundary)."""
    middle = len(upstream) // 2
    separator = b"\r\n\r\n" if b"\r\n" in upstream else b"\n\n"
    return upstream[: upstream.index(separator, middle) + len(separator)]


def assert_stream_errors(api: str, output: bytes) -> None:
    with pytest.raises(openai.APIError):
        if api == "chat":
            sdk_chat_raw_chunks(output)
        else:
            sdk_responses_stream(output)


@pytest.mark.parametrize(("api", "upstream"), [("chat", CHAT_SSE), ("responses", RESPONSES_SSE)])
def test_a_passthrough_stream_cut_between_events_ends_in_the_clients_protocol(
    api: str, upstream: bytes
) -> None:
    cut = cut_at_event(upstream)
    the_rewriter = StreamRewriter(stream_pipeline(plan(BOTH, api), context()))
    output, returned = drive(the_rewriter, [cut])
    assert output.startswith(cut)
    assert returned[-1]  # the end call adds the terminal
    assert_stream_errors(api, output)


@pytest.mark.parametrize(("api", "upstream"), [("chat", CHAT_SSE), ("responses", RESPONSES_SSE)])
def test_a_passthrough_stream_cut_inside_an_event_ends_in_the_clients_protocol(
    api: str, upstream: bytes
) -> None:
    cut = cut_at_event(upstream)
    cut += upstream[len(cut) : len(cut) + 40]  # and half of the next event
    the_rewriter = StreamRewriter(stream_pipeline(plan(BOTH, api), context()))
    output, _ = drive(the_rewriter, [cut])
    assert_stream_errors(api, output)


def test_a_huge_answer_reaches_mitmproxy_in_pieces_of_at_most_a_mib() -> None:
    """A big output is handed over in pieces (asyncio copies the unsent rest of one big
    buffered write after every partial send), the same bytes in the same order; a held chat
    event goes out as the reads it came in."""
    from llmitm.exchange.stream import MAX_PART

    text = "word " * (3 * MAX_PART // 5)
    role = b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
    role += b'"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    big = role.replace(b'"role":"assistant","content":""', b'"content":"' + text.encode() + b'"')
    finish = role.replace(b'"role":"assistant","content":""}', b'},"finish_reason":"stop"')
    body = role + big + finish + b"data: [DONE]\n\n"
    for direction in ("chat-to-responses", "normalise-chat"):
        rewriter = StreamRewriter(StreamPipeline(direction, context(model="m")))
        whole = StreamRewriter(StreamPipeline(direction, context(model="m")))
        reads = [body[at : at + 65536] for at in range(0, len(body), 65536)]
        sent = [piece for read in [*reads, b""] for piece in rewriter(read)]
        assert all(0 < len(piece) <= MAX_PART for piece in sent)
        assert b"".join(sent) == b"".join([*whole(body), *whole(b"")]), direction
    assert any(piece is read for read in reads for piece in sent)  # normalise-chat's
