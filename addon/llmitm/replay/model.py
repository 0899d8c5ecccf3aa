"""One recorded interaction: four legs (client request, upstream request, upstream response,
client response) and what is known about how it went.

Streamed bodies are kept as the pieces exactly as they arrived, each with its offset in
microseconds since the client's request was complete (``t_us``), so a replay can reproduce
split points and pacing; :meth:`Message.body` joins them. Plain data: the store, the
recordings folder, the replay addon and the CLI all exchange these.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal

Leg = Literal["client_req", "upstream_req", "upstream_resp", "client_resp"]
LEGS: tuple[Leg, ...] = ("client_req", "upstream_req", "upstream_resp", "client_resp")
Chunk = tuple[int, bytes]
"""(offset in microseconds since the request was complete, the bytes of one piece)."""


@dataclass(slots=True)
class Message:
    """One leg: a request (``method``, ``url``) or a response (``status``), already redacted.

    ``content`` is the whole body of a non-streamed message; ``chunks`` the pieces of a
    streamed one (then ``content`` is ``None``)."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    content: bytes | None = None
    chunks: list[Chunk] | None = None
    method: str = ""
    url: str = ""
    status: int = 0

    @property
    def streamed(self) -> bool:
        return self.chunks is not None

    def body(self) -> bytes:
        if self.chunks is not None:
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
    canonical: str
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
