"""JSON of an object whose one array is given as its items' JSON, made already.

A resent history is the same items turn after turn; spelling the object whole encodes every
string of them again (in the conversation benchmark, the largest cost that grew with the
turn on the record builder's thread). :func:`spliced` spells the fields around the array
with a slot in its place and puts the items' JSON in the slot, in one join: the result is
``orjson.dumps`` of the object, byte for byte, where each item's JSON is what orjson makes
of it in that place. A compact item's JSON is the same wherever it is; an indented one's is
indented for its depth by the caller.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import orjson

SLOT = "\x00llmitm-slot-" + secrets.token_hex(8)
"""Stands in for the array while the fields around it are spelt (a per-process token, so a
client cannot aim at it; a body that still holds it is spelt whole)."""
_SLOT_JSON = orjson.dumps(SLOT)


def spliced(
    value: dict[str, Any],
    path: Sequence[str],
    items: Sequence[bytes],
    *,
    option: int | None = None,
    separator: bytes = b",",
    opening: bytes = b"[",
    closing: bytes = b"]",
) -> bytes | None:
    """``orjson.dumps(value, option=option)``, the array at ``path`` (its keys, from
    ``value`` in) spelt as ``opening``, ``items`` joined by ``separator``, and ``closing``
    (an empty array as ``[]``); ``None`` when the slot cannot be told apart (the caller
    spells it whole). ``value`` is not changed."""
    text = orjson.dumps(_with_slot(value, path), option=option)
    at = text.find(_SLOT_JSON)
    if at < 0 or text.find(_SLOT_JSON, at + 1) >= 0:
        return None
    after = text[at + len(_SLOT_JSON) :]
    if not items:
        return b"".join((text[:at], b"[]", after))
    # One join: the items' bytes are copied once, into one buffer (a second, as large, was
    # a fresh mapping of pages each time).
    pieces = [text[:at] + opening]
    for item in items:
        pieces += (item, separator)
    pieces[-1] = closing + after
    return b"".join(pieces)


def _with_slot(value: dict[str, Any], path: Sequence[str]) -> dict[str, Any]:
    """A copy of ``value`` along ``path`` (the rest shared), the slot at its end."""
    head = path[0]
    return {**value, head: SLOT if len(path) == 1 else _with_slot(value[head], path[1:])}
