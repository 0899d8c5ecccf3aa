"""The live console's state of one flow, sans-IO: timed chunks in, conversation and timings out.

The proxy's stream callable only appends the time and the chunk to two lists of a
``StreamWatch`` (no parsing; floats and bytes, which the garbage collector does not track —
a tuple per chunk kept in a list made the collector scan mitmproxy's whole heap, again and
again, costing more than everything else); the console drains that list on its own schedule, a few
times a second, on the event loop. So the per-chunk cost of watching is near zero, and the
parsing happens in batches where a slow terminal cannot hold up a stream — and only for the
streams that have a panel on screen (see ``StreamWatch``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from llmitm.view.conversation import Conversation, StreamAssembler
from llmitm.wire.sse import SSEDecoder


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


TAIL_CHUNKS = 48
"""Chunks kept for a stream that is not fully assembled (a proxy under load reads many events
per chunk: what is parsed of them is bounded in bytes, below)."""
PANEL_TAIL_BYTES = 32 * 1024
"""What a stream that gets a panel starts from: enough events for a panel's last lines."""
END_TAIL_BYTES = 4 * 1024
"""What an unassembled stream's end is read from: the finish, usage and error events."""


class StreamWatch:
    """One stream in flight. ``times`` and ``pending`` are the tap's lists (arrival times and
    chunks); ``drain`` reads what they hold.

        Fully assembled (``full``) it parses every event. Otherwise — a stream the screen has no
        panel for, or the lines mode — it parses only until the first token (for TTFT), counts
        the rest by their blank lines, and keeps the last chunks: ``promote`` assembles those when
        the stream gets a panel, ``finish`` when it ends. So a stream costs the console next to
        nothing until someone can see it, however many run at once.
    """

    __slots__ = (
        "_decoder",
        "assembler",
        "behind",
        "bytes_in",
        "chunks",
        "counted_from",
        "ended",
        "events",
        "events_at_first_token",
        "events_counted_from",
        "first_byte",
        "first_token",
        "follow",
        "full",
        "info",
        "last_chunk",
        "pending",
        "recent",
        "times",
        "unfollow",
    )

    def __init__(self, info: FlowInfo, *, full: bool = True) -> None:
        self.info = info
        self.full = full
        self.times: list[float] = []
        self.pending: list[bytes] = []
        self.recent: deque[bytes] = deque(maxlen=TAIL_CHUNKS)
        self.assembler = StreamAssembler()
        self._decoder = SSEDecoder()
        self.behind = False
        """Chunks went by unparsed: the assembler does not hold the whole stream."""
        self.first_byte: float | None = None
        self.first_token: float | None = None
        """When the chunk that carried the first content-bearing delta arrived."""
        self.last_chunk: float | None = None
        self.ended: float | None = None
        self.chunks = 0
        self.bytes_in = 0
        self.events = 0
        """Events seen, counted by their blank lines (close enough for a rate)."""
        self.events_at_first_token = 0
        self.follow: Callable[[], None] | None = None
        """Set by a tap that keeps only a stream's last chunks until it is shown: ``promote``
        asks it for every chunk from then on."""
        self.unfollow: Callable[[], None] | None = None
        """Its counterpart: ``demote`` tells the tap to keep only the last chunks again."""
        self.counted_from: float | None = None
        """Since when ``events`` counts every event (the first token, or the promotion of a
        stream whose tap kept only its last chunks): the output rate is measured from here."""
        self.events_counted_from = 0

    @property
    def conversation(self) -> Conversation:
        return self.assembler.conversation

    def add(self, at: float, data: bytes) -> None:
        """What the tap does, for callers that are not a tap."""
        self.times.append(at)
        self.pending.append(data)

    def drain(self, now: float | None = None) -> None:
        """Take in every chunk the tap has handed over since the last call. Chunks that came
        without a time (the tap times only a stream's first chunks) count as arriving ``now``
        (or with the last time known)."""
        if not self.pending:
            return
        count = len(self.pending)
        pending, times = self.pending[:count], self.times[:count]
        del self.pending[:count], self.times[:count]
        if len(times) < count:
            fallback = now if now is not None else (times[-1] if times else self.last_chunk)
            times += [fallback or 0.0] * (count - len(times))
        start = 0
        if self.full or self.first_token is None:
            start = self._take(times, pending)  # up to the first token, or all of a panel's
        if start < count:
            self._skim(times[start:], pending[start:])

    def _take(self, times: list[float], pending: list[bytes]) -> int:
        """Parse chunk by chunk; stop after the one with the first token when no panel shows
        the stream. Returns how many chunks were taken."""
        for index, (at, data) in enumerate(zip(times, pending, strict=True)):
            self.chunks += 1
            if not data:  # the end of the body
                self.ended = at
                if not self.behind:
                    self._parse(self._decoder.close(), at)
                    self.assembler.close()
                continue
            if self.first_byte is None:
                self.first_byte = at
            self.last_chunk = at
            self.bytes_in += len(data)
            self.events += data.count(b"\n\n")
            self.recent.append(data)
            self._parse(self._decoder.feed(data), at)
            if not self.full and self.first_token is not None:
                self.behind = True  # the rest of that chunk went unparsed
                return index + 1
        return len(pending)

    def _skim(self, times: list[float], pending: list[bytes]) -> None:
        """Count chunks nobody sees without parsing them — the whole batch in C — and keep the
        last ones for ``promote`` and ``finish``."""
        self.behind = True
        if not pending[-1]:  # the end of the body
            self.ended = times[-1]
            self.chunks += 1
            times, pending = times[:-1], pending[:-1]
            if not pending:
                return
        self.chunks += len(pending)
        self.bytes_in += sum(map(len, pending))
        self.events += b"".join(pending).count(b"\n\n")
        self.recent.extend(pending[-TAIL_CHUNKS:])
        self.last_chunk = times[-1]

    def promote(self, now: float | None = None) -> None:
        """Assemble every chunk from now on, starting from the last ones kept."""
        self.drain(now)
        if self.follow is not None:
            self.follow()
            self.drain(now)
            if self.first_token is not None:  # events went by uncounted: rate from here on
                self.counted_from = now if now is not None else self.last_chunk
                self.events_counted_from = self.events
        if self.behind:
            self._reassemble(PANEL_TAIL_BYTES)
        self.full = True

    def demote(self, now: float | None = None) -> None:
        """No panel shows the stream any more: back to counting it and keeping its tail."""
        self.drain(now)
        self.full = False
        if self.unfollow is not None:
            self.unfollow()

    def finish(self, now: float | None = None) -> Conversation:
        """The stream has ended: its conversation, from its last chunks if it fell behind."""
        self.drain(now)
        if self.behind:
            self._reassemble(END_TAIL_BYTES)
            if self.ended is not None:
                self._parse(self._decoder.close(), self.ended)
                self.assembler.close()
        return self.conversation

    def _reassemble(self, limit: int) -> None:
        """Assemble the last ``limit`` bytes kept. They may start inside an event: the decoder
        skips its rest as lines without a field it knows."""
        tail: list[bytes] = []
        size = 0
        for data in reversed(self.recent):
            if size + len(data) >= limit:
                tail.append(data[len(data) - (limit - size) :])
                break
            tail.append(data)
            size += len(data)
        self.assembler = StreamAssembler()
        self._decoder = SSEDecoder()
        self.behind = False
        for data in reversed(tail):
            self._parse(self._decoder.feed(data), None)

    def _parse(self, events: list[tuple[str | None, bytes]], at: float | None) -> None:
        assembler = self.assembler
        conversation = assembler.conversation
        before = conversation.deltas
        # Unassembled, a stream is read only to its first token (the rest is skipped).
        stop = not self.full and self.first_token is None and at is not None
        for _name, payload in events:
            if stop and conversation.deltas:
                break
            assembler.feed_data(payload)
        deltas = assembler.conversation.deltas
        if at is not None and before == 0 and deltas and self.first_token is None:
            self.first_token = at
            self.events_at_first_token = self.events

    def ttft(self) -> float | None:
        """Seconds from the request to the first content-bearing delta."""
        if self.first_token is None:
            return None
        return max(0.0, self.first_token - self.info.started)

    def tokens_per_second(self, now: float) -> float | None:
        """Output rate since the first token: the reported output tokens once the stream has
        ended with usage, else the events since the first token (about one token each)."""
        if self.first_token is None:
            return None
        end = self.ended or now
        span = end - self.first_token
        if span <= 0.05:
            return None
        usage = self.conversation.usage
        if usage and self.ended:
            return usage[2] / span
        if self.counted_from is not None:
            counted = end - self.counted_from
            if counted <= 0.05:
                return None
            return (self.events - self.events_counted_from) / counted
        return (self.events - self.events_at_first_token + 1) / span

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
    client_path: str = ""
    """The path the client called (no query: it may hold a key)."""
    upstream_path: str = ""
    """The path llmitm called upstream, when it was another."""
