"""The live console's state of one flow, sans-IO: timed chunks in, conversation and timings out.

The proxy's stream callable only appends ``(time, bytes)`` to ``StreamWatch.pending`` (one
list append per chunk, no parsing); the console drains that list on its own schedule, a few
times a second, on the event loop. So the per-chunk cost of watching is near zero, and the
parsing happens in batches where a slow terminal cannot hold up a stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from llmitm.view.conversation import Conversation, StreamAssembler
from llmitm.wire.sse import DONE_DATA, SSEDecoder


@dataclass(slots=True)
class FlowInfo:
    """Who asked what of whom: the facts of a flow the console shows around its content."""

    client_api: str
    """``chat`` or ``responses`` (or ``?`` for a path llmitm does not know)."""
    upstream_api: str
    model: str
    """The model the client asked for."""
    endpoint: str
    upstream_model: str = ""
    route: str = ""
    started: float = 0.0
    """When the request started (epoch seconds, as mitmproxy's timestamps)."""

    @property
    def translation(self) -> str:
        if self.client_api == self.upstream_api:
            return f"{self.client_api} pass"
        return f"{self.client_api}→{self.upstream_api}"

    @property
    def target(self) -> str:
        """``model → endpoint`` (with the endpoint's model name when a route renamed it)."""
        model = self.model or "?"
        if self.upstream_model and self.upstream_model != self.model:
            model = f"{model} as {self.upstream_model}"
        return f"{model} → {self.endpoint}"


class StreamWatch:
    """One stream in flight. ``pending`` is the tap's list; ``drain`` reads what it holds."""

    __slots__ = (
        "_decoder",
        "assembler",
        "bytes_in",
        "chunks",
        "ended",
        "first_byte",
        "first_token",
        "info",
        "last_event",
        "pending",
    )

    def __init__(self, info: FlowInfo) -> None:
        self.info = info
        self.pending: list[tuple[float, bytes]] = []
        self.assembler = StreamAssembler()
        self._decoder = SSEDecoder()
        self.first_byte: float | None = None
        self.first_token: float | None = None
        """When the chunk that carried the first content-bearing delta arrived."""
        self.last_event: float | None = None
        self.ended: float | None = None
        self.chunks = 0
        self.bytes_in = 0

    @property
    def conversation(self) -> Conversation:
        return self.assembler.conversation

    def drain(self) -> None:
        """Parse every chunk the tap has handed over since the last call."""
        if not self.pending:
            return
        pending, self.pending[:] = self.pending[:], []
        assembler = self.assembler
        conversation = assembler.conversation
        loads = orjson.loads
        for at, data in pending:
            self.chunks += 1
            if not data:  # the end of the body
                self._events(self._decoder.close(), at)
                assembler.close()
                self.ended = at
                continue
            if self.first_byte is None:
                self.first_byte = at
            self.bytes_in += len(data)
            before = conversation.deltas
            for _name, payload in self._decoder.feed(data):
                self._event(payload, loads)
            if conversation.deltas != before:
                self.last_event = at
                if before == 0:
                    self.first_token = at

    def _events(self, events: list[tuple[str | None, bytes]], at: float) -> None:
        before = self.conversation.deltas
        for _name, payload in events:
            self._event(payload, orjson.loads)
        if self.conversation.deltas != before and self.first_token is None:
            self.first_token = at

    def _event(self, payload: bytes, loads) -> None:  # type: ignore[no-untyped-def]
        if payload == DONE_DATA:
            self.assembler.done()
            return
        try:
            event = loads(payload)
        except orjson.JSONDecodeError:
            self.assembler.conversation.events["(malformed)"] += 1
            return
        self.assembler.feed(event)

    def ttft(self) -> float | None:
        """Seconds from the request to the first content-bearing delta."""
        if self.first_token is None:
            return None
        return max(0.0, self.first_token - self.info.started)

    def tokens_per_second(self, now: float) -> float | None:
        """Output rate since the first token: the reported output tokens once the stream has
        ended with usage, else the count of content deltas (about one token each)."""
        if self.first_token is None:
            return None
        end = self.ended or now
        span = end - self.first_token
        if span <= 0.05:
            return None
        usage = self.conversation.usage
        tokens = usage[2] if usage and self.ended else self.conversation.deltas
        return tokens / span

    def elapsed(self, now: float) -> float:
        return max(0.0, (self.ended or now) - self.info.started)


@dataclass(slots=True)
class Summary:
    """One finished flow, as its summary line shows it."""

    info: FlowInfo
    status: str
    """The HTTP status, or what went wrong (``error: …``)."""
    ok: bool
    duration: float | None
    ttft: float | None = None
    usage: tuple[int, int, int, int] | None = None
    attempts: int = 1
    recorded: str | None = None
    finish: str | None = None
