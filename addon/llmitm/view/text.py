"""A ``Conversation`` as plain text: what the content view shows in mitmproxy and mitmweb.

Plain text because mitmproxy's content views return a string (with one of a few fixed syntax
highlighters); sections are marked with rules so the text reads well in both UIs.
"""

from __future__ import annotations

import json
import textwrap

from llmitm.view.conversation import Block, Conversation

API_NAMES = {"chat": "Chat Completions", "responses": "Responses"}
KIND_NAMES = {"request": "request", "response": "response", "stream": "stream", "error": "error"}


def pretty_arguments(arguments: str) -> str:
    """Tool-call arguments indented when they are JSON, as they came when not (yet)."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return json.dumps(parsed, indent=2, ensure_ascii=False)


def usage_text(usage: tuple[int, int, int, int]) -> str:
    input_tokens, cached, output, reasoning = usage
    text = f"{input_tokens:,} in"
    if cached:
        text += f" ({cached:,} cached)"
    text += f" · {output:,} out"
    if reasoning:
        text += f" ({reasoning:,} reasoning)"
    return text


def _indent(text: str, prefix: str = "  ") -> str:
    return textwrap.indent(text, prefix, lambda _line: True)


def block_text(block: Block) -> str:
    if block.kind == "text":
        return block.text
    if block.kind == "reasoning":
        return "[reasoning]\n" + _indent(block.text)
    if block.kind == "refusal":
        return "[refusal] " + block.text
    if block.kind == "tool_call":
        head = f"[tool call] {block.name or '?'}"
        if block.call_id:
            head += f"  ({block.call_id})"
        return head + ("\n" + _indent(pretty_arguments(block.text)) if block.text else "")
    if block.kind == "tool_result":
        head = "[tool result]" + (f"  ({block.call_id})" if block.call_id else "")
        return head + "\n" + _indent(pretty_arguments(block.text))
    return block.text


def headline(conversation: Conversation) -> str:
    api = API_NAMES.get(conversation.api or "", "OpenAI")
    parts = [f"llmitm · {api} {KIND_NAMES[conversation.kind]}"]
    if conversation.model:
        parts.append(f"model {conversation.model}")
    if conversation.id:
        parts.append(conversation.id)
    return " · ".join(parts)


def conversation_text(conversation: Conversation, *, events: bool = True) -> str:
    lines = [headline(conversation)]
    facts = []
    if conversation.finish:
        facts.append(f"finish: {conversation.finish}")
    if conversation.usage:
        facts.append(f"usage: {usage_text(conversation.usage)}")
    if conversation.tools:
        facts.append(f"tools: {', '.join(conversation.tools)}")
    if facts:
        lines.append(" · ".join(facts))
    if conversation.error:
        lines.append(f"ERROR: {conversation.error}")
    for message in conversation.messages:
        lines.append("")
        lines.append(f"── {message.role} " + "─" * max(3, 40 - len(message.role)))
        lines.extend(block_text(block) for block in message.blocks)
        if not message.blocks:
            lines.append("(empty)")
    if events and conversation.events:
        total = sum(conversation.events.values())
        tally = ", ".join(f"{count} {name}" for name, count in conversation.events.items())
        lines += ["", f"── {total} events " + "─" * 30]
        lines += textwrap.wrap(tally, 96)
        lines.append("(the raw events: choose the Raw view)")
    return "\n".join(lines) + "\n"
