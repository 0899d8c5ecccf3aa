"""A deterministic fake OpenAI-compatible upstream for end-to-end tests, the demo and benchmarks.

It speaks the Chat Completions API, the Responses API or both, over plain HTTP/1.1 on
127.0.0.1 (stdlib asyncio + orjson, no web framework). It is an independent reference: it
does not import llmitm, so a bug in the translators cannot hide itself here.

Scenario choice, per request: the ``x-fake-scenario`` header if present, else the request's
``model`` (for Azure deployment URLs without a body model, the deployment name). Grammar:
``name[;key=value]*`` such as ``tools-parallel``, ``text;events=2000``,
``text;status=429;retry_after=2``, ``reasoning;disconnect_after=5``. An unknown name means
``tool-loop`` when the request declares function tools, else ``text`` — so ``gpt-5`` works.

Scenarios (both APIs, streamed and not):
  text             "Hello from the fake upstream." in five deltas; ``events=N``: N one-word deltas
  reasoning        reasoning, then the answer; chat option
                   ``reasoning_field=reasoning_content|reasoning|think``
  think            inline ``<think>…</think>`` before the answer (in the text, both APIs)
  tool-loop        after a tool result: "Tool result: <output>"; else one call of the first
                   function tool, arguments built from its JSON schema (a ``cmd`` string
                   property gets "echo llmitm-tool-ok"); Codex's code-mode ``exec`` tool,
                   when offered, is called first with a script running that command
  tools-parallel   the same with two calls (of ``lookup`` if no tool is declared);
                   option ``reasoning``: reasoning before each answer
  refusal          a refusal instead of text
  length           a cut answer: finish_reason length / response.incomplete (max_output_tokens)
  content-filter   finish_reason content_filter / response.incomplete (content_filter)
  error-midstream  two text deltas, then a chat error chunk / Responses ``error`` and
                   ``response.failed`` (HTTP 500 when not streamed)
  echo             "Echo: <the last user message's text>", so each turn's answer differs

Options for any scenario: ``status=N`` (+ ``retry_after=S``, ``retry_after_ms=M``),
``context_error`` (llama.cpp's 400), ``disconnect_after=N`` (abort after N events),
``first_byte_delay_ms=M``, ``event_delay_ms=M``, ``end_delay_ms=M`` (a stream's body ends M ms
after its last event, as a server that flushes each event and closes the body later),
``garbage`` (an invalid-UTF-8 non-JSON data line after 2 events), ``flavor=llamacpp``
(Responses events shaped like llama.cpp's),
``stall_after=N`` (send N events, then nothing while keeping the connection open, until the
client hangs up or a minute has passed), ``reset_before_headers`` (abort the connection
without answering), ``not_http`` (answer bytes that are not HTTP, then close),
``short_body`` (a plain answer whose body stops half-way short of its content-length).

Control routes: ``GET /_requests``, ``POST /_reset``, ``GET /_stats`` (requests, in flight
and the most ever in flight at once), ``POST /_fault`` (body: options such as
``status=503;retry_after=1`` applied to every request from now on, or only to the next N
with ``times=N``; empty clears them);
``GET /v1/models``. ``--fault`` sets the same at start-up: several fakes with different
faults stand for endpoints that throttle, fail or stall.

Run it as a process (writes the bound port to ``--port-file``, stops on SIGTERM/SIGINT):

    python -m llmitm.testing.fake_upstream [--host 127.0.0.1] [--port 0] [--port-file FILE]
                                         [--apis chat,responses] [--log FILE] [--fault OPTIONS]
                                         [--id-prefix TEXT]

or in-process: ``async with FakeUpstream(apis={"chat"}) as fake: fake.base_url``; or from
synchronous code: ``with serve_in_thread() as fake: ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import itertools
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

JSON = dict[str, Any]

API_NAMES = frozenset({"chat", "responses"})
SCENARIOS = (
    "text",
    "reasoning",
    "think",
    "tool-loop",
    "tools-parallel",
    "refusal",
    "length",
    "content-filter",
    "error-midstream",
    "echo",
)
ANSWER = ("Hello", " from", " the", " fake", " upstream.")
REASONING = (("The user", " wants", " a short", " greeting."), ("I will", " answer", " briefly."))
REFUSAL = ("I'm sorry,", " I can't", " help with that.")
LOOKUP_TOOL: JSON = {
    "name": "lookup",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}
# Codex's default configuration runs commands through its "code mode" tool ``exec`` (a custom
# tool whose input is a JavaScript script calling the nested ``tools.exec_command``), which a
# chat upstream sees as the function ``functions__exec`` with one string parameter ``input``.
CODEX_EXEC_NAMES = frozenset({"exec", "functions__exec"})
CODEX_EXEC_SCRIPT = (
    'const result = await tools.exec_command({cmd: "echo llmitm-tool-ok"});\ntext(result.output);'
)
MIDSTREAM_ERROR: JSON = {
    "message": "The fake upstream failed mid-stream.",
    "type": "server_error",
    "param": None,
    "code": "server_error",
}
GARBAGE_FRAME = b"data: \xff\xfe{not json \xc3(\n\n"
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


# --- scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario spec: a known name and its ``key=value`` options."""

    name: str
    options: dict[str, str] = field(default_factory=dict)

    def number(self, key: str) -> int | None:
        """The option as an int, or None when absent or not a number."""
        try:
            return int(float(self.options[key]))
        except (KeyError, ValueError):
            return None

    def flag(self, key: str) -> bool:
        return key in self.options


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``name;key=value;flag`` into the lower-cased name and its options."""
    name, *pairs = spec.split(";")
    options: dict[str, str] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key.strip():
            options[key.strip().lower()] = value.strip()
    return name.strip().lower(), options


def choose_scenario(spec: str, body: JSON) -> Scenario:
    """Resolve a spec (header or model); unknown names fall back to tool-loop or text."""
    name, options = parse_spec(spec)
    if name not in SCENARIOS:
        name = "tool-loop" if declared_functions(body) else "text"
    return Scenario(name, options)


# --- what the request says -------------------------------------------------------------------


def declared_functions(body: JSON) -> list[JSON]:
    """The request's function tools as ``{name, parameters}``, in either API's shape."""
    found = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        nested = tool.get("function")
        spec = nested if isinstance(nested, dict) else tool
        if isinstance(spec.get("name"), str):
            params = spec.get("parameters")
            found.append(
                {"name": spec["name"], "parameters": params if isinstance(params, dict) else {}}
            )
    return found


def codex_exec_call(functions: list[JSON]) -> JSON | None:
    """Codex's ``exec`` tool among the declared functions (as a chat upstream sees a custom
    tool: one string parameter ``input``), with the arguments that run a shell command."""
    for function in functions:
        properties = function["parameters"].get("properties") or {}
        if function["name"] in CODEX_EXEC_NAMES and set(properties) == {"input"}:
            arguments = orjson.dumps({"input": CODEX_EXEC_SCRIPT}).decode()
            return {"name": function["name"], "arguments": arguments}
    return None


def conversation(body: JSON) -> list[Any]:
    """Chat ``messages`` or Responses ``input`` as a list (a string input is one turn)."""
    turns = body.get("messages", body.get("input"))
    return turns if isinstance(turns, list) else []


def content_text(content: Any) -> str:
    """Text of a message content or tool output: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return "" if content is None else orjson.dumps(content).decode()


def tool_result(turn: Any) -> str | None:
    """The output carried by a chat ``tool`` message or a Responses call output item."""
    if not isinstance(turn, dict):
        return None
    if turn.get("role") == "tool":
        return content_text(turn.get("content"))
    if turn.get("type") in ("function_call_output", "custom_tool_call_output"):
        return content_text(turn.get("output"))
    return None


def trailing_tool_results(body: JSON) -> list[str]:
    """Tool outputs at the end of the conversation, in order (empty if the last turn isn't one)."""
    results: list[str] = []
    for turn in reversed(conversation(body)):
        output = tool_result(turn)
        if output is None:
            break
        results.append(output)
    return results[::-1]


def last_user_text(body: JSON) -> str:
    """The text of the conversation's last user turn (a string input is one)."""
    turns = body.get("messages", body.get("input"))
    if isinstance(turns, str):
        return turns
    for turn in reversed(turns if isinstance(turns, list) else []):
        if isinstance(turn, dict) and turn.get("role") == "user":
            return content_text(turn.get("content"))
    return ""


def example_value(name: str, schema: Any) -> Any:
    """A value that satisfies a property's JSON schema type."""
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "number"):
        return 1
    return {"boolean": True, "array": [], "object": {}, "null": None}.get(
        kind, "echo llmitm-tool-ok" if name == "cmd" else "x"
    )


def example_arguments(parameters: JSON) -> str:
    """Arguments JSON with every required property of the schema filled."""
    props = parameters.get("properties") or {}
    required = [key for key in parameters.get("required") or [] if isinstance(key, str)]
    return orjson.dumps({key: example_value(key, props.get(key)) for key in required}).decode()


def input_chars(body: JSON) -> int:
    """Characters of the conversation and instructions (the basis of prompt token counts)."""
    turns = body.get("messages", body.get("input"))
    instructions = body.get("instructions")
    extra = len(instructions) if isinstance(instructions, str) else 0
    return len(orjson.dumps(turns)) + extra


# --- the answer, independent of the API ------------------------------------------------------


@dataclass
class Call:
    call_id: str
    name: str
    arguments: str


@dataclass
class Plan:
    """What the fake model says; rendered into either API. ``finish`` is a chat finish_reason
    or ``error`` (stop after the text deltas with a mid-stream error)."""

    reasoning: list[list[str]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    finish: str = "stop"

    def output_tokens(self) -> int:
        args = sum(len(fragments(call.arguments)) for call in self.calls)
        return self.reasoning_tokens() + len(self.text) + len(self.refusal) + args

    def reasoning_tokens(self) -> int:
        return sum(len(part) for part in self.reasoning)


def words(text: str) -> list[str]:
    """Split text into word deltas that join back to it exactly."""
    return re.findall(r"\s*\S+|\s+$", text) or [text]


def fragments(arguments: str, parts: int = 3) -> list[str]:
    """Cut an arguments string into ``parts`` pieces (fewer only if it is shorter)."""
    size = max(1, -(-len(arguments) // parts))
    return [arguments[i : i + size] for i in range(0, len(arguments), size)] or [""]


def answer_deltas(scenario: Scenario) -> list[str]:
    """The fixed answer, or ``events=N`` one-word deltas cycling through it."""
    count = scenario.number("events")
    if count is None:
        return list(ANSWER)
    deltas = []
    for i in range(max(count, 0)):
        word = ANSWER[i % len(ANSWER)]
        deltas.append(" " + word if i and i % len(ANSWER) == 0 else word)
    return deltas


def inline_think(plan: Plan) -> Plan:
    """Move reasoning into the text as ``<think>…</think>``, as servers without a parser do."""
    thought = reasoning_deltas(plan)
    if not thought:
        return plan
    text = ["<think>", *thought, "</think>", "\n\n", *plan.text]
    return Plan(text=text, refusal=plan.refusal, calls=plan.calls, finish=plan.finish)


def reasoning_deltas(plan: Plan) -> list[str]:
    """Reasoning as one flat delta list, summary parts separated by a blank line."""
    deltas: list[str] = []
    for k, part in enumerate(plan.reasoning):
        deltas += [("\n\n" + d if k and not i else d) for i, d in enumerate(part)]
    return deltas


def build_plan(scenario: Scenario, body: JSON, new_call_id: Callable[[], str]) -> Plan:
    """Decide what to answer for this scenario and request."""
    name = scenario.name
    answer = answer_deltas(scenario)
    reasoning = [list(part) for part in REASONING]
    if name in ("tool-loop", "tools-parallel"):
        # Option ``reasoning``: the model thinks before each answer (Codex's reasoning loop).
        thought = reasoning if scenario.flag("reasoning") else []
        results = trailing_tool_results(body)
        if results:
            return Plan(reasoning=thought, text=words("Tool result: " + "; ".join(results)))
        functions = declared_functions(body)
        count = 2 if name == "tools-parallel" else 1
        codex_exec = codex_exec_call(functions)
        if codex_exec is not None:
            calls = [
                Call(new_call_id(), codex_exec["name"], codex_exec["arguments"])
                for _ in range(count)
            ]
            return Plan(reasoning=thought, calls=calls, finish="tool_calls")
        tool = (functions or [LOOKUP_TOOL])[0]
        calls = [
            Call(new_call_id(), tool["name"], example_arguments(tool["parameters"]))
            for _ in range(count)
        ]
        return Plan(reasoning=thought, calls=calls, finish="tool_calls")
    plans = {
        "reasoning": lambda: Plan(reasoning=reasoning, text=answer),
        "think": lambda: inline_think(Plan(reasoning=reasoning, text=answer)),
        "refusal": lambda: Plan(refusal=list(REFUSAL)),
        "length": lambda: Plan(text=list(ANSWER[:3]), finish="length"),
        "content-filter": lambda: Plan(text=list(ANSWER[:2]), finish="content_filter"),
        "error-midstream": lambda: Plan(text=list(ANSWER[:2]), finish="error"),
        "echo": lambda: Plan(text=words("Echo: " + last_user_text(body))),
    }
    return plans.get(name, lambda: Plan(text=answer))()


@dataclass(frozen=True)
class Usage:
    input: int
    output: int
    reasoning: int

    @property
    def cached(self) -> int:
        return self.input // 2

    @property
    def cache_write(self) -> int:
        return self.input // 4

    def chat(self) -> JSON:
        return {
            "prompt_tokens": self.input,
            "completion_tokens": self.output,
            "total_tokens": self.input + self.output,
            "prompt_tokens_details": {"cached_tokens": self.cached, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def responses(self) -> JSON:
        return {
            "input_tokens": self.input,
            "input_tokens_details": {
                "cached_tokens": self.cached,
                "cache_write_tokens": self.cache_write,
            },
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": self.reasoning},
            "total_tokens": self.input + self.output,
        }


@dataclass(frozen=True)
class Reply:
    """Everything one rendering of an answer needs besides the plan."""

    number: int
    created: int
    model: str
    body: JSON
    scenario: Scenario
    usage: Usage
    id_prefix: str = ""


# --- Chat Completions rendering ---------------------------------------------------------------


def data_frame(payload: JSON) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chat_reasoning_field(scenario: Scenario) -> str:
    field_name = scenario.options.get("reasoning_field", "reasoning_content")
    return field_name if field_name in ("reasoning", "think") else "reasoning_content"


def chat_plan(plan: Plan, reply: Reply) -> Plan:
    """The plan as a chat server would say it (reasoning inline when asked for ``think``)."""
    return inline_think(plan) if chat_reasoning_field(reply.scenario) == "think" else plan


def chat_chunks(plan: Plan, reply: Reply) -> Iterator[bytes]:
    """The SSE frames of a streamed chat completion."""
    plan = chat_plan(plan, reply)
    include_usage = bool((reply.body.get("stream_options") or {}).get("include_usage"))
    base = {
        "id": f"chatcmpl-fake-{reply.number}",
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": "fp_fake",
    }

    def chunk(delta: JSON, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        extra = {"usage": None} if include_usage else {}
        return data_frame({**base, "choices": [choice], **extra})

    only_calls = bool(plan.calls) and not plan.text
    yield chunk({"role": "assistant", "content": None if only_calls else "", "refusal": None})
    field_name = chat_reasoning_field(reply.scenario)
    for delta in reasoning_deltas(plan):
        yield chunk({field_name: delta})
    for delta in plan.text:
        yield chunk({"content": delta})
    for delta in plan.refusal:
        yield chunk({"refusal": delta})
    for index, call in enumerate(plan.calls):
        function = {"name": call.name, "arguments": ""}
        yield chunk(
            {
                "tool_calls": [
                    {"index": index, "id": call.call_id, "type": "function", "function": function}
                ]
            }
        )
        for fragment in fragments(call.arguments):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    if plan.finish == "error":
        yield data_frame({"error": MIDSTREAM_ERROR})
    else:
        yield chunk({}, plan.finish)
        if include_usage:
            yield data_frame({**base, "choices": [], "usage": reply.usage.chat()})
    yield b"data: [DONE]\n\n"


def chat_completion(plan: Plan, reply: Reply) -> JSON:
    """A non-streamed ``chat.completion`` object."""
    plan = chat_plan(plan, reply)
    message: JSON = {
        "role": "assistant",
        "content": "".join(plan.text) or None,
        "refusal": "".join(plan.refusal) or None,
        "annotations": [],
    }
    if plan.reasoning:
        message[chat_reasoning_field(reply.scenario)] = "".join(reasoning_deltas(plan))
    if plan.calls:
        message["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in plan.calls
        ]
    return {
        "id": f"chatcmpl-fake-{reply.number}",
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "system_fingerprint": "fp_fake",
        "service_tier": "default",
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish}
        ],
        "usage": reply.usage.chat(),
    }


# --- Responses rendering ----------------------------------------------------------------------


class ResponsesEvents:
    """The Responses event sequence for a plan, exactly as OpenAI sends it: the events, their
    order and the Response object they carry.

    Iterating yields event dicts with consecutive ``sequence_number`` from 0; the last one
    is the terminal event whose ``response`` is also the non-streamed answer.
    """

    def __init__(self, plan: Plan, reply: Reply) -> None:
        self.plan = plan
        self.reply = reply
        self.seq = 0
        self.output: list[JSON] = []

    def event(self, kind: str, **fields: Any) -> JSON:
        payload = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return payload

    def response(self, status: str) -> JSON:
        """The Response object, echoing the request's settings."""
        body, terminal = self.reply.body, status != "in_progress"
        reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
        text = body.get("text") if isinstance(body.get("text"), dict) else {}
        return {
            "id": f"resp_fake_{self.reply.id_prefix}{self.reply.number}",
            "object": "response",
            "created_at": self.reply.created,
            "status": status,
            "background": False,
            "completed_at": self.reply.created if status == "completed" else None,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": self.reply.model,
            "output": list(self.output) if terminal else [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": body.get("safety_identifier"),
            "service_tier": body.get("service_tier") or "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium", **text},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_logprobs": body.get("top_logprobs", 0),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": self.reply.usage.responses() if terminal else None,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }

    def __iter__(self) -> Iterator[JSON]:
        yield self.event("response.created", response=self.response("in_progress"))
        yield self.event("response.in_progress", response=self.response("in_progress"))
        if self.plan.reasoning:
            yield from self.reasoning_item()
        if self.plan.text or self.plan.refusal:
            yield from self.message_item()
        for k, call in enumerate(self.plan.calls):
            yield from self.call_item(call, k)
        yield from self.terminal()

    def added(self, item: JSON) -> JSON:
        return self.event("response.output_item.added", output_index=len(self.output), item=item)

    def done(self, item: JSON) -> JSON:
        event = self.event("response.output_item.done", output_index=len(self.output), item=item)
        self.output.append(item)
        return event

    def reasoning_item(self) -> Iterator[JSON]:
        item_id = f"rs_fake_{self.reply.number}"
        ids = {"item_id": item_id, "output_index": len(self.output)}
        yield self.added({"id": item_id, "type": "reasoning", "summary": []})
        summary = []
        for k, part in enumerate(self.plan.reasoning):
            empty = {"type": "summary_text", "text": ""}
            yield self.event(
                "response.reasoning_summary_part.added", **ids, summary_index=k, part=empty
            )
            for delta in part:
                yield self.event(
                    "response.reasoning_summary_text.delta", **ids, summary_index=k, delta=delta
                )
            text = "".join(part)
            yield self.event(
                "response.reasoning_summary_text.done", **ids, summary_index=k, text=text
            )
            summary.append({"type": "summary_text", "text": text})
            yield self.event(
                "response.reasoning_summary_part.done", **ids, summary_index=k, part=summary[-1]
            )
        item: JSON = {"id": item_id, "type": "reasoning", "summary": summary}
        if "reasoning.encrypted_content" in (self.reply.body.get("include") or []):
            item["encrypted_content"] = f"fake-encrypted-{self.reply.number}"
        yield self.done(item)

    def message_item(self) -> Iterator[JSON]:
        item_id = f"msg_fake_{self.reply.number}"
        ids = {"item_id": item_id, "output_index": len(self.output), "content_index": 0}
        refusal = bool(self.plan.refusal)
        yield self.added(
            {
                "id": item_id,
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
        )
        if refusal:
            kind, key, deltas = "response.refusal", "refusal", self.plan.refusal
            empty: JSON = {"type": "refusal", "refusal": ""}
        else:
            kind, key, deltas = "response.output_text", "text", self.plan.text
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self.event("response.content_part.added", **ids, part=empty)
        extra = {} if refusal else {"logprobs": []}
        for delta in deltas:
            yield self.event(f"{kind}.delta", **ids, delta=delta, **extra)
        if self.plan.finish == "error":
            return
        full = "".join(deltas)
        yield self.event(f"{kind}.done", **ids, **{key: full}, **extra)
        part = {**empty, key: full}
        yield self.event("response.content_part.done", **ids, part=part)
        status = "completed" if self.plan.finish == "stop" else "incomplete"
        yield self.done(
            {
                "id": item_id,
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [part],
            }
        )

    def call_item(self, call: Call, k: int) -> Iterator[JSON]:
        item_id = f"fc_fake_{self.reply.number}_{k}"
        ids = {"item_id": item_id, "output_index": len(self.output)}
        item = {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call.call_id,
            "name": call.name,
        }
        yield self.added(item)
        for fragment in fragments(call.arguments):
            yield self.event("response.function_call_arguments.delta", **ids, delta=fragment)
        yield self.event(
            "response.function_call_arguments.done", **ids, arguments=call.arguments, name=call.name
        )
        yield self.done({**item, "status": "completed", "arguments": call.arguments})

    def terminal(self) -> Iterator[JSON]:
        finish = self.plan.finish
        if finish == "error":
            yield self.event("error", error=MIDSTREAM_ERROR)
            response = self.response("failed")
            response["error"] = {"code": "server_error", "message": MIDSTREAM_ERROR["message"]}
            response["usage"] = None
            yield self.event("response.failed", response=response)
        elif finish in ("length", "content_filter"):
            response = self.response("incomplete")
            reason = "max_output_tokens" if finish == "length" else "content_filter"
            response["incomplete_details"] = {"reason": reason}
            yield self.event("response.incomplete", response=response)
        else:
            yield self.event("response.completed", response=self.response("completed"))


LLAMACPP_TERMINAL_KEYS = ("id", "object", "created_at", "status", "model", "output", "usage")


def llamacpp_event(event: JSON) -> JSON:
    """Reshape an event the way llama.cpp's server sends it: no sequence_number,
    output_index or content_index, a minimal response in created/in_progress."""
    dropped = {"sequence_number", "output_index", "content_index"}
    if event["type"].endswith((".delta", ".done")) and "item" not in event and "part" not in event:
        dropped.add("logprobs")
    shaped = {k: v for k, v in event.items() if k not in dropped}
    response = event.get("response")
    if isinstance(response, dict):
        keys = (
            ("id", "object", "status")
            if response["status"] == "in_progress"
            else LLAMACPP_TERMINAL_KEYS
        )
        shaped["response"] = {k: response[k] for k in keys if k in response}
    return shaped


def responses_frames(plan: Plan, reply: Reply) -> Iterator[bytes]:
    """The SSE frames of a streamed Responses answer (``event:`` and ``data:`` lines)."""
    llamacpp = reply.scenario.options.get("flavor") == "llamacpp"
    for event in ResponsesEvents(plan, reply):
        payload = llamacpp_event(event) if llamacpp else event
        yield b"event: " + event["type"].encode() + b"\n" + data_frame(payload)


def responses_object(plan: Plan, reply: Reply) -> JSON:
    """The non-streamed Response: the terminal snapshot of the same event sequence."""
    *_, terminal = ResponsesEvents(plan, reply)
    if reply.scenario.options.get("flavor") == "llamacpp":
        terminal = llamacpp_event(terminal)
    return terminal["response"]


# --- errors -----------------------------------------------------------------------------------


def error_body(status: int, scenario: Scenario | None = None, message: str | None = None) -> JSON:
    """An OpenAI-shaped error object for an HTTP status."""
    kind, code = {
        400: ("invalid_request_error", None),
        401: ("invalid_request_error", "invalid_api_key"),
        403: ("permission_error", None),
        404: ("invalid_request_error", None),
        429: ("requests", "rate_limit_exceeded"),
    }.get(status, ("server_error", None) if status >= 500 else ("invalid_request_error", None))
    if message is None:
        message = f"The fake upstream answered HTTP {status}."
        wait = scenario.options.get("retry_after") if scenario else None
        if status == 429 and wait:
            message = f"Rate limit reached for the fake upstream. Please try again in {wait}s."
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def context_error_body(body: JSON) -> JSON:
    """llama.cpp's answer to a prompt longer than its context (integer code)."""
    tokens = input_chars(body) // 4 + 4096
    return {
        "error": {
            "code": 400,
            "message": f"request ({tokens} tokens) exceeds the available context size "
            "(4096 tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": tokens,
            "n_ctx": 4096,
        }
    }


# --- HTTP -------------------------------------------------------------------------------------


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """Read one request; None on a clean end of the connection."""
    line = await reader.readline()
    while line in (b"\r\n", b"\n"):
        line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise BadRequest(400, "malformed request line")
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep:
            raise BadRequest(400, "malformed header line")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BadRequest(411, "Chunked request bodies are not supported; send Content-Length.")
    try:
        length = int(headers.get("content-length") or 0)
    except ValueError:
        raise BadRequest(400, "bad content-length") from None
    body = await reader.readexactly(length) if length > 0 else b""
    return Request(parts[0].upper(), parts[1], parts[2], headers, body)


def response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", "server: llmitm-fake-upstream"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def api_of(path: str) -> str | None:
    """Which API a POST path asks for: any prefix, Azure and /openai/v1 forms included."""
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/responses"):
        return "responses"
    return None


def azure_deployment(path: str) -> str | None:
    match = re.search(r"/openai/deployments/([^/]+)/", path)
    return match.group(1) if match else None


def retry_headers(scenario: Scenario) -> list[tuple[str, str]]:
    headers = []
    if "retry_after" in scenario.options:
        headers.append(("retry-after", scenario.options["retry_after"]))
    if "retry_after_ms" in scenario.options:
        headers.append(("retry-after-ms", scenario.options["retry_after_ms"]))
    return headers


class FakeUpstream:
    """The fake server. ``async with FakeUpstream() as fake`` or ``start()``/``stop()``.

    ``requests`` lists every API request received (method, path with query, lower-cased
    headers, parsed JSON body); ids stay unique for the server's life, also across resets.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        apis: Iterable[str] = API_NAMES,
        log_path: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.time,
        fault: str = "",
        id_prefix: str = "",
    ) -> None:
        self.host = host
        self.fault = fault
        self.id_prefix = id_prefix
        """Put in the response ids it mints, so several fakes never mint the same id."""
        """Scenario options forced on every API request (``status=429;retry_after=1``)."""
        self.apis = frozenset(apis)
        unknown = self.apis - API_NAMES
        if unknown or not self.apis:
            raise ValueError(f"apis must be a non-empty subset of {sorted(API_NAMES)}")
        self.log_path = Path(log_path) if log_path else None
        self.clock = clock
        self.requests: list[JSON] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._faulted = 0  # API requests seen since the fault was set (``times=N``)
        self._answers = itertools.count(1)
        self._calls = itertools.count(1)

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def stats(self) -> JSON:
        return {
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "requests": len(self.requests),
        }

    def reset(self) -> None:
        """Forget recorded requests and the concurrency high-water mark."""
        self.requests.clear()
        self.max_in_flight = self.in_flight

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and abort connections still open (streams in flight included)."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # connection handling

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while (request := await read_request(reader)) is not None:
                if not await self._dispatch(request, reader, writer):
                    break
        except BadRequest as exc:
            body = error_body(exc.status, message=str(exc))
            with contextlib.suppress(ConnectionError):
                await self._send_json(writer, exc.status, body, keep_alive=False)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _dispatch(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; return whether the connection may be reused."""
        path, method, keep = request.path, request.method, request.keep_alive
        if method == "GET" and path == "/_requests":
            return await self._send_json(writer, 200, self.requests, keep)
        if method == "GET" and path == "/_stats":
            return await self._send_json(writer, 200, self.stats(), keep)
        if method == "POST" and path == "/_fault":
            self.fault = request.body.decode("utf-8", "replace").strip()
            self._faulted = 0
            return await self._send_json(writer, 200, {"fault": self.fault}, keep)
        if method == "POST" and path == "/_reset":
            self.reset()
            return await self._send_json(writer, 200, {"ok": True}, keep)
        if method == "GET" and path.rstrip("/").endswith("/models"):
            return await self._send_json(writer, 200, models_list(), keep)
        api = api_of(path)
        if method == "POST" and api is not None:
            return await self._api_request(request, api, reader, writer)
        body = error_body(404, message=f"Invalid URL ({method} {path})")
        return await self._send_json(writer, 404, body, keep)

    async def _api_request(
        self,
        request: Request,
        api: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        try:
            body = orjson.loads(request.body) if request.body else None
        except orjson.JSONDecodeError:
            body = None
        self._record(request, api, body)
        keep = request.keep_alive
        if not isinstance(body, dict):
            message = "We could not parse the JSON body of your request."
            return await self._send_json(writer, 400, error_body(400, message=message), keep)
        if api not in self.apis:
            message = f"Invalid URL ({request.method} {request.path})"
            return await self._send_json(writer, 404, error_body(404, message=message), keep)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        counted = True

        def uncount(watch: asyncio.Future[bytes] | None = None) -> None:
            nonlocal counted
            if watch is not None and not _hung_up(watch):
                return
            if counted:
                counted = False
                self.in_flight -= 1

        # A request stops counting the moment its client hangs up (EOF), not when the
        # answer's next write fails: a proxy that frees a concurrency slot on a client abort
        # must not look as if it overshot its cap. No new request can arrive before the
        # answer's last bytes, so watching the reader until then consumes nothing.
        watch = asyncio.ensure_future(reader.read(1))
        watch.add_done_callback(uncount)
        token = _WATCH.set(watch)
        try:
            return await self._answer(request, api, body, writer)
        finally:
            _WATCH.reset(token)
            watch.cancel()
            # Let the cancelled watch finish before the next request is read on this
            # connection (a keep-alive client sends it at once): two reads of one stream at
            # a time is an error.
            await asyncio.wait({watch})
            uncount()

    def _record(self, request: Request, api: str, body: Any) -> None:
        record = {
            "method": request.method,
            "path": request.target,
            "headers": dict(request.headers),
            "body": body,
            "api": api,
        }
        self.requests.append(record)
        if self.log_path is not None:
            with self.log_path.open("ab") as log:
                log.write(orjson.dumps(record) + b"\n")

    async def _answer(
        self, request: Request, api: str, body: JSON, writer: asyncio.StreamWriter
    ) -> bool:
        model = body.get("model") or azure_deployment(request.path) or "fake-model"
        spec = request.headers.get("x-fake-scenario") or str(model)
        scenario = choose_scenario(spec, body)
        if self.fault:
            _name, forced = parse_spec("x;" + self.fault)
            times = forced.pop("times", None)
            self._faulted += 1
            if times is None or not times.isdigit() or self._faulted <= int(times):
                scenario = Scenario(scenario.name, {**scenario.options, **forced})
        keep = request.keep_alive
        delay = scenario.number("first_byte_delay_ms")
        if delay:
            await asyncio.sleep(delay / 1000)
        if scenario.flag("reset_before_headers"):
            writer.transport.abort()
            return False
        if scenario.flag("not_http"):
            writer.write(b"SSH-2.0-not-an-http-server\r\n\r\n")
            await writer.drain()
            writer.close()
            return False
        status = scenario.number("status")
        if status and status >= 400:
            return await self._send_json(
                writer, status, error_body(status, scenario), keep, retry_headers(scenario)
            )
        if scenario.flag("context_error"):
            return await self._send_json(writer, 400, context_error_body(body), keep)
        plan = build_plan(scenario, body, lambda: f"call_fake_{next(self._calls)}")
        usage = Usage(input_chars(body) // 4 + 1, plan.output_tokens(), plan.reasoning_tokens())
        reply = Reply(
            next(self._answers),
            int(self.clock()),
            str(model),
            body,
            scenario,
            usage,
            self.id_prefix,
        )
        if body.get("stream") is True:
            frames = chat_chunks(plan, reply) if api == "chat" else responses_frames(plan, reply)
            return await self._send_stream(writer, frames, scenario) and keep
        if plan.finish == "error":
            return await self._send_json(writer, 500, {"error": MIDSTREAM_ERROR}, keep)
        answer = chat_completion(plan, reply) if api == "chat" else responses_object(plan, reply)
        if scenario.flag("short_body"):
            return await self._send_short(writer, answer)
        return await self._send_json(writer, 200, answer, keep)

    async def _send_short(self, writer: asyncio.StreamWriter, payload: Any) -> bool:
        """Announce the whole body, send half of it, and close: a plain body cut short."""
        _stop_watch()
        data = orjson.dumps(payload)
        head = [("content-type", "application/json"), ("content-length", str(len(data)))]
        writer.write(response_head(200, head) + data[: len(data) // 2])
        await writer.drain()
        writer.transport.abort()
        return False

    async def _send_json(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        payload: Any,
        keep_alive: bool,
        extra: Iterable[tuple[str, str]] = (),
    ) -> bool:
        _stop_watch()
        data = orjson.dumps(payload)
        headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
        if not keep_alive:
            headers.append(("connection", "close"))
        writer.write(response_head(status, [*headers, *extra]) + data)
        await writer.drain()
        return keep_alive

    async def _send_stream(
        self, writer: asyncio.StreamWriter, frames: Iterator[bytes], scenario: Scenario
    ) -> bool:
        """Write one SSE event per chunk, with the scenario's faults; False if cut."""
        headers = [
            ("content-type", "text/event-stream; charset=utf-8"),
            ("cache-control", "no-cache"),
            ("transfer-encoding", "chunked"),
        ]
        writer.write(response_head(200, headers))
        await writer.drain()
        cut = scenario.number("disconnect_after")
        stall = scenario.number("stall_after")
        delay = (scenario.number("event_delay_ms") or 0) / 1000
        for sent, frame in enumerate(frames):
            if cut is not None and sent >= cut:
                writer.transport.abort()
                return False
            if stall is not None and sent >= stall:
                await _stall_until_hang_up()
                writer.transport.abort()
                return False
            if delay and sent:
                await asyncio.sleep(delay)
            if reader_gone():
                writer.transport.abort()
                return False
            if sent == 2 and scenario.flag("garbage"):
                await write_chunk(writer, GARBAGE_FRAME)
            await write_chunk(writer, frame)
        _stop_watch()
        end_delay = scenario.number("end_delay_ms")
        if end_delay:
            await asyncio.sleep(end_delay / 1000)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


_WATCH: contextvars.ContextVar[asyncio.Future[bytes] | None] = contextvars.ContextVar(
    "fake_upstream_watch", default=None
)


def _stop_watch() -> None:
    """Stop watching the client before the answer's last bytes (after them it may send its
    next request on the connection, which the watch must not eat)."""
    watch = _WATCH.get()
    if watch is not None:
        watch.cancel()


def _hung_up(watch: asyncio.Future[bytes]) -> bool:
    """Whether a finished watch saw the client go (EOF or a reset), not data."""
    if not watch.done() or watch.cancelled():
        return False
    return watch.exception() is not None or watch.result() == b""


async def _stall_until_hang_up(limit: float = 60.0) -> None:
    """Send nothing, with the connection open, until the client goes (bounded)."""
    watch = _WATCH.get()
    if watch is None:
        await asyncio.sleep(limit)
        return
    with contextlib.suppress(TimeoutError, asyncio.CancelledError, ConnectionError):
        await asyncio.wait_for(asyncio.shield(watch), limit)


def reader_gone() -> bool:
    watch = _WATCH.get()
    return watch is not None and _hung_up(watch)


async def write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


def models_list() -> JSON:
    ids = ["fake-model", *SCENARIOS]
    return {
        "object": "list",
        "data": [{"id": i, "object": "model", "created": 0, "owned_by": "llmitm"} for i in ids],
    }


# --- running it -------------------------------------------------------------------------------


@contextlib.contextmanager
def serve_in_thread(**kwargs: Any) -> Iterator[FakeUpstream]:
    """Run a FakeUpstream on a background event loop, for synchronous tests and scripts."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-upstream", daemon=True)
    thread.start()
    fake = FakeUpstream(**kwargs)
    try:
        asyncio.run_coroutine_threadsafe(fake.start(), loop).result(timeout=10)
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def parse_apis(value: str) -> frozenset[str]:
    apis = frozenset(part.strip() for part in value.split(",") if part.strip())
    if not apis or apis - API_NAMES:
        raise argparse.ArgumentTypeError("expected chat, responses or chat,responses")
    return apis


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--apis", type=parse_apis, default=API_NAMES, help="chat,responses")
    parser.add_argument("--log", type=Path, help="append every API request as a JSON line")
    parser.add_argument(
        "--fault", default="", help="scenario options forced on every request, e.g. status=500"
    )
    parser.add_argument(
        "--id-prefix", default="", help="put in every response id (several fakes: distinct ids)"
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    fake = FakeUpstream(
        host=args.host,
        port=args.port,
        apis=args.apis,
        log_path=args.log,
        fault=args.fault,
        id_prefix=args.id_prefix,
    )
    await fake.start()
    if args.port_file:
        partial = args.port_file.with_name(args.port_file.name + ".tmp")
        partial.write_text(f"{fake.port}\n")
        partial.replace(args.port_file)
    print(f"fake upstream listening on {fake.base_url} ({','.join(sorted(fake.apis))})", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await fake.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
