"""Conversation affinity: keep a conversation on the endpoint that served it.

This module owns two memories and one rule:

- ``previous_response_id`` → the endpoint that produced that response. For a native
  Responses endpoint this is mandatory (the conversation's state lives there; any other
  endpoint answers 404), otherwise it keeps the prompt cache warm;
- a **conversation fingerprint** → endpoint, for chat clients and stateless Responses
  clients that resend the whole history: a stable hash of the instructions/system text and
  the first user message, which stay the same on every turn of one conversation. Either
  API's body gives the same fingerprint for the same conversation;
- :func:`conversation_key` and :func:`owner_required` say what a request's affinity is
  keyed on and whether it is a must; :func:`remembers_turn` which answers teach it;
- :func:`prefer`: affinity yields to health and caps. The affine endpoint moves to the front
  of the strategy's order only if it is in that order (so healthy) and usable right now
  (under its cap); otherwise the order is left as the strategy made it.

Both memories are bounded LRUs with a TTL on an injected monotonic clock, so a long-running
proxy cannot grow without limit and an old conversation stops pinning an endpoint.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson


class TtlLru[K, V]:
    """A mapping bounded in size (least recently used goes first) and age (an entry expires
    ``ttl`` seconds after it was last put)."""

    def __init__(self, max_entries: int, ttl: float) -> None:
        if max_entries < 1 or ttl <= 0:
            raise ValueError("an affinity table needs max_entries >= 1 and ttl > 0")
        self.max_entries = max_entries
        self.ttl = ttl
        self._items: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def put(self, key: K, value: V, now: float) -> None:
        # Putting again refreshes the TTL: every served turn extends the conversation's pin.
        self._items[key] = (value, now + self.ttl)
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def get(self, key: K, now: float) -> V | None:
        entry = self._items.get(key)
        if entry is None:
            return None
        value, expires = entry
        if now >= expires:
            del self._items[key]
            return None
        self._items.move_to_end(key)  # reading counts as use for the LRU, not for the TTL
        return value

    def discard(self, key: K) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


class Affinity:
    """The two affinity memories of one proxy."""

    def __init__(
        self,
        *,
        response_ttl: float = 24 * 3600.0,
        response_max: int = 100_000,
        conversation_ttl: float = 300.0,
        conversation_max: int = 10_000,
    ) -> None:
        # A response id chain can be resumed hours later; a conversation's warm prompt cache
        # lasts minutes (nomyo's 300 s default matches Ollama's keep-alive).
        self.responses: TtlLru[str, str] = TtlLru(response_max, response_ttl)
        self.conversations: TtlLru[str, str] = TtlLru(conversation_max, conversation_ttl)

    def served(
        self,
        endpoint: str,
        now: float,
        *,
        response_id: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Remember who served a successful request (its response id and/or fingerprint)."""
        if response_id:
            self.responses.put(response_id, endpoint, now)
        if fingerprint:
            self.conversations.put(fingerprint, endpoint, now)

    def owner_of(self, response_id: str, now: float) -> str | None:
        return self.responses.get(response_id, now)

    def endpoint_for(
        self,
        now: float,
        *,
        previous_response_id: str | None = None,
        fingerprint: str | None = None,
    ) -> str | None:
        """The affine endpoint: the owner of ``previous_response_id`` first, then the
        fingerprint's endpoint; ``None`` when neither is known."""
        if previous_response_id:
            owner = self.responses.get(previous_response_id, now)
            if owner is not None:
                return owner
        if fingerprint:
            return self.conversations.get(fingerprint, now)
        return None


def prefer(
    order: Sequence[str],
    affine: str | None,
    usable: Callable[[str], bool],
    *,
    required: bool = False,
) -> list[str]:
    """``order`` with ``affine`` moved to the front when it is in ``order`` and ``usable``
    (e.g. ``lambda e: limiter.has_room(e, model)``); otherwise ``order`` unchanged.

    ``required`` (the owner of a ``previous_response_id`` on a native Responses endpoint):
    no other endpoint can serve the request, so the result is ``[affine]`` whatever its
    health or load — the caller waits for its slot or fails with the attempts listed.
    """
    if affine is None:
        return list(order)
    if required:
        return [affine]
    if affine not in order or not usable(affine):
        return list(order)
    return [affine, *(e for e in order if e != affine)]


# --- fingerprints -------------------------------------------------------------------------


def conversation_key(route: str, model: str, body: Mapping[str, Any]) -> str | None:
    """The affinity key of the conversation ``body`` continues on ``route``, sent as
    ``model``; ``None`` when it has no opening to recognise it by."""
    conversation = fingerprint(body)
    if conversation is None:
        return None
    # One conversation per route and model: the same opening sent to another model is
    # another conversation (and another prompt cache).
    return f"{route}\x00{model}\x00{conversation}"


def owner_required(owner: str | None, client_api: str, upstream_apis: Mapping[str, str]) -> bool:
    """Whether only ``owner`` can serve a request continuing one of its responses: a
    Responses call whose previous response a native Responses endpoint minted holds its
    state there (``upstream_apis``: each candidate endpoint's upstream API)."""
    if owner is None or client_api != "responses":
        return False
    return upstream_apis.get(owner) == "responses"


def remembers_turn(affinity: bool, fingerprint: str | None, upstream_api: str) -> bool:
    """Whether a successful answer teaches affinity anything: the route keeps it, and the
    turn is known by its conversation or by the response id a native endpoint minted."""
    return affinity and (fingerprint is not None or upstream_api == "responses")


def fingerprint(body: Mapping[str, Any]) -> str | None:
    """A stable hash of a request's instructions/system text and first user message, for a
    Chat Completions (``messages``) or Responses (``instructions``/``input``) body; ``None``
    when the body has no user message to key on."""
    system: list[str] = []
    first_user: list[str] | None = None
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        system.append(instructions)
    items: Any = body.get("messages")
    if items is None:
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return None
    for item in items:
        if not isinstance(item, Mapping):
            continue
        role = item.get("role")
        if role in {"system", "developer"} and first_user is None:
            system.append(_text(item.get("content")))
        elif role == "user":
            first_user = [_text(item.get("content"))]
            break
    if first_user is None:
        return None
    digest = hashlib.sha256(orjson.dumps([system, first_user])).hexdigest()
    return digest[:32]


def _text(content: Any) -> str:
    """The text of a message's content in either API's spelling; non-text parts (images,
    files) contribute a stable reference so two conversations that differ only in an image
    do not share a fingerprint."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, Mapping):
            if isinstance(part.get("text"), str):
                pieces.append(part["text"])
            else:
                pieces.append(_reference(part))
    return "\n".join(pieces)


def _reference(part: Mapping[str, Any]) -> str:
    for key in ("image_url", "file_id", "file_url", "file_data", "file", "input_audio"):
        value = part.get(key)
        if isinstance(value, Mapping):
            value = value.get("url") or value.get("file_id") or value.get("data")
        if isinstance(value, str):
            return f"[{key}:{hashlib.sha256(value.encode()).hexdigest()[:16]}]"
    return f"[{part.get('type', 'part')}]"
