"""The Conversations API, emulated on llmitm's store over any backend: which requests are
its calls, OpenAI's bodies and errors for them, and what a call changes.

- ``POST   …/conversations`` (``items`` up to 20, ``metadata``) → the conversation;
- ``GET    …/conversations/{id}``, ``POST`` (new ``metadata``), ``DELETE``;
- ``GET    …/conversations/{id}/items`` (``after``, ``limit``, ``order``, ``include``) → a
  list page; ``POST`` (``items``) → the list of items added;
- ``GET``/``DELETE …/conversations/{id}/items/{item_id}`` → the item / the conversation.

Pure functions: :func:`conversation_call` classifies, :func:`answer_call` turns a call, the
stored conversation and its items into a :class:`Outcome` — the answer and the writes the
shell submits. A ``conversation`` on ``responses.create`` is :func:`conversation_id` and
:func:`conversation_history` (the items put before the new input); after the response the
new input and output items are appended (:func:`turn_items`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl

import orjson

from llmitm.responses_api.answers import LocalAnswer, error_answer, invalid
from llmitm.responses_api.conversation_records import (
    ConversationDeleted,
    ConversationItemDeleted,
    ConversationItemsAdded,
    ConversationReader,
    ConversationSaved,
    ConversationWrite,
    StoredConversation,
)
from llmitm.responses_api.items import PageError, input_items, list_page
from llmitm.wire.errors import ApiError
from llmitm.wire.ids import IdFactory

Action = Literal[
    "create", "retrieve", "update", "delete", "list_items", "add_items", "item", "delete_item"
]

_PATH = re.compile(
    r"^(?P<prefix>.*?)/conversations(?:/(?P<id>[A-Za-z0-9_\-.]+)"
    r"(?P<items>/items(?:/(?P<item>[A-Za-z0-9_\-.]+))?)?)?/?$"
)
_ACTIONS: dict[tuple[str, bool, bool, bool], Action] = {
    # (method, has id, has /items, has item id)
    ("POST", False, False, False): "create",
    ("GET", True, False, False): "retrieve",
    ("POST", True, False, False): "update",
    ("DELETE", True, False, False): "delete",
    ("GET", True, True, False): "list_items",
    ("POST", True, True, False): "add_items",
    ("GET", True, True, True): "item",
    ("DELETE", True, True, True): "delete_item",
}
MAX_ITEMS = 20
_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512
_DROP = ("id", "status")  # bookkeeping, not conversation (as in .chain)


@dataclass(frozen=True, slots=True)
class ConversationCall:
    action: Action
    conversation_id: str | None = None
    item_id: str | None = None
    query: list[tuple[str, str]] = field(default_factory=list)

    def param(self, name: str) -> str | None:
        values = [value for key, value in self.query if key == name]
        return values[-1] if values else None


@dataclass(slots=True)
class Outcome:
    answer: LocalAnswer
    writes: list[ConversationWrite] = field(default_factory=list)


def conversation_call(method: str, path: str) -> ConversationCall | None:
    """The Conversations call ``method path`` makes, or ``None``."""
    route, _, query = path.partition("?")
    match = _PATH.match(route)
    if match is None:
        return None
    key = (method.upper(), match["id"] is not None, match["items"] is not None, bool(match["item"]))
    action = _ACTIONS.get(key)
    if action is None:
        return None
    pairs = parse_qsl(query, keep_blank_values=True)
    return ConversationCall(action, match["id"], match["item"], pairs)


# -- OpenAI's bodies and errors -------------------------------------------------------------


def conversation_object(conversation: StoredConversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": int(conversation.created_at),
        "metadata": conversation.metadata,
    }


def not_found(conversation_id: str) -> LocalAnswer:
    return _not_found(f"Conversation with id '{conversation_id}' not found.")


def item_not_found(item_id: str) -> LocalAnswer:
    return _not_found(f"Item with id '{item_id}' not found.")


def _not_found(message: str) -> LocalAnswer:
    return error_answer(
        ApiError(message=message, type="invalid_request_error", code="not_found", status=404)
    )


def conversation_error(conversation_id: str) -> ApiError:
    """The 404 of a ``responses.create`` naming a conversation llmitm does not have."""
    return ApiError(
        message=f"Conversation with id '{conversation_id}' not found.",
        type="invalid_request_error",
        param="conversation",
        code="not_found",
        status=404,
    )


# -- calls ---------------------------------------------------------------------------------


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.answer = invalid(message, param)


def create(body: Any, *, ids: IdFactory, now: float, credential: str | None) -> Outcome:
    """``POST /conversations``: a new conversation, with its first items."""
    try:
        fields = _object(body)
        metadata = _metadata(fields.get("metadata"))
        items = _items(fields.get("items"), ids, required=False)
    except BadRequest as bad:
        return Outcome(bad.answer)
    conversation = StoredConversation(ids("conv"), now, metadata, credential)
    writes: list[ConversationWrite] = [ConversationSaved(conversation)]
    if items:
        writes.append(ConversationItemsAdded(conversation.id, tuple(items)))
    return Outcome(LocalAnswer(200, conversation_object(conversation)), writes)


def answer_call(
    call: ConversationCall,
    conversation: StoredConversation,
    items: list[dict[str, Any]],
    body: Any,
    ids: IdFactory,
) -> Outcome:
    """Any call on an existing conversation (``items``: its items, oldest first)."""
    try:
        if call.action == "retrieve":
            return Outcome(LocalAnswer(200, conversation_object(conversation)))
        if call.action == "update":
            fields = _object(body)
            if "metadata" not in fields:
                raise BadRequest("Missing required parameter: 'metadata'.", "metadata")
            updated = StoredConversation(
                conversation.id,
                conversation.created_at,
                _metadata(fields["metadata"]),
                conversation.credential,
            )
            return Outcome(
                LocalAnswer(200, conversation_object(updated)), [ConversationSaved(updated)]
            )
        if call.action == "delete":
            deleted = {"id": conversation.id, "object": "conversation.deleted", "deleted": True}
            return Outcome(LocalAnswer(200, deleted), [ConversationDeleted(conversation.id)])
        if call.action == "list_items":
            return Outcome(LocalAnswer(200, _page(items, call)))
        if call.action == "add_items":
            added = _items(_object(body).get("items"), ids, required=True)
            page = {
                "object": "list",
                "data": added,
                "first_id": added[0]["id"],
                "last_id": added[-1]["id"],
                "has_more": False,
            }
            return Outcome(
                LocalAnswer(200, page), [ConversationItemsAdded(conversation.id, tuple(added))]
            )
        found = next((item for item in items if item.get("id") == call.item_id), None)
        if found is None:
            return Outcome(item_not_found(call.item_id or ""))
        if call.action == "item":
            return Outcome(LocalAnswer(200, found))
        delete = ConversationItemDeleted(conversation.id, call.item_id or "")
        return Outcome(LocalAnswer(200, conversation_object(conversation)), [delete])
    except BadRequest as bad:
        return Outcome(bad.answer)


def _page(items: list[dict[str, Any]], call: ConversationCall) -> dict[str, Any]:
    try:
        return list_page(
            items, limit=call.param("limit"), order=call.param("order"), after=call.param("after")
        )
    except PageError as exc:
        raise BadRequest(exc.message, exc.param) from None


def _object(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.", None)
    return body


def _metadata(value: Any) -> dict[str, str]:
    """OpenAI's metadata: up to 16 string pairs, keys up to 64 and values up to 512 chars."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest("Invalid 'metadata': expected an object of string values.", "metadata")
    if len(value) > _METADATA_KEYS:
        raise BadRequest(
            f"Invalid 'metadata': at most {_METADATA_KEYS} keys, got {len(value)}.", "metadata"
        )
    for key, text in value.items():
        if len(key) > _METADATA_KEY_CHARS or len(text) > _METADATA_VALUE_CHARS:
            raise BadRequest(
                f"Invalid 'metadata': keys are at most {_METADATA_KEY_CHARS} characters and "
                f"values at most {_METADATA_VALUE_CHARS}.",
                "metadata",
            )
    return dict(value)


def _items(value: Any, ids: IdFactory, *, required: bool) -> list[dict[str, Any]]:
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise BadRequest("Invalid 'items': expected an array of item objects.", "items")
    if required and not value:
        raise BadRequest("Invalid 'items': expected at least one item.", "items")
    if len(value) > MAX_ITEMS:
        raise BadRequest(
            f"Invalid 'items': at most {MAX_ITEMS} items at once, got {len(value)}.", "items"
        )
    return input_items(value, ids)


# -- a conversation on responses.create ----------------------------------------------------


def conversation_id(value: Any) -> str | None:
    """The id a create call's ``conversation`` names (a string or ``{"id": …}``)."""
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and value else None


def conversation_history(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's items as the input before the new one: conversation, not references."""
    return [{k: v for k, v in item.items() if k not in _DROP} for item in items]


def turn_items(
    new_input: list[dict[str, Any]], response: dict[str, Any]
) -> tuple[dict[str, Any], ...]:
    """What a finished response adds to its conversation: the request's own input items,
    then the response's output items (each with its id)."""
    output = response.get("output")
    produced = [
        item for item in (output if isinstance(output, list) else []) if isinstance(item, dict)
    ]
    return tuple(
        orjson.loads(orjson.dumps(item)) for item in [*new_input, *produced] if "id" in item
    )


async def inline_conversation(
    body: dict[str, Any],
    reader: ConversationReader,
    credential: str | None,
    ids: IdFactory,
    *,
    previous_response_id: str | None = None,
    own_items: list[dict[str, Any]] | None = None,
) -> tuple[str | None, list[dict[str, Any]], ApiError | None]:
    """Put the items of the conversation ``body`` names before its input (in place) and
    drop ``conversation``: the conversation's id, the request's own input items (with ids,
    what the turn will append; ``own_items`` when the caller made them already) — or the
    error to answer instead. ``previous_response_id``: the one the request sent, which a
    conversation excludes."""
    value = body.get("conversation")
    if value is None:
        return None, [], None
    target = conversation_id(value)
    if target is None:
        error = ApiError(
            message="Invalid 'conversation': expected a conversation id or {\"id\": …}.",
            type="invalid_request_error",
            param="conversation",
            code="invalid_type",
            status=400,
        )
        return None, [], error
    if previous_response_id is not None or body.get("previous_response_id") is not None:
        error = ApiError(
            message="Mutually exclusive parameters: 'previous_response_id' and 'conversation'. "
            "Send only one of them.",
            type="invalid_request_error",
            param="conversation",
            code="mutually_exclusive_parameters",
            status=400,
        )
        return None, [], error
    if await reader.conversation(target, credential) is None:
        return None, [], conversation_error(target)
    own = own_items or input_items(copy.deepcopy(body.get("input")), ids)
    history = conversation_history(await reader.conversation_items(target))
    body["input"] = history + [{k: v for k, v in item.items() if k != "status"} for item in own]
    del body["conversation"]
    return target, own, None
