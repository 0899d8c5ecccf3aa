"""A request body that extends a recent one, parsed in proportion to what it adds.

An agent resends its whole history on every turn: the body of turn N is turn N−1's bytes
with a few items appended to its conversation array (a Responses call's ``input``, a chat
call's ``messages``) and everything before that array the same. ``orjson.loads`` of such a
body costs 1–2 ms a MB, every turn. :class:`GrowingBodies` keeps a recent body's bytes
and its parse; a body that starts with the kept bytes up to the array's last item and ends
with the kept bytes from the array's closing bracket on is the kept one plus what lies
between, and only that is parsed (wrapped so that it is parsed at the depth and in the state
it has in the body). The result is ``orjson.loads(content)``'s, value for value:

- The kept body's split point is found by spelling the fields after the array as orjson
  does (a compact client's body; a spaced one is parsed whole every time), and proven
  before it is used: the body up to it, followed by
  ``,0]}``, parses to the same object with the sentinel appended to its array — the parser
  is in that array (the one the key's value is taken from, duplicate keys included), after
  an item, and nothing before the split is left open. A body whose split is not proven is
  parsed whole and not kept.
- What lies between is parsed after a sentinel item, in an array inside another
  (``[[0`` … ``]]``: the depth it has in the body), and must come back as one array in the
  outer one: had it closed the array, the outer one would hold more or fail to parse; it
  did not, so the bytes after it parse as they did before.
- The split lies on an ASCII byte, so UTF-8 is checked where orjson checks it.
- The fields after the array may differ from the kept body's (Codex sends per-request
  metadata there): what follows the kept items is then parsed as the rest of an object whose
  first field is the array, and those fields, spelt as orjson does, must be how the body
  ends — where the array closes, proven by the parse of what lies between. A field there
  that repeats one before the array is left to the whole parse.

What a caller gets shares the kept body's objects (old items, the fields around the array):
a caller that may change them in place asks for ``checked`` bodies, whose old items are
compared, by their serialisation (one of the whole list), with what they were when first
parsed, and whose other fields are fresh copies; a caller that never changes what it reads
takes them as they are. A caller may attach one value per item (:meth:`Grown.attach`),
handed back beside the same items of the next body that extends this one, and carry one
value made of the whole body (:meth:`Grown.carry`), handed back with the next body.

Bounded: :data:`BUDGET` bytes of kept bodies and their parse, the least recently used
forgotten; a body under :data:`SMALLEST` bytes is parsed whole and not kept. One lock: the
builder's worker and the event loop each have their own instance, but nothing stops a
caller on another thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmitm.wire.kept_by_head import KeptByHead

SEQUENCES = ("input", "messages")
"""The fields whose array is the conversation (the first one a body has is taken)."""
BUDGET = 48 * 2**20
"""Bytes kept bodies may hold, roughly: each :data:`WEIGHT` times its length (its bytes, its
parse, and what a caller carries of it: a translation's messages spelt as JSON). A hit
replaces the body it extends, so one conversation holds one body."""
WEIGHT = 4
SMALLEST = 8 * 1024
"""A body under this many bytes is parsed whole: nothing to gain."""
HEAD = 512
"""The leading bytes that name a kept body's candidates."""
PER_HEAD = 8
"""Kept bodies under one head (conversations that start alike: one agent's prompt)."""
GROUP = 32 * 1024
"""Bytes of items a check serialises at once (:func:`_unchanged`): well under glibc's
128 KiB, above which an allocation is a fresh mapping."""


@dataclass(slots=True, eq=False)
class _Kept:
    data: bytes
    """The body's bytes."""
    close: int
    """Where its array's closing bracket is (``data[close:]`` is the tail)."""
    tail: bytes
    fields: dict[str, Any]
    """The body as parsed (its array's value among them)."""
    name: str
    items: list[Any]
    item_bytes: list[bytes] | None
    """Each item's ``orjson.dumps`` when first parsed (``checked`` bodies only)."""
    proven: bool
    attached: list[Any] | None = None
    carried: Any = None


@dataclass(slots=True)
class Grown:
    """A body parsed: ``body`` is ``orjson.loads(content)``."""

    body: Any
    name: str | None = None
    """The conversation array's field, when the body is kept for the next turn."""
    reused: int = 0
    """Leading items of ``body[name]`` that are the kept body's objects."""
    previous: list[Any] | None = None
    """What was attached to the kept body's items (its first ``reused`` are theirs)."""
    item_bytes: list[bytes] | None = None
    """Each item's ``orjson.dumps`` (``checked`` bodies)."""
    carried: Any = None
    """What was carried from the kept body (valid for its first ``reused`` items)."""
    _kept: _Kept | None = field(default=None, repr=False)
    _owner: GrowingBodies | None = field(default=None, repr=False)

    def attach(self, values: list[Any] | None) -> None:
        """Keep ``values`` (one per item) beside this body's items for the next turn
        (``None``: nothing)."""
        if self._kept is not None:
            self._kept.attached = values

    def carry(self, value: Any) -> None:
        """Keep ``value``, made of this body, for the next turn's (its :attr:`carried`)."""
        if self._kept is not None:
            self._kept.carried = value

    def forget(self) -> None:
        """Do not keep this body (it may hold what must not stay in memory)."""
        if self._kept is not None and self._owner is not None:
            with self._owner._lock:
                self._owner._kept.drop(self._kept)
            self._kept = None


class GrowingBodies:
    """Recent bodies with their parse, to parse the next turn's in proportion to its news."""

    def __init__(
        self, budget: int = BUDGET, checked: bool = False, copied: frozenset[str] = frozenset()
    ) -> None:
        self.checked = checked
        self.copied = copied
        """``checked`` bodies: item types the caller rewrites in place, handed out as copies
        (so that the kept items stay as they were parsed)."""
        self._kept: KeptByHead[_Kept] = KeptByHead(budget, HEAD, PER_HEAD, WEIGHT)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def parse(self, content: bytes) -> Grown:
        """``content`` parsed (raises ``orjson.JSONDecodeError`` as ``orjson.loads`` does)."""
        if len(content) < SMALLEST:
            return Grown(orjson.loads(content))
        with self._lock:
            for kept in reversed(self._kept.alike(content)):
                grown = self._extend(kept, content)
                if grown is not None:
                    return grown
        return self._whole(content)

    # -- a body that extends a kept one ---------------------------------------------------

    def _extend(self, kept: _Kept, content: bytes) -> Grown | None:
        if not content.startswith(memoryview(kept.data)[: kept.close]):
            return None
        tail, after = kept.tail, None
        if not content.endswith(tail) or len(content) - len(tail) < kept.close:
            # The fields after the array changed (a client's per-request metadata).
            found = _new_tail(kept, content)
            if found is None:
                return None
            tail, after = found
        end = len(content) - len(tail)
        if not kept.proven:
            if not _proven(kept):
                self._kept.drop(kept)
                return None
            kept.proven = True
        try:
            between = orjson.loads(b"".join((b"[[0", content[kept.close : end], b"]]")))
        except orjson.JSONDecodeError:
            return None  # not this body's continuation: the caller parses it whole
        if len(between) != 1 or type(between[0]) is not list:
            return None
        added = between[0]
        if type(added[0]) is not int:
            return None
        added = added[1:]
        if any(type(item) is not dict for item in added):
            return None
        items = kept.items
        item_bytes: list[bytes] | None = None
        if self.checked:
            # Compared with their serialisation when first parsed: a caller changed none.
            if not _unchanged(items, kept.item_bytes or []):
                self._kept.drop(kept)
                return None
            # The kept bytes themselves: their hashes are cached (a memo looks them up).
            item_bytes = [*(kept.item_bytes or ()), *(orjson.dumps(item) for item in added)]
        whole = items + added
        fields = _fields(kept, whole, after)
        following = _Kept(content, end, tail, fields, kept.name, whole, item_bytes, True)
        self._kept.drop(kept)
        self._kept.keep(following)
        body = dict(fields)
        body[kept.name] = self._handed(whole, item_bytes)
        if self.checked:
            # The fields around the array are the caller's to change: fresh copies.
            others = {name: value for name, value in fields.items() if name != kept.name}
            body.update(orjson.loads(orjson.dumps(others)))
        return Grown(
            body, kept.name, len(items), kept.attached, item_bytes, kept.carried, following, self
        )

    # -- a body parsed whole --------------------------------------------------------------

    def _whole(self, content: bytes) -> Grown:
        body = orjson.loads(content)
        if type(body) is not dict:
            return Grown(body)
        name = next((name for name in SEQUENCES if type(body.get(name)) is list), None)
        if name is None:
            return Grown(body)
        items: list[Any] = body[name]
        if not items or any(type(item) is not dict for item in items):
            return Grown(body)
        # The array's end: what follows it, in orjson's spelling (a compact client's): a
        # guess, proven before it is used (``_proven``).
        following = list(body)[list(body).index(name) + 1 :]
        try:
            tail = _tail({k: body[k] for k in following})
        except orjson.JSONEncodeError:
            return Grown(body)
        if not content.endswith(tail):
            return Grown(body)
        item_bytes = [orjson.dumps(item) for item in items] if self.checked else None
        fields = dict(body)
        fields[name] = list(items)
        kept = _Kept(
            content, len(content) - len(tail), tail, fields, name, fields[name], item_bytes, False
        )
        if item_bytes is not None and self.copied:
            body[name] = self._handed(items, item_bytes)
        if self.checked:
            # The caller may change what it got: the fields around the array are kept as a
            # private copy, the items as they are (the next turn compares them).
            fields.update(
                orjson.loads(orjson.dumps({k: v for k, v in fields.items() if k != name}))
            )
        with self._lock:
            self._kept.keep(kept)
        return Grown(body, name, 0, None, item_bytes, None, kept, self)

    def _handed(self, items: list[Any], item_bytes: list[bytes] | None) -> list[Any]:
        """The items for the caller: a copy of the list, and of each item of a type the
        caller rewrites in place."""
        if item_bytes is None or not self.copied:
            return list(items)
        copied = self.copied
        # A client's ``type`` may be anything JSON holds (the validator refuses it later):
        # only a string can name a copied type, and a list or object is not hashable.
        return [
            orjson.loads(data) if type(kind := item.get("type")) is str and kind in copied else item
            for item, data in zip(items, item_bytes, strict=True)
        ]


def _new_tail(kept: _Kept, content: bytes) -> tuple[bytes, dict[str, Any]] | None:
    """The end of ``content`` from its array's closing bracket on, and the fields spelt
    there, when they are not the kept body's: what follows the kept items is parsed as the
    rest of an object whose first field is the array, and the fields after it spelt as
    orjson does must be how ``content`` ends (proving, with the caller's parse of what lies
    between, that the array closes there). ``None`` when they are not, or when a field
    after the array repeats one before it (a duplicate key: the whole parse decides)."""
    try:
        rest = orjson.loads(b"".join((b'{"', kept.name.encode(), b'":[0', content[kept.close :])))
    except orjson.JSONDecodeError:
        return None
    if type(rest) is not dict or next(iter(rest)) != kept.name:
        return None
    del rest[kept.name]
    before = list(kept.fields)
    before = before[: before.index(kept.name) + 1]
    if any(name in rest for name in before):
        return None
    try:
        tail = _tail(rest)
    except orjson.JSONEncodeError:
        return None
    if not content.endswith(tail) or len(content) - len(tail) < kept.close:
        return None
    return tail, rest


def _tail(after: dict[str, Any]) -> bytes:
    """How a body ends from its array's closing bracket on, with ``after`` the fields that
    follow the array, in orjson's spelling (a compact client's)."""
    return (
        b"]"
        + b"".join(b"," + orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in after.items())
        + b"}"
    )


def _fields(kept: _Kept, whole: list[Any], after: dict[str, Any] | None) -> dict[str, Any]:
    """The fields of a body that extends ``kept`` with ``whole`` its array, and ``after``
    the fields after it when they are new (``None``: the kept body's)."""
    name = kept.name
    if after is None:
        return {key: whole if key == name else value for key, value in kept.fields.items()}
    fields: dict[str, Any] = {}
    for key, value in kept.fields.items():
        if key == name:
            break
        fields[key] = value
    fields[name] = whole
    fields.update(after)
    return fields


def _unchanged(items: list[Any], item_bytes: list[bytes], group: int = GROUP) -> bool:
    """Whether each of ``items`` serialises now as it did when first parsed (``item_bytes``).

    Serialised a group of items at a time (about ``group`` bytes of them), each group's JSON
    array compared in place piece by piece. One serialisation of the whole list spent most of
    its time in memory rather than in the serialiser: its output, as large as the history, was
    a fresh mapping of pages every turn, over items last touched a turn ago (in a running
    proxy, 53 items of a conversation: 0.48 ms, against 0.12 ms for the same call repeated at
    once; over turns 41–50 of the conversation benchmark, 0.49–0.54 ms a turn whole and 0.38
    in groups). Serialising each item apart made a buffer per item, ~3× the time of one list
    (12 against 4 ms for 5 MB)."""
    if len(item_bytes) != len(items):
        return False
    start = size = 0
    for end, data in enumerate(item_bytes, start=1):
        size += len(data) + 1
        if size >= group or end == len(items):
            if not _group_unchanged(items[start:end], item_bytes, start):
                return False
            start, size = end, 0
    return True


def _group_unchanged(group: list[Any], item_bytes: list[bytes], first: int) -> bool:
    """Whether ``orjson.dumps(group)`` is ``item_bytes[first:first + len(group)]`` joined as a
    JSON array."""
    whole = orjson.dumps(group)
    if not whole.startswith(b"["):
        return False
    at = 1
    for index in range(len(group)):
        data = item_bytes[first + index]
        if index and not whole.startswith(b",", at - 1):
            return False
        if not whole.startswith(data, at):
            return False
        at += len(data) + 1
    # ``at`` is one past where the closing bracket is.
    return len(whole) == at and whole.endswith(b"]")


def _proven(kept: _Kept) -> bool:
    """Whether ``kept.close`` is where its array ends: the body up to there with a sentinel
    item and the closing brackets parses to its fields with the sentinel in the array."""
    try:
        head = orjson.loads(b"".join((memoryview(kept.data)[: kept.close], b",0]}")))
    except orjson.JSONDecodeError:
        return False
    if type(head) is not dict or list(head) != list(kept.fields)[: len(head)]:
        return False
    array = head.get(kept.name)
    return (
        type(array) is list
        and len(array) == len(kept.items) + 1
        and array[-1] == 0
        and type(array[-1]) is int
        and array[:-1] == kept.items
    )
