"""The upstream's side of a call llmitm changed on its way: what went upstream and what came
back, kept with the flow beside the client's own request and answer.

A translated flow has four messages: the client's request, the request llmitm sent upstream,
the upstream's answer and the answer the client got. mitmproxy's flow holds two of them; the
other two live here, as plain data (:meth:`UpstreamSide.to_state`) that mitmproxy's saved
flows keep as they are (``flow.metadata`` is deep-copied into its file format, which takes
only plain data) and :meth:`UpstreamSide.from_state` reads back, leniently, from a loaded file.

Credentials never get in: header values and URL query values that carry one are redacted on
the way in. Bodies are kept by reference (``bytes`` are immutable: a deep copy shares them),
and a streamed upstream answer is kept up to :data:`STREAM_KEEP_LIMIT` bytes.

Sans-IO: no mitmproxy, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llmitm.replay.redact import redact_headers, redact_url

SIDES_KEY = "llmitm_sides"
"""Where a flow's :class:`UpstreamSide` state lives in ``flow.metadata``."""

STREAM_KEEP_LIMIT = 4 * 1024 * 1024
"""The most of a streamed upstream answer kept for viewing (mitmproxy keeps the client's
stream itself, unbounded, under ``store_streamed_bodies``)."""

Headers = tuple[tuple[str, str], ...]


def _headers(headers: Iterable[tuple[str, str]]) -> Headers:
    return tuple(redact_headers(headers))


def _headers_state(headers: Headers) -> list[list[str]]:
    return [[name, value] for name, value in headers]


def _headers_from(state: object) -> Headers:
    if not isinstance(state, list | tuple):
        return ()
    pairs = (pair for pair in state if isinstance(pair, list | tuple) and len(pair) == 2)
    return tuple((str(name), str(value)) for name, value in pairs)


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "replace") if isinstance(value, str) else b""


@dataclass(frozen=True, slots=True)
class Sent:
    """A request as it went out (credentials redacted)."""

    method: str
    url: str
    headers: Headers
    body: bytes

    @classmethod
    def redacted(
        cls, method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes | None
    ) -> Sent:
        return cls(method, redact_url(url), _headers(headers), body or b"")

    def to_state(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "url": self.url,
            "headers": _headers_state(self.headers),
            "body": self.body,
        }

    @classmethod
    def from_state(cls, state: object) -> Sent | None:
        if not isinstance(state, dict):
            return None
        return cls(
            str(state.get("method") or ""),
            str(state.get("url") or ""),
            _headers_from(state.get("headers")),
            _bytes(state.get("body")),
        )


@dataclass(frozen=True, slots=True)
class Answered:
    """A response as it came back (credentials redacted)."""

    status: int
    headers: Headers
    body: bytes
    left_out: int = 0
    """Bytes of a long stream past :data:`STREAM_KEEP_LIMIT`, not kept."""
    kept: bool = True
    """``False``: a stream nobody could look at, whose body was not kept at all."""

    @classmethod
    def redacted(
        cls, status: int, headers: Iterable[tuple[str, str]], body: bytes | None, left_out: int = 0
    ) -> Answered:
        return cls(status, _headers(headers), body or b"", left_out, kept=body is not None)

    def to_state(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "headers": _headers_state(self.headers),
            "body": self.body,
            "left_out": self.left_out,
            "kept": self.kept,
        }

    @classmethod
    def from_state(cls, state: object) -> Answered | None:
        if not isinstance(state, dict):
            return None
        status = state.get("status")
        left_out = state.get("left_out")
        return cls(
            status if isinstance(status, int) else 0,
            _headers_from(state.get("headers")),
            _bytes(state.get("body")),
            left_out if isinstance(left_out, int) else 0,
            state.get("kept") is not False,
        )


@dataclass(frozen=True, slots=True)
class UpstreamSide:
    """What llmitm sent upstream for one flow, and what the upstream answered."""

    client_api: str
    """``chat`` or ``responses``: the API the client spoke."""
    upstream_api: str
    endpoint: str
    request: Sent
    response: Answered | None = None
    """``None``: no answer came (the flow failed before one)."""

    def to_state(self) -> dict[str, Any]:
        return {
            "client_api": self.client_api,
            "upstream_api": self.upstream_api,
            "endpoint": self.endpoint,
            "request": self.request.to_state(),
            "response": self.response.to_state() if self.response is not None else None,
        }

    @classmethod
    def from_state(cls, state: object) -> UpstreamSide | None:
        """The side kept in ``state`` (a saved flow's metadata), or ``None`` when it holds
        none or not one this version can read."""
        if not isinstance(state, dict):
            return None
        request = Sent.from_state(state.get("request"))
        if request is None:
            return None
        return cls(
            str(state.get("client_api") or ""),
            str(state.get("upstream_api") or ""),
            str(state.get("endpoint") or ""),
            request,
            Answered.from_state(state.get("response")),
        )


class BoundedBody:
    """A stream watcher that keeps the chunks it is handed, up to ``limit`` bytes; past it,
    it only counts what it leaves out."""

    __slots__ = ("chunks", "left_out", "limit", "size")

    def __init__(self, limit: int = STREAM_KEEP_LIMIT) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.left_out = 0
        self.limit = limit

    def __call__(self, chunk: bytes) -> None:
        room = self.limit - self.size
        if len(chunk) <= room:
            self.chunks.append(chunk)
            self.size += len(chunk)
            return
        if room > 0:
            self.chunks.append(chunk[:room])
            self.size = self.limit
        self.left_out += len(chunk) - max(room, 0)

    def body(self) -> bytes:
        """What was kept, joined once."""
        if len(self.chunks) != 1:
            self.chunks = [b"".join(self.chunks)]
        return self.chunks[0]
