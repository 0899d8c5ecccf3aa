"""Content-addressed storage of large values: how one value is cut into shared chunks and put
back together, byte for byte. No database here: ``store.sqlite_content`` keeps the chunks.

Agents resend their whole, growing history on every turn, so turn *t*'s request body is
turn *t − 1*'s with a few items added, and the same long texts travel in the Responses
body, the translated chat body, the match key's canonical text and the stored input items.
A value is therefore stored as a **recipe** over chunks:

- a *slice* of an earlier value (the longest shared prefix and suffix with a recent value of
  the same lane: the previous turn's body), so a turn costs what it adds, not its length;
- each long JSON string in what remains (``LONG_STRING`` bytes and more, escapes included) as
  a *leaf* chunk named by its sha256, so a text sent in four shapes is stored once;
- the rest as literal bytes.

A chunk's name is the sha256 of what it holds, a leaf's over its bytes, a recipe's over its
encoding (whose references name their chunks in turn), so equal names mean equal content and
a value encoded twice is stored once. Cutting needs no JSON parser: a cut in the wrong place
(a value that is not JSON, a string misread) only shares less — putting the pieces back always
gives the exact bytes. Only the bytes a value adds are hashed, scanned and compressed: finding
the shared prefix and suffix is a memory comparison, and of a value given as its parts
(:class:`Joined`: the stored input items, each kept since it was new) a comparison of parts,
most of them the very objects of the last turn's value.

Recipe encoding: ``RECIPE_MAGIC`` then ops — ``L`` + u32 length + bytes (literal), ``R`` +
32-byte name (a whole chunk), ``S`` + 32-byte name + u64 start + u64 length (a slice of a
chunk's content).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from llmitm.wire.shared_bytes import common_prefix, common_suffix

LEAF = "leaf"
RECIPE = "recipe"
RECIPE_MAGIC = b"LLMRCP\x01\xff"

SMALL = 1024
"""Values shorter than this are one leaf: a recipe would cost more than it saves."""
LONG_STRING = 512
"""JSON strings this long and longer become leaves of their own, shared across values."""
MIN_SHARED = 512
"""A base is used only when it shares at least this many bytes with the value."""
MAX_DEPTH = 200
"""Slices of slices: past this depth a value is stored without a base, so that reading one
back never follows more than this many recipes."""

_LIT = struct.Struct("<cI")
_SLICE = struct.Struct("<c32sQQ")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def name_of(data: bytes) -> bytes:
    """A chunk's name: the sha256 of its content (fastest of hashlib's on x86 with SHA-NI,
    and the only one the export folder's blob names already use)."""
    return hashlib.sha256(data).digest()


class Joined:
    """A value given as the parts it is made of, joined only where a part is new: a stored
    history's items, each the JSON kept of it since it was new, so that a resent item is the
    same bytes object turn after turn. Comparing with the last turn's value goes part by
    part (the same object is equal at once), and only the parts a turn adds are copied; the
    history joined whole was a fresh buffer as large as itself each turn, and fresh pages
    are most of what such a buffer costs."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: Sequence[bytes]) -> None:
        self.parts = tuple(parts)
        self.size = sum(map(len, self.parts))

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def between(self, start: int, end: int) -> bytes:
        """Its bytes from ``start`` to ``end``, joined from the parts that hold them."""
        if end <= start:
            return b""
        pieces: list[bytes] = []
        at = 0
        for part in self.parts:
            after = at + len(part)
            if after > start and at < end:
                pieces.append(part[max(0, start - at) : end - at])
            if after >= end:
                break
            at = after
        return b"".join(pieces)


Value = bytes | Joined
"""What a lane keeps: bytes, or the parts they are joined from."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk to store: a ``LEAF`` (bytes as they are) or a ``RECIPE`` (an encoding)."""

    name: bytes
    kind: str
    data: bytes


@dataclass(slots=True)
class Encoded:
    """A value cut into chunks: ``name`` is the chunk to reference (the recipe, or the single
    leaf), ``chunks`` every chunk it needs that may be new, ``children`` the names the recipe
    refers to (each once per reference), ``base`` the earlier value it slices, if any."""

    name: bytes
    chunks: list[Chunk] = field(default_factory=list)
    children: list[bytes] = field(default_factory=list)
    base: bytes | None = None


def children_of(recipe: bytes) -> list[bytes]:
    """The chunk names a recipe refers to, once per reference."""
    return [name for op, name, _, _ in _ops(recipe) if op != b"L"]


def _ops(recipe: bytes) -> Iterator[tuple[bytes, bytes, int, int]]:
    """``(op, name, start, length)``; for a literal, name is the literal's bytes."""
    if not recipe.startswith(RECIPE_MAGIC):
        raise ValueError("not a recipe")
    at, end = len(RECIPE_MAGIC), len(recipe)
    while at < end:
        op = recipe[at : at + 1]
        if op == b"L":
            _, length = _LIT.unpack_from(recipe, at)
            at += _LIT.size
            yield op, recipe[at : at + length], 0, length
            at += length
        elif op == b"R":
            yield op, recipe[at + 1 : at + 33], 0, -1
            at += 33
        elif op == b"S":
            _, name, start, length = _SLICE.unpack_from(recipe, at)
            yield op, name, start, length
            at += _SLICE.size
        else:
            raise ValueError(f"bad recipe op {op!r}")


@dataclass(slots=True)
class Recent:
    """A recent value of a lane: a base a new value may be sliced from."""

    name: bytes
    data: Value
    depth: int


class Bases:
    """Recent values per lane (a leg of recordings, the canonical text, stored input items…),
    the candidates a new value of that lane is sliced from. Bounded by bytes held: the
    oldest are forgotten first. Forget all when chunks may have been deleted."""

    def __init__(self, per_lane: int = 8, max_bytes: int = 32 << 20) -> None:
        # Eight per lane: the previous turn of up to eight conversations interleaved (the
        # newest that covers a value ends the search, so a single one costs one comparison).
        # 32 MiB: what a proxy holds for it at most, whatever the bodies weigh — enough for
        # the last turn of a 5 MB history in each of its four lanes (the client's body, the
        # translated one, the canonical text, the stored input). With less, each lane's
        # value pushed another lane's out, and every turn was cut whole (~50 ms a 5 MB lane).
        self.per_lane = per_lane
        self.max_bytes = max_bytes
        self._lanes: dict[str, OrderedDict[bytes, Recent]] = {}
        self._held = 0

    def candidates(self, lane: str) -> list[Recent]:
        recent = self._lanes.get(lane)
        return list(reversed(recent.values())) if recent else []

    def remember(self, lane: str, name: bytes, data: Value, depth: int) -> None:
        recent = self._lanes.setdefault(lane, OrderedDict())
        old = recent.pop(name, None)
        if old is not None:
            self._held -= len(old.data)
        recent[name] = Recent(name, data, depth)
        self._held += len(data)
        while len(recent) > self.per_lane:
            _, dropped = recent.popitem(last=False)
            self._held -= len(dropped.data)
        while self._held > self.max_bytes:
            self._evict_oldest()

    def forget(self, name: bytes) -> None:
        for recent in self._lanes.values():
            dropped = recent.pop(name, None)
            if dropped is not None:
                self._held -= len(dropped.data)

    def clear(self) -> None:
        self._lanes.clear()
        self._held = 0

    def depth(self, name: bytes) -> int:
        for recent in self._lanes.values():
            if name in recent:
                return recent[name].depth
        return 0

    def _evict_oldest(self) -> None:
        lane = max(self._lanes, key=lambda k: len(self._lanes[k]))
        _, dropped = self._lanes[lane].popitem(last=False)
        self._held -= len(dropped.data)
        if not self._lanes[lane]:
            del self._lanes[lane]


def best_base(
    data: Value, candidates: list[Recent], measured: tuple[Recent, int, int] | None = None
) -> tuple[Recent | None, int, int]:
    """The candidate sharing the most bytes with ``data`` as prefix + suffix, and those;
    ``measured``: one candidate's :func:`shared_ends` with ``data``, made already."""
    best, best_p, best_s = None, 0, 0
    for candidate in candidates:
        if candidate.depth >= MAX_DEPTH:
            continue
        if measured is not None and candidate is measured[0]:
            p, s = measured[1], measured[2]
        else:
            p, s = shared_ends(data, candidate)
        if p + s > best_p + best_s:
            best, best_p, best_s = candidate, p, s
        if p + s + MIN_SHARED >= len(candidate.data):
            # All of it is reused (the previous turn, newest first): no older one does better,
            # and comparing each of them would cost a turn what the history weighs.
            break
    if best_p + best_s < MIN_SHARED:
        return None, 0, 0
    return best, best_p, best_s


def shared_ends(data: Value, candidate: Recent) -> tuple[int, int]:
    """The bytes ``data`` shares with ``candidate`` as prefix and as suffix (0, 0 when they
    cannot share :data:`MIN_SHARED`); of two :class:`Joined` values, what their parts share
    (as much, unless a part of one is cut short in the other: then less, never more)."""
    other = candidate.data
    if isinstance(data, Joined) and isinstance(other, Joined):
        return _shared_parts(data, other)
    data, other = bytes(data), bytes(other)
    edge = MIN_SHARED // 2
    if not other.startswith(data[:edge]) and not other.endswith(data[-edge:]):
        # Under half of MIN_SHARED at either end: the two cannot share enough. Most values
        # of a lane (the answers, the stored Response) share nothing with any recent one,
        # and measuring how little costs each candidate a bisection.
        return 0, 0
    p = common_prefix(data, other)
    return p, common_suffix(data, other, min(len(data), len(other)) - p)


def _shared_parts(data: Joined, other: Joined) -> tuple[int, int]:
    """:func:`shared_ends` part by part: equal parts whole, then the bytes the first unequal
    pair shares."""
    limit = min(len(data), len(other))
    p = 0
    for mine, theirs in zip(data.parts, other.parts, strict=False):
        if mine != theirs:  # the same object compares equal at once
            p += common_prefix(mine, theirs)
            break
        p += len(mine)
    p = min(p, limit)
    s, room = 0, limit - p
    for mine, theirs in zip(reversed(data.parts), reversed(other.parts), strict=False):
        if mine != theirs or len(mine) > room - s:
            s += common_suffix(mine, theirs, min(len(mine), len(theirs), room - s))
            break
        s += len(mine)
    return (p, s) if p + s >= MIN_SHARED else (0, 0)


def encode(data: Value, base: Recent | None = None, prefix: int = 0, suffix: int = 0) -> Encoded:
    """``data`` as chunks: a leaf when small, else a recipe slicing ``base`` (``prefix`` and
    ``suffix`` bytes of it, see :func:`best_base`) with the long strings of the rest as leaves."""
    if base is not None and prefix == len(data) == len(base.data):
        return Encoded(base.name)  # the same value again: the same chunk
    if len(data) < SMALL:
        return _leaf(bytes(data))
    ops: list[bytes] = []
    chunks: list[Chunk] = []
    children: list[bytes] = []
    if base is None:
        prefix = suffix = 0
    if prefix:
        ops.append(_SLICE.pack(b"S", base.name, 0, prefix))  # type: ignore[union-attr]
        children.append(base.name)  # type: ignore[union-attr]
    # Only what lies between the shared ends is read: of a Joined value, only its new parts
    # are copied (an unchanged bytes value is its own whole slice, not a copy).
    middle = (
        data[prefix : len(data) - suffix]
        if isinstance(data, bytes)
        else data.between(prefix, len(data) - suffix)
    )
    at = 0
    for match in _STRING.finditer(middle):
        start, end = match.span()
        if end - start < LONG_STRING:
            continue
        if start > at:
            ops.append(_literal(middle[at:start]))
        text = middle[start:end]
        name = name_of(text)
        chunks.append(Chunk(name, LEAF, text))
        children.append(name)
        ops.append(b"R" + name)
        at = end
    if len(middle) > at:
        ops.append(_literal(middle[at:]))
    if suffix:
        blen = len(base.data)  # type: ignore[union-attr]
        ops.append(_SLICE.pack(b"S", base.name, blen - suffix, suffix))  # type: ignore[union-attr]
        children.append(base.name)  # type: ignore[union-attr]
    if not children:
        # Nothing shared: one leaf is smaller than a recipe of literals.
        return _leaf(middle if len(middle) == len(data) else bytes(data))
    recipe = RECIPE_MAGIC + b"".join(ops)
    name = name_of(recipe)
    chunks.append(Chunk(name, RECIPE, recipe))
    return Encoded(
        name, chunks, children, base.name if base is not None and prefix + suffix else None
    )


def _literal(piece: bytes) -> bytes:
    return _LIT.pack(b"L", len(piece)) + piece


def _leaf(data: bytes) -> Encoded:
    name = name_of(data)
    return Encoded(name, [Chunk(name, LEAF, data)])


def assemble(
    name: bytes, fetch: Callable[[bytes], tuple[str, bytes]], memo: dict[bytes, bytes]
) -> bytes:
    """The content of chunk ``name``; ``fetch(name)`` gives a stored chunk's ``(kind, data)``,
    ``memo`` keeps what was assembled (pass one dict across the values of one read: the
    previous turn's body is then put together once)."""
    known = memo.get(name)
    if known is not None:
        return known
    # Iterative over the slice chain (a recipe's base is mostly another recipe): first fetch
    # down to the deepest unassembled one, then build upwards, so depth costs no recursion.
    pending: list[tuple[bytes, bytes]] = []
    todo = [name]
    while todo:
        current = todo.pop()
        if current in memo:
            continue
        kind, data = fetch(current)
        if kind == LEAF:
            memo[current] = data
            continue
        missing = [c for c in dict.fromkeys(children_of(data)) if c not in memo]
        pending.append((current, data))
        todo.extend(missing)
    for current, recipe in reversed(pending):
        if current in memo:
            continue
        parts: list[bytes] = []
        for op, ref, start, length in _ops(recipe):
            if op == b"L":
                parts.append(ref)
            elif op == b"R":
                parts.append(memo[ref])
            else:
                parts.append(memo[ref][start : start + length])
        memo[current] = b"".join(parts)
    return memo[name]


def reference_problems(found: Counter[bytes], stored: dict[bytes, int]) -> list[str]:
    """What is wrong between the references ``found`` to each chunk (owner rows and
    recipes) and the chunks ``stored`` with the counts they keep, one line each (empty:
    nothing): references to missing chunks, counts that differ from the references found
    (a chunk nothing refers to counts more than 0)."""
    problems = [
        f"chunk {n.hex()[:16]} is referred to but missing" for n in found if n not in stored
    ]
    for name, refs in stored.items():
        if refs != found.get(name, 0):
            problems.append(
                f"chunk {name.hex()[:16]} counts {refs} references, has {found.get(name, 0)}"
            )
    return problems
