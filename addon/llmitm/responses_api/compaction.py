"""Responses compaction for endpoints that have none of their own (chat-only endpoints, and
``compatible`` Responses servers such as llama.cpp's).

Clients ask for it in two ways:

- ``POST …/responses/compact`` (openai-python's ``client.responses.compact``): ``model``,
  ``input``, ``instructions``. OpenAI answers a ``response.compaction`` object whose
  ``output`` is the input's user messages followed by one ``compaction`` item;
- a create call whose ``input`` holds a ``compaction_trigger`` item (Codex's
  ``remote_compaction_v2``): an ordinary Response, streamed or not, whose output is exactly
  one ``compaction`` item. Codex keeps the messages it wants itself and puts the item after
  them in every later request.

llmitm runs either as one ordinary summarisation call (a Responses create the router
routes and translates like any other) over a plain-text transcript of the conversation, so
no backend needs to take tool schemas or roles it does not know. The summary goes back
sealed in the item's ``encrypted_content`` (as reasoning is, :mod:`.seal`): the client sees
an opaque token, as it would from OpenAI. When the item comes back in a later request,
:func:`restore_compactions` opens it into a user message carrying the summary, which every
chat and Responses backend takes.

Pure functions: bodies in, bodies out; the seal, ids and clock are handed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from llmitm.errors import InputError
from llmitm.responses_api.seal import ReasoningSeal
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import IdFactory
from llmitm.wire.objects import ECHOED_REQUEST_FIELDS
from llmitm.wire.sse import encode_typed

Form = Literal["compact", "trigger"]

COMPACTION = "compaction"
"""The item type, and the seal's kind for the summaries it carries."""
TRIGGER = "compaction_trigger"
ITEM_TYPES = frozenset({COMPACTION, "compaction_summary"})  # the second: an older spelling
_BOOKKEEPING = frozenset(
    {TRIGGER, "reasoning", "additional_tools", "configuration_update", "item_reference"}
)

SUMMARY_INSTRUCTIONS = (
    "You write the hand-off notes for a conversation between a user and an AI assistant "
    "whose context window is full. The earlier part of the conversation will be dropped and "
    "the assistant will continue from your notes alone (it still sees the user's messages). "
    "Write a concise summary covering: what the user asked for and any corrections or "
    "constraints they gave; decisions made; what has been done so far (commands run, files "
    "read or changed, their results); facts learned that the rest of the work depends on; "
    "and what remains to be done next. Keep file paths, identifiers, commands and error "
    "messages exact. Do not answer or continue the conversation: write only the summary."
)
TRANSCRIPT_INTRO = "Summarise this conversation so far for the assistant that continues it."
SUMMARY_PREFIX = (
    "Summary of the conversation before this point (the earlier messages were compacted "
    "to save context):\n\n"
)

MAX_BLOCK_CHARS = 6000
"""One item's text in the transcript is kept to this many characters (its start and end):
a compaction runs when the context is full, and tool outputs are what fills it."""

_COMPACT_PATH = re.compile(r"^(?P<create>.*/responses)/compact/?$")


@dataclass(slots=True)
class CompactionCall:
    """What the answer needs to know about a compaction llmitm emulates."""

    form: Form
    stream: bool = False
    """``trigger`` form: the client asked for an event stream."""
    kept: tuple[dict[str, Any], ...] = ()
    """``compact`` form: the input's user messages, which lead the output."""
    endpoint: str = ""
    echo: dict[str, Any] = field(default_factory=dict)
    """The client's request fields a Response object repeats back (not the summariser's)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        # mitmproxy saves flow.metadata with its plain-data file format (addons/state.py).
        return {"form": self.form, "stream": self.stream}


class CompactionError(InputError):
    """A compaction request llmitm cannot run, as the OpenAI error the client gets."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


# --- requests --------------------------------------------------------------------------------


def create_path(path: str) -> str | None:
    """The create call's path (with the query) for a ``…/responses/compact`` path, in any of
    OpenAI's and Azure's forms; ``None`` when ``path`` is not a compact call."""
    route, sep, query = path.partition("?")
    match = _COMPACT_PATH.match(route)
    if match is None:
        return None
    return f"{match['create']}{sep}{query}"


def has_trigger(body: dict[str, Any]) -> bool:
    """Whether a create call's ``input`` asks for a compaction (``compaction_trigger``)."""
    items = body.get("input")
    return isinstance(items, list) and any(
        isinstance(item, dict) and item.get("type") == TRIGGER for item in items
    )


def summary_request(body: dict[str, Any], form: Form) -> tuple[dict[str, Any], CompactionCall]:
    """The summarisation call to run for the compaction ``body`` asks for, and what its
    answer must become. Raises :class:`CompactionError` for a body OpenAI would refuse."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        message = "Missing required parameter: 'model'."
        raise _invalid(message, "model", "missing_required_parameter")
    items = _input_items(body.get("input"))
    conversation = [item for item in items if item.get("type") != TRIGGER]
    text = transcript(conversation)
    if not text:
        raise _invalid("There is nothing to compact: 'input' holds no conversation.", "input")
    request = {
        "model": model,
        "instructions": SUMMARY_INSTRUCTIONS,
        "input": [_user_message(f"{TRANSCRIPT_INTRO}\n\n<conversation>\n{text}\n</conversation>")],
        "stream": False,
        "store": False,
    }
    if isinstance(body.get("max_output_tokens"), int):
        request["max_output_tokens"] = body["max_output_tokens"]  # it bounds the summary
    call = CompactionCall(form=form, stream=form == "trigger" and body.get("stream") is True)
    call.echo = {key: body[key] for key in ECHOED_REQUEST_FIELDS if key in body}
    call.echo.setdefault("instructions", None)
    if form == "compact":
        call.kept = tuple(item for item in conversation if _is_user_message(item))
    return request, call


def transcript(items: Iterable[dict[str, Any]]) -> str:
    """The conversation as plain text, one block per item, for the summariser to read.
    Reasoning, tool declarations and other bookkeeping items are left out."""
    blocks = [block for item in items if (block := _block(item))]
    return "\n\n".join(blocks)


def _block(item: dict[str, Any]) -> str:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        text = content_text(item.get("content"))
        return f"[{item.get('role', 'user')}]\n{_clip(text)}" if text else ""
    if kind in ("function_call", "custom_tool_call"):
        name = str(item.get("name", "?"))
        if isinstance(item.get("namespace"), str):
            name = f"{item['namespace']}.{name}"
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        return f"[assistant called tool {name}]\n{_clip(_as_text(arguments))}"
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else content_text(output)
        return f"[tool output for call {item.get('call_id', '?')}]\n{_clip(text)}"
    if kind in ITEM_TYPES:
        # Not opened by restore_compactions: another provider's, unreadable here.
        return "[an earlier part of the conversation was compacted elsewhere; not available]"
    if kind in _BOOKKEEPING:
        return ""
    # An item type this module does not know (a hosted tool's call, a client's own kind):
    # whatever text it carries is still conversation.
    text = content_text(item.get("content")) or _as_text(item.get("output") or "")
    return f"[{kind}]\n{_clip(text)}" if text and isinstance(kind, str) else ""


def content_text(content: Any) -> str:
    """The readable text of message content (a string or parts); media become markers."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            kind = part.get("type")
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(f"[refusal] {part['refusal']}")
            elif kind in ("input_image", "image_url"):
                texts.append("[image]")
            elif kind == "input_file":
                texts.append(f"[file {part.get('filename') or ''}]".replace(" ]", "]"))
            elif kind == "input_audio":
                texts.append("[audio]")
    return "\n".join(texts)


def _clip(text: str, limit: int = MAX_BLOCK_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    left_out = len(text) - 2 * half
    return f"{text[:half]}\n[… {left_out} characters left out …]\n{text[-half:]}"


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode() if value is not None else ""


def _input_items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [_user_message(value)]
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _invalid("'input' must be a string or a list of input items.", "input")
    return value


def _is_user_message(item: dict[str, Any]) -> bool:
    kind = item.get("type") or ("message" if "role" in item else None)
    return kind == "message" and item.get("role") == "user"


def _user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _invalid(message: str, param: str, code: str | None = None) -> CompactionError:
    return CompactionError(
        ApiError(message=message, type="invalid_request_error", param=param, code=code, status=400)
    )


# --- answers ---------------------------------------------------------------------------------


def summary_text(response: Any) -> str:
    """The text of the summarisation call's answer (a Response object's output messages)."""
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return ""
    texts = [
        part["text"]
        for item in response["output"]
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or ()
        if isinstance(part, dict)
        and part.get("type") == "output_text"
        and isinstance(part.get("text"), str)
    ]
    return "".join(texts).strip()


def no_summary(endpoint: str) -> ApiError:
    """The error for an endpoint that answered without any summary text."""
    return ApiError(
        message=f"The endpoint {endpoint or 'upstream'} answered the compaction's summarisation "
        "call without any text, so there is nothing to compact the conversation into.",
        type="server_error",
        code="compaction_failed",
        status=502,
    )


def compaction_item(item_id: str, token: str) -> dict[str, Any]:
    return {"id": item_id, "type": COMPACTION, "encrypted_content": token}


def compacted_response(
    response: dict[str, Any], call: CompactionCall, item: dict[str, Any], ids: IdFactory
) -> dict[str, Any]:
    """OpenAI's ``response.compaction`` object: the kept user messages, then ``item``."""
    kept = [_output_message(message, ids) for message in call.kept]
    return {
        "id": response.get("id") or ids("resp"),
        "object": "response.compaction",
        "created_at": response.get("created_at"),
        "output": [*kept, item],
        "usage": response.get("usage"),
    }


def _output_message(message: dict[str, Any], ids: IdFactory) -> dict[str, Any]:
    content = message.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {
        "id": message.get("id") or ids("msg"),
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": parts if isinstance(parts, list) else [],
    }


def triggered_response(
    response: dict[str, Any], call: CompactionCall, item: dict[str, Any]
) -> dict[str, Any]:
    """The Response a ``compaction_trigger`` call gets: the summarisation call's (its id,
    times and usage), repeating the client's request, with the compaction item as its only
    output. A summary cut short by the backend's token limit is still a summary: the
    compaction completed."""
    done = {"output": [item], "status": "completed", "incomplete_details": None, "error": None}
    return {**response, **call.echo, **done}


def triggered_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a finished triggered Response, in the order OpenAI sends them (a
    transport sends each as one frame or message)."""
    item = response["output"][0]
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    started["completed_at"] = None
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return [
        {"type": event["type"], "sequence_number": sequence, **event}
        for sequence, event in enumerate(events)
    ]


def event_stream(events: Iterable[dict[str, Any]]) -> bytes:
    """``events`` as one SSE body."""
    return b"".join(encode_typed(event["type"], orjson.dumps(event)) for event in events)


# --- later requests --------------------------------------------------------------------------


def summary_message(text: str) -> dict[str, Any]:
    """What an opened compaction item becomes: a user message carrying the summary."""
    return _user_message(f"{SUMMARY_PREFIX}{text}")


def restore_compactions(items: Any, seal: ReasoningSeal) -> int:
    """Open llmitm's compaction items in a request's ``input`` (in place) into the summary
    messages they stand for; returns how many. Another provider's items are left as they
    are: its own endpoint may be able to read them."""
    if not isinstance(items, list):
        return 0
    restored = 0
    for index, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type") not in ITEM_TYPES:
            continue
        text = seal.open_text(item.get("encrypted_content"), COMPACTION)
        if text is not None:
            items[index] = summary_message(text)
            restored += 1
    return restored


def drop_unopened(items: Any) -> int:
    """Remove the compaction items still in ``input`` (in place), for an endpoint that cannot
    read them: :func:`restore_compactions` has opened llmitm's own, so these are another
    provider's, or sealed under a key this llmitm no longer has. Returns how many."""
    if not isinstance(items, list):
        return 0
    kept = [
        item for item in items if not (isinstance(item, dict) and item.get("type") in ITEM_TYPES)
    ]
    dropped = len(items) - len(kept)
    items[:] = kept
    return dropped
