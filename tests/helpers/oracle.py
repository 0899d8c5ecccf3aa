"""The openai SDK as the conformance oracle.

Translated bytes are served to a real ``openai.OpenAI`` client through an httpx mock transport,
so the SDK's own SSE parser, its ``[DONE]`` handling, its ``APIError`` on error chunks and its
stream helpers (``chat.completions.stream`` / ``responses.stream``) judge the output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2 as httpx
import openai
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses import ResponseStreamState  # type: ignore[attr-defined]
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import Response


def client_serving(body: bytes, content_type: str = "text/event-stream") -> openai.OpenAI:
    """An SDK client whose every request is answered with ``body``."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return openai.OpenAI(
        api_key="test",
        base_url="http://llmitm.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        max_retries=0,
    )


def sdk_chat_stream(sse: bytes, **request: Any):
    """Run the bytes through ``client.chat.completions.stream``; return the final completion
    and the list of chunks the SDK parsed."""
    client = client_serving(sse)
    chunks: list[ChatCompletionChunk] = []
    with client.chat.completions.stream(
        model=request.pop("model", "m"),
        messages=request.pop("messages", [{"role": "user", "content": "hi"}]),
        **request,
    ) as stream:
        for event in stream:
            if event.type == "chunk":
                chunks.append(event.chunk)
        final = stream.get_final_completion()
    return final, chunks


def sdk_chat_raw_chunks(sse: bytes) -> list[ChatCompletionChunk]:
    """``client.chat.completions.create(stream=True)``: the plain iterator."""
    client = client_serving(sse)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    return list(stream)


def sdk_responses_stream(sse: bytes, *, final: bool = True):
    """Run the bytes through ``client.responses.stream``; return (events, final response or
    None when the stream did not complete)."""
    client = client_serving(sse)
    events = []
    with client.responses.stream(model="m", input="hi") as stream:
        for event in stream:
            events.append(event)
        response = stream.get_final_response() if final else None
    return events, response


def accumulate_chat(chunks: list[dict[str, Any]]) -> Any:
    """Feed chunk dicts to the SDK's accumulator (the state behind ``.stream()``)."""
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


def accumulate_responses(events: list[dict[str, Any]]) -> tuple[list[Any], Response | None]:
    """Feed event dicts to the SDK's ``ResponseStreamState``; the final Response if completed."""
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    state = ResponseStreamState(input_tools=openai.NOT_GIVEN, text_format=openai.NOT_GIVEN)
    handled = []
    final: Response | None = None
    for raw in events:
        event = construct_type(type_=ResponseStreamEvent, value=raw)
        handled.extend(state.handle_event(event))
        if raw["type"] == "response.completed":
            final = state._completed_response  # type: ignore[attr-defined]
    return handled, final


Check = Callable[[bytes], None]
