"""Input items as OpenAI stores them, and the ``input_items`` list page.

A request's ``input`` (a string or items, some without ``type``, ``id`` or ``status``) is
stored as OpenAI lists it back: every item typed and with an id, message content as parts.
Ids the client sent are kept (they name items of earlier responses); the others are minted,
or, for an input that is the whole conversation, derived from the history
(:mod:`.item_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from llmitm.errors import InputError
from llmitm.responses_api.item_ids import HistoryIds
from llmitm.responses_api.records import ItemJson, item_json
from llmitm.wire.growing import Grown
from llmitm.wire.ids import IdFactory

_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
    "item_reference": "ref",
}


def input_items(
    value: Any, ids: IdFactory, history: HistoryIds | None = None
) -> list[dict[str, Any]]:
    """``input`` as stored items: a string is one user message; each item gets a type, an
    id (from ``history`` when given, else ``ids``) and (messages) a list of content parts.
    Non-object items are left out here: request mapping rejects them with a 400 before
    anything is stored."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list):
        return []
    return [_item(item, ids, history) for item in value if isinstance(item, dict)]


class Resent(NamedTuple):
    """What a whole conversation's item was stored as, for the next turn that resends it:
    its stored form and that as a store keeps it, and the history's digest after it, under
    ``scope``."""

    scope: str | None
    stored: dict[str, Any]
    digest: bytes
    json: ItemJson


def history_input_items(
    items: list[dict[str, Any]],
    ids: IdFactory,
    history: HistoryIds,
    scope: str | None,
    resent: Sequence[Resent] = (),
) -> tuple[list[dict[str, Any]], list[Resent]]:
    """:func:`input_items` of ``items``, a whole conversation's, with ids from ``history``
    (begun for ``scope``), and what each became, for the next turn. ``resent``: what the
    last turn's leading items became, for leading items with the same bytes (the next
    turn's parse proves that): the same bytes after the same history are the same stored
    item, so each is taken as it is rather than built and digested again — a resent
    history then costs a turn what it adds."""
    resent = resent[: len(items)]
    marks: list[Resent] = []
    # One turn's marks share its scope: the ends speak for all.
    if resent and resent[0].scope == scope and resent[-1].scope == scope:
        history.resume(resent[-1].digest)
        marks = list(resent)
    for item in items[len(marks) :]:
        stored = _item(item, ids, history)
        marks.append(Resent(scope, stored, history.digest, item_json(stored)))
    return [mark.stored for mark in marks], marks


def resent_of(grown: Grown) -> Sequence[Resent]:
    """What the leading items of a resent history were stored as last turn (``grown``, its
    parse, proved their bytes the same and handed back what was attached to them)."""
    if grown.name != "input" or not grown.previous:
        return ()
    return grown.previous[: grown.reused]


def _item(item: dict[str, Any], ids: IdFactory, history: HistoryIds | None) -> dict[str, Any]:
    kind = item.get("type") or ("message" if "role" in item else "item")
    prefix = _ID_PREFIX.get(kind, "item")
    # Every item goes into the history's digest, one with an id of its own too.
    derived = history.next(prefix, item) if history is not None else None
    stored: dict[str, Any] = {"id": item.get("id") or derived or ids(prefix)}
    stored.update(item)
    stored["type"] = kind
    if kind == "message":
        role = item.get("role")
        content = item.get("content")
        if isinstance(content, str):
            part = "output_text" if role == "assistant" else "input_text"
            stored["content"] = [{"type": part, "text": content}]
        elif content is None:
            stored["content"] = []
        stored.setdefault("status", "completed")
    elif kind in ("function_call", "function_call_output", "custom_tool_call_output"):
        stored.setdefault("status", "completed")
    return stored


@dataclass(frozen=True, slots=True)
class PageError(InputError):
    """A list parameter OpenAI would refuse (400)."""

    message: str
    param: str


def list_page(
    items: list[dict[str, Any]],
    *,
    limit: str | None = None,
    order: str | None = None,
    after: str | None = None,
) -> dict[str, Any]:
    """OpenAI's list object over ``items`` (stored oldest first): ``order`` ``desc`` (the
    default) lists newest first, ``after`` starts past that item id, ``limit`` 1–100
    (default 20), ``has_more`` says whether items remain past the page."""
    size = _limit(limit)
    if order not in (None, "asc", "desc"):
        raise PageError(f"Invalid order {order!r}: expected 'asc' or 'desc'.", "order")
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after:
        positions = [i for i, item in enumerate(ordered) if item.get("id") == after]
        # An unknown cursor lists nothing (there is nothing "after" it), as a stale cursor
        # on OpenAI's list endpoints does.
        start = positions[0] + 1 if positions else len(ordered)
    data = ordered[start : start + size]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + size < len(ordered),
    }


def _limit(value: str | None) -> int:
    if value is None or value == "":
        return 20
    try:
        limit = int(value)
    except ValueError:
        raise PageError(f"Invalid limit {value!r}: expected an integer.", "limit") from None
    if not 1 <= limit <= 100:
        raise PageError(
            f"Invalid limit {limit}: expected a value between 1 and 100.", "limit"
        ) from None
    return limit
