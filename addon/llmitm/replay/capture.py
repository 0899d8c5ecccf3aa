"""Building the recorded record of one flow, the replay report and the text of a miss.

The recording addons (:mod:`llmitm.addons.record`) read plain values off a finished flow —
status, header lists, bodies, timestamps, the pieces a stream tap kept — and hand them here;
what comes back is a redacted :class:`~llmitm.replay.model.Interaction`. The report a replay
run writes at shutdown (:class:`ReplayReport`) and the lines a strict miss logs
(:func:`miss_text`) are made here too.

Sans-IO: no mitmproxy, no store, no clock (times come in as arguments).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from llmitm.replay.fingerprint import credential, fingerprint
from llmitm.replay.keys import KeyOptions, MatchKey, match_key
from llmitm.replay.memo import RequestMemo
from llmitm.replay.model import Chunk, Interaction, Message, Pieces, new_id
from llmitm.replay.pool import Miss
from llmitm.wire.redact import (
    may_hold_secret,
    redact_body,
    redact_chunks,
    redact_headers,
    redact_url,
)

Headers = Sequence[tuple[str, str]]


class RawHeaders(Sequence[tuple[str, str]]):
    """A message's header fields as text, read off its raw ``(name, value)`` bytes pairs when
    asked (latin-1, as HTTP/1 sends them). A flow's own header tuple is immutable — changing
    a header gives the flow a new one — so keeping a reference snapshots the head at no cost
    while the flow streams; decoding waits for the record's builder, off the event loop.
    (Decoded at once, each flow held some forty small strings per head until its end.)"""

    __slots__ = ("raw",)

    def __init__(self, raw: tuple[tuple[bytes, bytes], ...]) -> None:
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for name, value in self.raw:
            yield name.decode("latin-1"), value.decode("latin-1")

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, str]]: ...
    def __getitem__(self, index: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        if isinstance(index, slice):
            return list(RawHeaders(self.raw[index]))
        name, value = self.raw[index]
        return name.decode("latin-1"), value.decode("latin-1")


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """The client's request as it came, unredacted and unparsed: all recording keeps of it on
    the request path (references to the flow's own values, no copies). :func:`see_request`
    makes the redacted message and the match key of it — in record mode once the flow has
    ended, off the request path; in a replaying mode at once, as the lookup needs the key."""

    method: str
    path: str
    """The path with its query, as the match key reads it."""
    url: str
    host: str
    headers: Headers
    content: bytes


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """The client's request made fit to keep: redacted, keyed, its credential fingerprinted."""

    key: MatchKey
    message: Message
    clean: bool
    """Its body held nothing to redact."""
    credential: str | None


def see_request(
    request: ClientRequest,
    options: KeyOptions,
    fingerprint_key: bytes | None,
    memo: RequestMemo | None = None,
) -> SeenRequest:
    """Redact ``request``, compute its match key (from the redacted body, as replay does) and
    the fingerprint of the credential it sent (``fingerprint_key``: none without a store;
    ``memo``: the parts of earlier bodies, whose work a resent history reuses)."""
    raw = request.content
    seen = memo.see(raw, options) if memo is not None else None
    content = (redact_body(raw) or b"") if seen is None else seen.content
    key = match_key(
        request.method,
        request.path,
        request.headers,
        content,
        options,
        request.host,
        parsed=None if seen is None else seen.body,
        redacted=True,
        canonical=None if seen is None else seen.canonical,
        item_texts=None if seen is None else seen.item_texts,
    )
    message = Message(
        headers=redact_headers(request.headers),
        content=content,
        method=request.method,
        url=redact_url(request.url),
    )
    sent = credential(request.headers) if fingerprint_key is not None else None
    made = fingerprint(fingerprint_key, sent) if fingerprint_key is not None and sent else None
    # redact_body hands a clean body back itself
    return SeenRequest(key, message, content is raw, made)


class Captured(Protocol):
    """What the recorder learnt of a flow between its hooks (the addon's per-flow capture)."""

    scope: str
    key: MatchKey
    client_req: Message
    started_us: int
    credential: str | None
    request_clean: bool
    """The client's request body held nothing to redact (a translated answer echoes it)."""
    forwarded: bool
    upstream_req: Message | None
    """The request the router sent upstream: head already redacted, its body redacted here."""
    upstream_status: int
    upstream_headers: Headers
    upstream_body: bytes | None


@dataclass(frozen=True, slots=True)
class ClientResponse:
    """The response the client got, as the flow holds it at its end."""

    status: int
    headers: Headers
    content: bytes | None
    """The whole body of a non-streamed response (``None``: none, or it cannot be decoded)."""
    started: float | None
    """When the response's head arrived (seconds since the epoch)."""
    ended: float
    """When it was complete, or the flow's end when it never was."""


@dataclass(frozen=True, slots=True)
class FlowEnd:
    """What the flow tells at its end, besides the capture."""

    t0: float
    """When the client's request was complete (offsets and durations count from it)."""
    response: ClientResponse | None = None
    error: str | None = None
    """The flow's error message (a cut by either side)."""
    endpoint: str | None = None
    """The endpoint the router planned (``None``: not planned)."""
    plan: str = ""
    upstream_cut: str | None = None
    """Why the upstream's stream ended early, as the translator saw it."""
    relayed: Message | None = None
    """For a relayed flow, what the answering endpoint was sent (see :func:`relayed_request`)."""
    minted: dict[str, list[Any]] | None = None
    upstream_stream: Pieces | None = None
    """The upstream's pieces of a streamed flow, as the tap kept them."""
    client_stream: Pieces | None = None
    """The client's pieces, when they differ from the upstream's (a translated stream)."""


def relayed_request(
    method: str, url: str, headers: Sequence[tuple[str, str]], body: bytes
) -> Message:
    """The upstream leg of a relayed flow: the flow's own request names llmitm's relay, so
    the leg is what the answering endpoint was sent. The body is redacted with the others."""
    return Message(
        headers=redact_headers(list(headers)), content=body, method=method, url=redact_url(url)
    )


def build_interaction(
    capture: Captured,
    end: FlowEnd,
    *,
    session: str,
    mode: str,
    interaction_id: str | None = None,
    memo: RequestMemo | None = None,
) -> Interaction:
    """The finished flow as a redacted :class:`Interaction` (runs once, at the flow's end;
    ``interaction_id``: the id it was promised, else a new one; ``memo``: as for
    :func:`see_request`, for the upstream request — a translated history is resent too)."""
    key = capture.key
    interaction = Interaction(
        id=interaction_id or new_id(capture.started_us),
        scope=capture.scope,
        key=key.key,
        key_version=key.version,
        method=key.method,
        route=key.route,
        model=key.model,
        stream=key.stream,
        canonical_utf8=key.canonical_utf8,
        started_us=capture.started_us,
        session=session,
        mode=mode,
        credential=capture.credential,
    )
    interaction.legs["client_req"] = capture.client_req
    if end.minted is not None:
        interaction.minted = end.minted
    if end.endpoint is not None:
        interaction.endpoint = end.endpoint
        interaction.plan = end.plan
        if end.upstream_cut:
            interaction.truncated = f"upstream: {end.upstream_cut}"
    upstream_chunks, client_chunks = stream_legs(
        end.upstream_stream, end.client_stream, capture.request_clean
    )
    upstream_req = end.relayed or capture.upstream_req
    if capture.forwarded and upstream_req is not None:
        redacted = memo.redact(upstream_req.content) if memo is not None else None
        upstream_req.content = redact_body(upstream_req.content) if redacted is None else redacted
        interaction.legs["upstream_req"] = upstream_req
        if capture.upstream_status:
            upstream = Message(
                headers=redact_headers(capture.upstream_headers), status=capture.upstream_status
            )
            if upstream_chunks is not None:
                upstream.chunks = upstream_chunks
            else:
                upstream.content = redact_body(capture.upstream_body)
            interaction.legs["upstream_resp"] = upstream
    response = end.response
    if response is not None:
        client = Message(headers=redact_headers(response.headers), status=response.status)
        if client_chunks is not None:
            client.chunks = client_chunks
        else:
            client.content = redact_body(response.content)
        interaction.legs["client_resp"] = client
        interaction.status = response.status
        if response.started and end.t0:
            interaction.ttfb_us = max(0, round((response.started - end.t0) * 1e6))
        interaction.duration_us = max(0, round((response.ended - end.t0) * 1e6))
    if end.error is not None:
        interaction.error = end.error
        if interaction.truncated is None:
            side = "client" if "client" in end.error.lower() else "upstream"
            interaction.truncated = f"{side}: {end.error}"
    return interaction


def stream_legs(
    upstream_pieces: Pieces | None, client_pieces: Pieces | None, request_clean: bool
) -> tuple[Sequence[Chunk] | None, Sequence[Chunk] | None]:
    """The upstream and client pieces of a streamed flow, redacted (``None``: not streamed).

    Each redaction pass happens once: a client leg that is the upstream leg (a passthrough,
    ``client_pieces`` is ``None``) shares its pieces, and a client leg made only of clean
    inputs shares their verdict that there is nothing to redact. Times stay as they are:
    offsets are worked out when read."""
    if upstream_pieces is None:
        return None, None
    clean = not may_hold_secret(upstream_pieces.body)
    upstream: Sequence[Chunk] = upstream_pieces if clean else redact_chunks(upstream_pieces)
    if client_pieces is None:
        return upstream, upstream  # relayed as it came, or a guard handed each chunk on
    if clean and request_clean:
        # A translated answer is made of the upstream's bytes and fields of the client's own
        # request (echoed instructions, tools): neither held a credential, so neither does it.
        return upstream, client_pieces
    if clean and client_pieces.body == upstream_pieces.body:
        return upstream, client_pieces  # same bytes, other split points: nothing to redact
    return upstream, redact_chunks(client_pieces)


def miss_text(
    miss: Miss,
    *,
    mode: str,
    profile: str,
    loaded: int,
    unused: int,
    diff: list[str],
    advice: str = "",
) -> str:
    """What a strict miss logs: the request, its key, why it missed, the closest recording
    and how it differs (``diff``: :func:`~llmitm.replay.pool.canonical_diff`), and the fix."""
    key, closest = miss.key, miss.closest
    lines = [
        f"REPLAY MISS scope={miss.scope} mode={mode} profile={profile}",
        f"  request : {key.method} {key.route} model={key.model or '-'} "
        f"stream={str(key.stream).lower()}",
        f"  key     : {key.key} (match key version {key.version})",
        f"  reason  : {miss.describe()} ({loaded} loaded, {unused} unused)",
    ]
    if closest is not None:
        lines.append(f"  closest : {closest.id} {closest.source or ''}".rstrip())
        lines += [f"  diff    : {line}" for line in diff] or ["  diff    : (same text)"]
    lines.append(
        f"  fix     : {advice}"
        if advice  # a host with its own switches (the pytest plugin) words it itself
        else "  fix     : --set llmitm_record=replay-or-record to record it, or "
        "--set llmitm_match_ignore=PATH to ignore a field"
    )
    return "\n".join(lines)


def capture_label(interaction: Interaction) -> str:
    """One line naming a recording: method, route and model."""
    return f"{interaction.method} {interaction.route} model={interaction.model or '-'}"


@dataclass(slots=True)
class ReplayReport:
    """What a replay run did, written as JSON at shutdown (``llmitm_replay_report``)."""

    mode: str = "off"
    source: str = ""
    loaded: int = 0
    hits: int = 0
    misses: list[dict[str, Any]] = field(default_factory=list)
    drift: list[dict[str, Any]] = field(default_factory=list)
    strict_drift: bool = False
    """Drift was refused (``llmitm_strict_drift``): it fails a replayed command like a miss."""
    recorded: int = 0

    def add_miss(self, miss: Miss, diff: list[str]) -> None:
        key, closest = miss.key, miss.closest
        self.misses.append(
            {
                "scope": miss.scope,
                "key": key.key,
                "reason": miss.reason,
                "request": f"{key.method} {key.route}",
                "model": key.model,
                "closest": closest.id if closest else None,
                "diff": diff,
            }
        )

    def to_json(self, unused: list[Interaction]) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "source": self.source,
            "loaded": self.loaded,
            "hits": self.hits,
            "misses": self.misses,
            "unused": [
                {"id": i.id, "scope": i.scope, "key": i.key, "route": i.route, "model": i.model}
                for i in unused
            ],
            "drift": self.drift,
            "strict_drift": self.strict_drift,
            "recorded": self.recorded,
        }
