"""The e2e harness on its own, with no llmitm in between: the real clients against the real
llama.cpp backend, and Codex's unattended tool loop against a minimal scripted upstream.

If these fail, end-to-end tests through llmitm cannot be trusted either.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from .conftest import MODEL_NAME, CodexResult

MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.fixture
def client(llama_server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{llama_server}/v1", api_key="sk-test", max_retries=0, timeout=60
    ) as client:
        yield client


def test_llama_serves_its_models(llama_server: str) -> None:
    assert llama_server.startswith("http://127.0.0.1:")
    models = httpx.get(f"{llama_server}/v1/models", timeout=10).json()
    assert MODEL_NAME in json.dumps(models)


def test_sdk_chat_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8)
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_sdk_chat_completion_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert text
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0


def test_sdk_chat_stream_helper(client: openai.OpenAI) -> None:
    # get_final_completion() raises on finish_reason "length": let a stop sequence end it
    # (this base model echoes the prompt, then ChatML's end marker, as plain text).
    with client.chat.completions.stream(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=32, stop=["<|im_end|>", "\n"]
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content


def test_llama_responses_raw_stream(llama_server: str) -> None:
    """llama.cpp's Responses stream is not conformant (no sequence_number, so the SDK's
    ``responses.stream()`` helper crashes on it): read the SSE by hand, expect text."""
    body = {"model": MODEL_NAME, "input": "Say hi", "stream": True, "max_output_tokens": 8}
    events: list[dict] = []
    with httpx.stream("POST", f"{llama_server}/v1/responses", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    types = [event["type"] for event in events]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"


def test_llama_responses_json(llama_server: str) -> None:
    body = {"model": MODEL_NAME, "input": "Say hi", "max_output_tokens": 8}
    response = httpx.post(f"{llama_server}/v1/responses", json=body, timeout=60)
    assert response.status_code == 200
    output = response.json()["output"]
    assert any(part.get("text") for item in output for part in item.get("content", []))


def test_codex_says_hi_to_llama(llama_server: str, run_codex, tmp_path: Path) -> None:
    """Codex's ~40 KB first request fits the 16k context and its answer ends the turn.

    Its ~4,500 prompt tokens take ~17 s on 2 idle cores, over a minute on a busy machine."""
    result: CodexResult = run_codex("Say hi", f"{llama_server}/v1", tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), result.stderr[-3000:]


async def test_agents_chat_model_single_turn(llama_server: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{llama_server}/v1", api_key="sk-test", max_retries=0)
    agent = Agent(
        name="greeter",
        instructions="Answer in one short sentence.",
        model=OpenAIChatCompletionsModel(model=MODEL_NAME, openai_client=client),
        model_settings=ModelSettings(max_tokens=8),
    )
    try:
        result = await Runner.run(agent, "Say hi")
    finally:
        await client.close()
    assert isinstance(result.final_output, str) and result.final_output


# --- Codex's tool loop, unattended --------------------------------------------------------

TOOL_CMD = "echo tool-ran > marker.txt && echo harness-tool-output"


class _ScriptedResponses(BaseHTTPRequestHandler):
    """A Responses API that asks for one ``exec_command`` call, then echoes the tool output
    back as text. Conformant events (sequence numbers, a completed response with an id)."""

    protocol_version = "HTTP/1.1"
    requests: list[dict]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        self.requests.append(body)
        outputs = [
            item
            for item in body.get("input", [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if outputs:
            item = {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "tool said: done", "annotations": []}],
            }
        else:
            item = {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "exec_command",
                "status": "completed",
                "arguments": json.dumps({"cmd": TOOL_CMD}),
            }
        done = {
            "id": f"resp_{len(self.requests)}",
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": body.get("model"),
            "output": [item],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        }
        events = [
            ("response.created", {"response": {**done, "status": "in_progress", "output": []}}),
            ("response.output_item.added", {"output_index": 0, "item": item}),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": done}),
        ]
        data = b"".join(
            f"event: {kind}\ndata: "
            f"{json.dumps({'type': kind, 'sequence_number': n, **fields})}\n\n".encode()
            for n, (kind, fields) in enumerate(events)
        )
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def scripted_responses() -> Iterator[tuple[str, list[dict]]]:
    requests: list[dict] = []
    handler = type("Handler", (_ScriptedResponses,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", requests
    finally:
        server.shutdown()
        server.server_close()


def test_codex_runs_exec_command_unattended(
    scripted_responses: tuple[str, list[dict]], run_codex, tmp_path: Path
) -> None:
    """run_codex's flags let the model's exec_command run with nobody to approve it and no
    read-only sandbox: the command writes in the workdir and its output goes back."""
    base_url, requests = scripted_responses
    result = run_codex("Run the command.", base_url, tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "marker.txt").read_text().strip() == "tool-ran"
    assert len(requests) == 2
    assert "exec_command" in [tool.get("name") for tool in requests[0]["tools"]]
    [output] = [i for i in requests[1]["input"] if i.get("type") == "function_call_output"]
    assert output["call_id"] == "call_1"
    assert "harness-tool-output" in json.dumps(output["output"])
    assert "tool said: done" in result.stdout
