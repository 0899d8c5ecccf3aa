"""A Responses create call before routing: what the local Responses API must remember about
it, and the stateless request the router will translate.

- ``item_reference`` items become the stored items they name;
- ``previous_response_id`` becomes its stored chain, inlined before the new input (and is
  removed, so the chat translation sees a plain conversation); an id llmitm does not store
  is left alone — a native endpoint may own it (:attr:`CreateCall.previous_owner`), or it
  is unknown and request mapping answers OpenAI's 400 — and one another credential created
  (stored here, or minted by a native endpoint for it) is :attr:`CreateCall.previous_foreign`,
  for the caller to refuse as OpenAI's 400 rather than send to the endpoint with its key;
- reasoning items carrying llmitm's ``encrypted_content`` get their reasoning back, and
  llmitm's compaction items become the summary messages they stand for (:mod:`.compaction`).

The request's own input, with ids, is kept for ``input_items`` when it is stored. When that
input is the whole conversation (no chain, no conversation), items without an id get ids
derived from their history (:mod:`.item_ids`): a resent item keeps last turn's id.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from llmitm.responses_api.chain import history_items
from llmitm.responses_api.compaction import ITEM_TYPES as COMPACTION_ITEM_TYPES
from llmitm.responses_api.compaction import restore_compactions
from llmitm.responses_api.item_ids import HistoryIds
from llmitm.responses_api.items import Resent, history_input_items, input_items
from llmitm.responses_api.records import ItemJson, ResponseOwner, ResponseReader, readable
from llmitm.responses_api.seal import ReasoningSeal, restore_reasoning
from llmitm.translate.seen_items import SeenItems
from llmitm.wire.ids import IdFactory

ENCRYPTED_INCLUDE = "reasoning.encrypted_content"
HISTORY_IDS_MARKER = "input-ids-from-history"
"""Noted on a recording's mint tape when its input item ids were derived, not minted (one made
before has a minted id per item on its tape, which its replay hands out again)."""


@dataclass(slots=True)
class CreateCall:
    """What the local Responses API learned about one create call before routing."""

    store: bool
    background: bool
    include_encrypted: bool
    input_items: list[dict[str, Any]] = field(default_factory=list)
    """The request's own input, with ids (what ``input_items`` lists), when it is stored."""
    resent: list[Resent] | None = None
    """What each of a whole conversation's items was stored as, for the next turn
    (:func:`~llmitm.responses_api.items.history_input_items`); ``None`` otherwise."""
    previous_response_id: str | None = None
    previous_owner: str | None = None
    """The native endpoint that owns ``previous_response_id`` (for the router's affinity)."""
    previous_foreign: bool = False
    """``previous_response_id`` exists but is another credential's: refuse it as unknown."""
    response_id: str | None = None
    """The id llmitm gives a translated response (set once the router has planned it)."""
    native_endpoint: str | None = None
    """The native endpoint the call went to, which owns the id it mints."""
    created_by: str | None = None
    """The caller's credential fingerprint (:mod:`.scope`), kept with what the call creates."""
    conversation_id: str | None = None
    """The conversation the call continues, whose items were put before its input."""
    turn_input: list[dict[str, Any]] = field(default_factory=list)
    """The request's own input items, with ids: what the turn appends to its conversation."""

    @property
    def input_json(self) -> list[ItemJson] | None:
        """Each of :attr:`input_items` as a store keeps it, made when it was new (for
        :attr:`StoredResponse.input_json`); ``None`` when they were not made so."""
        if self.resent is None:
            return None
        return [mark.json for mark in self.resent]

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        # mitmproxy saves flow.metadata with its plain-data file format (addons/state.py).
        return {"store": self.store, "background": self.background, "response_id": self.response_id}


async def prepare_create(
    body: dict[str, Any],
    reader: ResponseReader,
    seal: Callable[[], Awaitable[ReasoningSeal]],
    *,
    store_default: bool,
    ids: IdFactory,
    known_owner: Callable[[str], ResponseOwner | None] = lambda _id: None,
    credential: str | None = None,
    history_ids: bool = False,
    seen: SeenItems | None = None,
    resent: Sequence[Resent] = (),
) -> tuple[CreateCall, bool]:
    """The create call's facts, and whether ``body`` was changed (in place). Stored state is
    read as ``credential``'s (``None``: anyone's, :mod:`.scope`). ``history_ids``: derive the
    ids of a whole conversation's items from their history rather than mint them (``seen``:
    the items as the memo knows them, whose ids it may have made already; ``resent``: what
    the last turn's leading items, resent with the same bytes, were stored as)."""
    include = body.get("include")
    store = body.get("store")
    create = CreateCall(
        store=store if isinstance(store, bool) else store_default,
        background=body.get("background") is True,
        include_encrypted=isinstance(include, list) and ENCRYPTED_INCLUDE in include,
    )
    changed = False
    items = body.get("input")
    # Item types, not the bytes, say whether there is anything to resolve or open: a search
    # of the body for a quoted name is a scan of every byte of the history (~1 ms a MB, more
    # for a name that starts with a quote), a look at each item's type a few µs per hundred.
    if isinstance(items, list) and _holds(items, _REFERENCE):
        changed = await resolve_references(items, reader, credential)
        resent = ()  # resolved in place: an item may stand for what another turn's did not
    if create.store:
        # Each stored item is a new dict (``input_items``), so what rewrites the request's
        # items in place — reasoning restored, compactions opened, a chain inlined — leaves
        # the stored ones alone; what lies deeper (content parts, tool outputs) is shared, as
        # nothing after this rewrites it in place: translation builds new objects. No deep
        # copy: an agent's input is MBs, resent every turn.
        whole = not body.get("previous_response_id") and body.get("conversation") is None
        history = HistoryIds(credential, seen) if history_ids and whole else None
        if history is not None and _all_objects(items):
            create.input_items, create.resent = history_input_items(
                items, ids, history, credential, resent
            )
        else:
            create.input_items = input_items(items, ids, history)
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and previous:
        create.previous_response_id = previous
        chain = await reader.chain(previous, credential=credential)
        if chain:
            inline_chain(body, history_items(chain))
            changed = True
        else:
            owner = await reader.owner(previous) or known_owner(previous)
            if owner is not None and readable(owner.credential, credential):
                create.previous_owner = owner.endpoint
            elif owner is not None or await reader.response(previous) is not None:
                create.previous_foreign = True
    items = body.get("input")
    if isinstance(items, list) and _holds(items, SEALED_TYPES, "encrypted_content"):
        opened = await seal()
        changed = restore_reasoning(body["input"], opened) > 0 or changed
        changed = restore_compactions(body["input"], opened) > 0 or changed
    return create, changed


_REFERENCE = frozenset({"item_reference"})
SEALED_TYPES = frozenset({"reasoning", *COMPACTION_ITEM_TYPES})
"""The item types whose ``encrypted_content`` llmitm may have sealed (and opens in place)."""


def _all_objects(items: Any) -> TypeGuard[list[dict[str, Any]]]:
    return type(items) is list and all(type(item) is dict for item in items)


def _holds(items: list[Any], types: frozenset[str], key: str | None = None) -> bool:
    """Whether an item of ``items`` is of one of ``types`` (and has ``key``)."""
    return any(
        isinstance(item, dict) and item.get("type") in types and (key is None or key in item)
        for item in items
    )


async def resolve_references(
    items: list[Any], reader: ResponseReader, credential: str | None = None
) -> bool:
    """Replace ``item_reference`` items by the stored items they name (in place); whether
    any was. One llmitm does not store (or not as ``credential``'s) stays: a native endpoint
    may own it, and a chat endpoint's request mapping refuses it with a 400."""
    wanted = [
        item["id"]
        for item in items
        if isinstance(item, dict)
        and item.get("type") == "item_reference"
        and isinstance(item.get("id"), str)
    ]
    if not wanted:
        return False
    found = await reader.items(wanted, credential)
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            stored = found.get(item.get("id"))  # type: ignore[arg-type]
            if stored is not None:
                items[index] = copy.deepcopy(stored)
    return bool(found)


def inline_chain(body: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """``history`` before the new input, and no ``previous_response_id`` any more."""
    new_input = body.get("input")
    if isinstance(new_input, str):
        new_input = [{"role": "user", "content": new_input}]
    elif not isinstance(new_input, list):
        new_input = []
    body["input"] = history + new_input
    del body["previous_response_id"]
