"""One recorded interaction: four legs (client request, upstream request, upstream response,
client response) and what is known about how it went.

Streamed bodies are kept as the pieces exactly as they arrived, each with its offset in
microseconds since the client's request was complete (``t_us``), so a replay can reproduce
split points and pacing; :meth:`Message.body` joins them. Plain data: the store, the
recordings folder, the replay addon and the CLI all exchange these.
"""

from __future__ import annotations

import itertools
import operator
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal, overload

Leg = Literal["client_req", "upstream_req", "upstream_resp", "client_resp"]
LEGS: tuple[Leg, ...] = ("client_req", "upstream_req", "upstream_resp", "client_resp")
Chunk = tuple[int, bytes]
"""(offset in microseconds since the request was complete, the bytes of one piece)."""
Encoded = tuple[str, bytes]
"""A body as a codec made it: the codec's name and its bytes."""
Encode = Callable[[bytes], Encoded]
Decode = Callable[[str, bytes], bytes]


class Pieces(Sequence[Chunk]):
    """A streamed leg as recording collects it: the offsets and sizes of its pieces and the
    body they make, with no object per piece until someone iterates. On a busy proxy a
    recorded stream then holds three buffers instead of thousands of small objects, and the
    store packs the columns and stores the body as they are.

    :meth:`timed` makes one from arrival times (seconds since the epoch) and the time the
    request was complete: the store keeps those as they are, and offsets are worked out only
    when someone reads them (recording a 2000-piece stream then does no arithmetic per
    piece, which cost it ~0.2 ms).

    :meth:`encode` lets the body wait for the store in the form the store keeps it
    (:attr:`encoded`, a few times smaller), made back into bytes only if someone else reads
    it: a record waits for the store's writer after it is built, and a burst of streams that
    ended together left many waiting whole."""

    __slots__ = ("_body", "_decode", "_offsets", "_starts", "encoded", "sizes", "t0", "times")

    def __init__(self, offsets: Sequence[int], sizes: Sequence[int], body: bytes) -> None:
        self._offsets: Sequence[int] | None = offsets
        self.sizes = sizes
        self._body: bytes | None = body
        self.encoded: Encoded | None = None
        """``(codec, bytes)`` of the body once :meth:`encode` ran."""
        self._decode: Decode | None = None
        self.times: Sequence[float] | None = None
        self.t0 = 0.0
        self._starts: list[int] | None = None

    @property
    def body(self) -> bytes:
        body = self._body
        if body is None:
            assert self.encoded is not None and self._decode is not None
            body = self._body = self._decode(*self.encoded)
        return body

    def encode(self, encode: Encode, decode: Decode) -> None:
        """Hold the body as ``encode`` makes it, decoded by ``decode`` when read (and kept
        whole from then on)."""
        if self.encoded is None:
            self.encoded, self._decode = encode(self.body), decode
            self._body = None

    @classmethod
    def timed(cls, times: Sequence[float], t0: float, sizes: Sequence[int], body: bytes) -> Pieces:
        pieces = cls((), sizes, body)
        pieces._offsets, pieces.times, pieces.t0 = None, times, t0
        return pieces

    @property
    def offsets(self) -> Sequence[int]:
        if self._offsets is None:
            assert self.times is not None
            t0 = self.t0
            self._offsets = [int((at - t0) * 1e6) for at in self.times]
        return self._offsets

    def __len__(self) -> int:
        return len(self.sizes)

    @overload
    def __getitem__(self, index: int) -> Chunk: ...
    @overload
    def __getitem__(self, index: slice) -> list[Chunk]: ...
    def __getitem__(self, index: int | slice) -> Chunk | list[Chunk]:
        if isinstance(index, slice):
            return list(self)[index]
        if self._starts is None:
            self._starts = [0, *itertools.accumulate(self.sizes)]
        index = range(len(self))[index]  # negative indexes, and IndexError
        return self.offsets[index], self.body[self._starts[index] : self._starts[index + 1]]

    def __iter__(self) -> Iterator[Chunk]:
        body, at = self.body, 0
        for offset, size in zip(self.offsets, self.sizes, strict=True):
            yield offset, body[at : at + size]
            at += size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable, like the list it stands for

    def __repr__(self) -> str:
        return f"Pieces({list(self)!r})"


@dataclass(slots=True)
class Message:
    """One leg: a request (``method``, ``url``) or a response (``status``), already redacted.

    ``content`` is the whole body of a non-streamed message; ``chunks`` the pieces of a
    streamed one (then ``content`` is ``None``)."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    content: bytes | None = None
    chunks: Sequence[Chunk] | None = None
    method: str = ""
    url: str = ""
    status: int = 0

    @property
    def streamed(self) -> bool:
        return self.chunks is not None

    def body(self) -> bytes:
        chunks = self.chunks
        if isinstance(chunks, Pieces):
            return chunks.body
        if chunks is not None:
            return b"".join(map(itemgetter(1), self.chunks))
        return self.content or b""

    def header(self, name: str, default: str = "") -> str:
        lower = name.lower()
        for key, value in self.headers:
            if key.lower() == lower:
                return value
        return default

    def timeline(self) -> list[tuple[float, bytes]]:
        """(offset in seconds, bytes) per streamed piece — the timeline renderer's input."""
        return [(t_us / 1e6, data) for t_us, data in self.chunks or ()]


@dataclass(slots=True)
class Interaction:
    """One recorded request and its answer, keyed for replay."""

    id: str
    scope: str
    key: str
    key_version: int
    method: str
    route: str
    model: str
    stream: bool
    canonical_utf8: bytes
    """The match key's canonical text as UTF-8 (:attr:`canonical` decodes it): kept as the
    key made it and as the store keeps it, so a long history's is never decoded to be
    encoded again."""
    started_us: int
    """Wall-clock arrival time (microseconds since the epoch): orders a key's recordings."""
    legs: dict[str, Message] = field(default_factory=dict)
    status: int = 0
    endpoint: str = ""
    plan: str = ""
    """``chat→responses`` style when llmitm translated, ``passthrough`` otherwise."""
    ttfb_us: int | None = None
    duration_us: int | None = None
    truncated: str | None = None
    """Why the stream ended early: ``upstream: …`` or ``client: …``."""
    error: str | None = None
    session: str = ""
    mode: str = "record"
    minted: dict[str, list[Any]] = field(default_factory=dict)
    """What the translation was handed, per kind (id prefix, ``clock``, ``sealed``): see
    :class:`llmitm.wire.ids.Mint`."""
    credential: str | None = None
    """An HMAC fingerprint of the credential the client sent (replay.fingerprint); kept in
    the database only, never exported."""
    source: str = ""
    """Where it was loaded from (a folder file, ``db``): named in miss reports."""

    @property
    def canonical(self) -> str:
        """The match key's canonical text (the sorted-key JSON it hashed)."""
        return self.canonical_utf8.decode()

    def leg(self, name: Leg) -> Message | None:
        return self.legs.get(name)

    def answer(self, prefer: Leg = "upstream_resp") -> Message | None:
        """The response to replay from: ``prefer``, else whichever response leg exists."""
        return (
            self.legs.get(prefer) or self.legs.get("client_resp") or self.legs.get("upstream_resp")
        )


def new_id(now_us: int | None = None) -> str:
    """A sortable unique id: 13 hex digits of microseconds, then 6 random hex digits."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    return f"{now_us:013x}{os.urandom(3).hex()}"
