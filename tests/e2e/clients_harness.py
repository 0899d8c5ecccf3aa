"""What the real-client tests (``test_clients_node.py``, ``test_clients_langchain.py``) share:
llmitm in front of a chat-only fake, a Responses-only fake and a server replaying real
captured streams, and the meaning a client should get from each.

Routes pick the upstream by model name: ``over-chat…`` and ``over-responses…`` reach the
fakes (``over-chat-think…`` through an endpoint with ``reasoning_passthrough = "think-tags"``);
``fx-chat/NAME``, ``fx-responses/NAME`` replay the real fixture ``NAME.sse`` (or, for a call
that does not stream, ``NAME.json`` with its recorded status) as a chat or a Responses
upstream (``fx-summary/NAME``: with ``reasoning_summary = true``). What the client
should see is read from the same source it was sent: the fake's own non-streamed answer to the
same request, or the fixture's events, never written down here.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import orjson

from tests.helpers.realfixtures import REAL

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[endpoints.chat-think]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]
reasoning_passthrough = "think-tags"

[endpoints.responses-only]
kind = "compatible"
base_url = "{responses}/v1"
apis = ["responses"]

[endpoints.fixtures-chat]
kind = "compatible"
base_url = "{fixtures}/v1"
apis = ["chat"]

[endpoints.fixtures-responses]
kind = "compatible"
base_url = "{fixtures}/v1"
apis = ["responses"]

[endpoints.fixtures-summary]
kind = "compatible"
base_url = "{fixtures}/v1"
apis = ["responses"]
reasoning_summary = true

[[routes]]
models = ["over-chat-think*"]
endpoints = ["chat-think"]

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]

[[routes]]
models = ["over-responses*"]
endpoints = ["responses-only"]

[[routes]]
models = ["fx-chat/*"]
endpoints = ["fixtures-chat"]

[[routes]]
models = ["fx-responses/*"]
endpoints = ["fixtures-responses"]

[[routes]]
models = ["fx-summary/*"]
endpoints = ["fixtures-summary"]
"""

PROMPT = "What is the weather in Paris?"
"""The question every client asks (the same text as in node_clients.mjs)."""
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


# --- real fixtures ----------------------------------------------------------------------------


def stream_fixtures() -> list[tuple[str, str]]:
    """``(name, api)`` of every streamed real fixture (``NAME.sse``), sorted."""
    if not REAL.is_dir():
        return []
    out = []
    for path in sorted(REAL.glob("*.sse")):
        meta = orjson.loads(path.with_suffix(".meta.json").read_bytes())
        out.append((path.stem, meta["api"]))
    return out


def body_fixtures() -> list[tuple[str, str]]:
    """``(name, api)`` of every non-streamed real response body (``NAME.json``), sorted."""
    if not REAL.is_dir():
        return []
    out = []
    for path in sorted(REAL.glob("*.json")):
        if path.name.endswith((".meta.json", ".request.json")):
            continue
        meta = orjson.loads(path.with_suffix(".meta.json").read_bytes())
        out.append((path.stem, meta["api"]))
    return out


def _status(name: str) -> int:
    meta = orjson.loads((REAL / f"{name}.meta.json").read_bytes())
    return int((meta.get("http") or {}).get("status") or 200)


class _FixtureHandler(http.server.BaseHTTPRequestHandler):
    """Answers a create call for model ``…/NAME`` with the bytes of ``NAME.sse`` when it
    streams, else of ``NAME.json`` (with the status it was recorded with)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = orjson.loads(self.rfile.read(length) or b"{}")
        name = str(body.get("model", "")).rpartition("/")[2]
        stream, whole = REAL / f"{name}.sse", REAL / f"{name}.json"
        if name and body.get("stream") and stream.is_file():
            self._answer(200, "text/event-stream", stream.read_bytes())
        elif name and whole.is_file():
            self._answer(_status(name), "application/json", whole.read_bytes())
        else:
            payload = orjson.dumps({"error": {"message": f"no fixture {name!r}"}})
            self._answer(404, "application/json", payload)

    def _answer(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def fixture_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server replaying the real fixtures."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FixtureHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Meaning:
    """What an answer says, whatever spelling carried it."""

    text: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    """``(name, parsed arguments)`` per tool call, in order."""
    reasoning: str = ""
    refusal: str = ""
    error: bool = False


def _events(raw: bytes) -> Iterator[dict[str, Any]]:
    for line in raw.splitlines():
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            event = orjson.loads(line[5:])
            if isinstance(event, dict):
                yield event


def _arguments(text: str) -> Any:
    return orjson.loads(text) if text.strip() else {}


def fixture_meaning(name: str, api: str) -> Meaning:
    """What the real stream ``name`` says: choice 0's text, calls and reasoning (chat), or the
    output text, function calls and reasoning of a Responses stream; and whether it failed."""
    raw = (REAL / f"{name}.sse").read_bytes()
    meaning = Meaning()
    if api == "chat":
        calls: dict[int, list[str]] = {}
        for event in _events(raw):
            if event.get("error"):
                meaning.error = True
            for choice in event.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                meaning.text += delta.get("content") or ""
                meaning.refusal += delta.get("refusal") or ""
                meaning.reasoning += delta.get("reasoning_content") or delta.get("reasoning") or ""
                for call in delta.get("tool_calls") or []:
                    function = call.get("function") or {}
                    slot = calls.setdefault(call.get("index", 0), ["", ""])
                    slot[0] = slot[0] or function.get("name") or ""
                    slot[1] += function.get("arguments") or ""
        meaning.calls = [(name, _arguments(args)) for name, args in calls.values()]
        return meaning
    for event in _events(raw):
        kind = event.get("type")
        if kind == "response.output_text.delta":
            meaning.text += event.get("delta") or ""
        elif kind == "response.refusal.delta":
            meaning.refusal += event.get("delta") or ""
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            meaning.reasoning += event.get("delta") or ""
        elif kind == "response.output_item.done" and event["item"].get("type") == "function_call":
            item = event["item"]
            meaning.calls.append((item["name"], _arguments(item.get("arguments") or "")))
        elif kind in ("error", "response.failed"):
            meaning.error = True
    return meaning


def body_meaning(name: str, api: str) -> Meaning:
    """What the real body ``name`` says (its status >= 400: an error)."""
    body = orjson.loads((REAL / f"{name}.json").read_bytes())
    meaning = Meaning(error=_status(name) >= 400)
    if meaning.error:
        return meaning
    if api == "chat":
        message = body["choices"][0]["message"]
        meaning.text = message.get("content") or ""
        meaning.refusal = message.get("refusal") or ""
        meaning.reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        meaning.calls = [
            (call["function"]["name"], _arguments(call["function"]["arguments"]))
            for call in message.get("tool_calls") or []
        ]
        return meaning
    _output_meaning(body["output"], meaning)
    return meaning


def _output_meaning(output: list[dict[str, Any]], meaning: Meaning) -> None:
    for item in output:
        if item["type"] == "message":
            for part in item["content"]:
                meaning.text += part.get("text") or ""
                meaning.refusal += part.get("refusal") or ""
        elif item["type"] == "function_call":
            meaning.calls.append((item["name"], _arguments(item["arguments"])))
        elif item["type"] == "reasoning":
            parts = item.get("summary") or item.get("content") or []
            meaning.reasoning += "".join(part.get("text") or "" for part in parts)


# --- the fakes' own answers -------------------------------------------------------------------


def fake_meaning(
    upstream_url: str, api: str, *, tools: bool, scenario: str | None = None
) -> Meaning:
    """The fake upstream's non-streamed answer to the clients' question, read straight from
    it (not through llmitm)."""
    headers = {"x-fake-scenario": scenario} if scenario else {}
    meaning = Meaning()
    if api == "chat":
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
        if tools:
            function = {"name": "lookup", "description": "Weather", "parameters": PARAMETERS}
            body["tools"] = [{"type": "function", "function": function}]
        answer = httpx.post(f"{upstream_url}/v1/chat/completions", json=body, headers=headers)
        message = answer.raise_for_status().json()["choices"][0]["message"]
        meaning.text = message.get("content") or ""
        meaning.reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        meaning.calls = [
            (call["function"]["name"], _arguments(call["function"]["arguments"]))
            for call in message.get("tool_calls") or []
        ]
        return meaning
    body = {"model": "m", "input": PROMPT}
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "name": "lookup",
                "description": "Weather",
                "parameters": PARAMETERS,
            }
        ]
    answer = httpx.post(f"{upstream_url}/v1/responses", json=body, headers=headers)
    _output_meaning(answer.raise_for_status().json()["output"], meaning)
    return meaning


def client_calls(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A client's reported calls in the same shape as :attr:`Meaning.calls`."""
    return [(call["name"], _arguments(call["arguments"] or "")) for call in calls]
