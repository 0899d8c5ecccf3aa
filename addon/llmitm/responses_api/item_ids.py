"""Ids for the input items of a create call that resends its whole history.

An agent (Codex, openai-agents) resends every earlier item on every turn, mostly without
ids; minting fresh ids for them made each turn's stored items differ from the last turn's
and put one more random id per resent item on every recording's mint tape. Here an item
without an id is given one derived from what it follows: a chain of digests, the first of
the scope (the caller's credential fingerprint), each next one of the last and the item's
exact JSON bytes. The same item at the same place of the same history gets the same id on
every turn, in every proxy of a fleet and after a restart; two equal items of one request
differ (their histories do); and nothing need be remembered or recorded. With an
:class:`~llmitm.translate.seen_items.SeenItems`, a resent item's link of the chain is looked
up rather than hashed again.

Only for a call whose ``input`` is the whole conversation: one continuing a stored chain or
a conversation sends only its new items, whose history is not in the request, so the same
words on two turns would get one id.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from llmitm.translate.seen_items import SeenItems

DIGEST_BYTES = 24
"""48 hex digits, as OpenAI's ids (and :func:`~llmitm.wire.ids.random_id`) have."""
_PERSON = b"llmitm-input-id"


def _link(before: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(before + data, digest_size=DIGEST_BYTES, person=_PERSON).digest()


class HistoryIds:
    """Ids for the items of one request's input, in order: call :meth:`next` once per item."""

    __slots__ = ("_chain", "_seen")

    def __init__(self, scope: str | None, seen: SeenItems | None = None) -> None:
        self._chain = _link(b"", (scope or "").encode())
        self._seen = seen

    @property
    def digest(self) -> bytes:
        """The history's digest after the items so far (what the next item's id follows)."""
        return self._chain

    def resume(self, digest: bytes) -> None:
        """Go on after a history whose :attr:`digest` this was (its items not walked again)."""
        self._chain = digest

    def next(self, prefix: str, item: dict[str, Any]) -> str:
        """The id of ``item`` (the next item of the input) with ``prefix``."""
        if self._seen is not None:
            self._chain = self._seen.next_id(item, self._chain, _link)
        else:
            self._chain = _link(self._chain, orjson.dumps(item))
        return f"{prefix}_{self._chain.hex()}"
