"""Restoring the Responses tool behind a chat function call (translate.tools.restore_call)."""

from __future__ import annotations

from llmitm.translate.context import ToolOrigin, TranslationContext
from llmitm.translate.stream_to_responses import ChatToResponsesStream
from llmitm.translate.tools import restore_call


def test_custom_tool_inside_a_namespace_keeps_its_namespace() -> None:
    context = TranslationContext(tools={"ns__patch": ToolOrigin("custom", "patch", "ns")})
    item = restore_call("ctc_1", "call_1", "ns__patch", '{"input":"diff"}', "completed", context)
    assert item == {
        "id": "ctc_1",
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": "call_1",
        "name": "patch",
        "input": "diff",
        "namespace": "ns",
    }


def test_azure_first_chunk_without_model_does_not_leave_the_response_nameless() -> None:
    """Azure's first chunk has ``model: ""``; the terminal names the model of later chunks."""
    stream = ChatToResponsesStream()
    events = stream.feed({"id": "", "object": "", "model": "", "choices": []})
    chunk = {"id": "c", "model": "gpt-5-nano", "object": "chat.completion.chunk"}
    events += stream.feed(dict(chunk, choices=[{"index": 0, "delta": {"content": "Hi"}}]))
    events += stream.feed(dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    events += stream.done()
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["model"] == "gpt-5-nano"
